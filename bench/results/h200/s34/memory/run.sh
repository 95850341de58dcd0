#!/bin/bash
# Session 34, call 2: memory_needed / the constructor's free-memory check / out-of-memory messages,
# the default TensorView [0], inspect's GPU memory line: the whole GPU suite, memcheck of the new
# tests, the whole twell_tests on the GPU machine, the CLI on a fixture, and one prefill.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/memory; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf memory.tar.xz memory && rm -rf memory); }
trap finish EXIT
cp out/run126.sh $O/run.sh
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts memcheck
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='LlamaCuda.MemoryNeeded*:LlamaCuda.OptionsBeyond*:LlamaCuda.WeightBytes*:CudaRuntime.*:LlamaCuda.BadCalls*' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; grep -E 'ERROR SUMMARY|PASSED|FAILED|rc ' $O/memcheck.log
ts cli
for d in tests/model/data/llama/gpu_relu_tied tests/model/data/llama/gpu_silu_untied; do
  $B/twell inspect $d > $O/inspect_$(basename $d).txt 2>&1; grep -E "GPU" $O/inspect_$(basename $d).txt
done
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts prefill
$B/twell bench model --no-decode --iters 6 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_prefill|rel err|mem" $O/model.txt
ts done
