#!/bin/bash
# Session 33, call 5: FfnForward over a caller's workspace (the commit after c1b0fcd: one planned
# allocation carved into the buffers): the whole GPU suite, memcheck of the FFN edge tests with the
# new one, and the 131072-token FFN benchmark at 0.5% (no speed change expected).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/workspace; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf workspace.tar.xz workspace && rm -rf workspace); }
trap finish EXIT
cp out/run123.sh $O/run.sh
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts memcheck
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='FfnForwardGpuEdges.*:FfnForwardGpuDecode.*:FfnForwardGpuDeterminism.*' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; grep -E 'ERROR SUMMARY|PASSED|FAILED|rc ' $O/memcheck.log
ts bench
$B/twell bench ffn --backend cuda -M 131072 -d 0.005 --json $O/ffn.json > $O/ffn.txt 2>&1; grep -E "twell |dense_cublas" $O/ffn.txt
ts done
