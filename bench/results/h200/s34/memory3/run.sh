#!/bin/bash
# Session 34, call 4: the tidy after reading the change (2028875: the QKV sizing a local of the plan), after the review fixes (DecodeFfn::bytes() as arena pieces, the free-memory
# check's double-counted cuBLASLt workspace, checked sums): the whole GPU suite and memcheck of the
# memory tests.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/memory3; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf memory3.tar.xz memory3 && rm -rf memory3); }
trap finish EXIT
cp out/run128.sh $O/run.sh
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts memcheck
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='LlamaCuda.MemoryNeeded*:LlamaCuda.OptionsBeyond*:LlamaCuda.WeightBytes*:FfnForwardGpuDecode.*' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; grep -E 'ERROR SUMMARY|PASSED|FAILED|rc ' $O/memcheck.log
ts done
