#!/bin/bash
# Session 35, call 2: the review fixes of the shared cuBLASLt workspace (9664ae8): contract, overlap check,
# tests that fail if an object allocates its own: the whole GPU suite, memcheck of the new tests, the whole
# twell_tests on the GPU machine and one prefill.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/shared_ws2; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf shared_ws2.tar.xz shared_ws2 && rm -rf shared_ws2); }
trap finish EXIT
cp out/run130.sh $O/run.sh
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > $O/gpu.txt 2>&1
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts memcheck
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='FfnForwardGpuEdges.SharesTheCallersCublasLtWorkspace:LtGemm.TheCallersWorkspace*:FfnForwardGpuEdges.RunsInTheCallersWorkspace:LlamaCuda.MemoryNeeded*:LlamaCuda.BadCalls*' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; grep -E 'ERROR SUMMARY|PASSED|FAILED|rc ' $O/memcheck.log
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts skip-bench
: # the FFN benchmark ran in call 1 (s35/shared_ws), no kernel changed since
ts prefill
$B/twell bench model --no-decode --iters 6 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_prefill|rel err|mem" $O/model.txt
ts done
