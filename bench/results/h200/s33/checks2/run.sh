#!/bin/bash
# Session 33, call 2: the review's fixes (cddd74c and the test after it: graphs captured on the
# model's own stream, every kind of caller stream, the held-stream test): the example, the whole GPU
# suite, memcheck of the new model tests, racecheck of two small model tests (LlamaCuda was never
# under racecheck), one prefill, and the whole twell_tests on the GPU machine.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/checks2; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf checks2.tar.xz checks2 && rm -rf checks2); }
trap finish EXIT
cp out/run120.sh $O/run.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv > $O/gpu.txt 2>&1
ts example
$B/ffn_forward > $O/example.log 2>&1; echo "rc $?" >> $O/example.log; cat $O/example.log
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -30
ts memcheck
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='LlamaCuda.RunsOnTheCallersStream:LlamaCuda.WaitsForTheCallersEarlierWork' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; grep -E 'ERROR SUMMARY|PASSED|FAILED|rc ' $O/memcheck.log
ts racecheck
TWELL_LT_AUTOTUNE=0 timeout 300 compute-sanitizer --tool racecheck $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='LlamaCuda.GraphReplayIsBitIdenticalToEager:Shapes/LlamaCudaShapes.PrefillDecodeMatchesFullForward/hd16_gqa_relu' > $O/racecheck.log 2>&1; echo "rc $?" >> $O/racecheck.log
grep -E 'RACECHECK SUMMARY|PASSED|FAILED|rc ' $O/racecheck.log; echo "hazards outside cuBLAS and cuDNN: $(grep -E 'Race reported' $O/racecheck.log | grep -vEc 'nvjet_|cudnn_generated_')"
grep -E 'Race reported' $O/racecheck.log | sort | uniq -c | sort -rn | head -5
ts prefill
$B/twell bench model --no-decode --iters 6 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_prefill|rel err" $O/model.txt
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts done
