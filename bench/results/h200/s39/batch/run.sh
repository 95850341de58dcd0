#!/bin/bash
# Session 39, call 2 (f66195a: batched generation end to end, the review's fixes): LlamaCuda and
# attention tests; memcheck of the ragged ones; batched generation rates through twell.Model on
# random 4- and 38-layer models of the 2B widths; twell run with three prompts; the Python tests; the
# whole GPU suite and twell_tests on the GPU.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/batch; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp out/run158.sh $O/run.sh
ts targeted tests
$B/twell_gpu_tests --gtest_filter='*Attention*:*QkvRope*:*LlamaCuda*:*DeviceSampler*' > $O/targeted_tests.log 2>&1; echo "rc $?" >> $O/targeted_tests.log; tail -3 $O/targeted_tests.log; grep -B3 -A15 "Failure" $O/targeted_tests.log | head -60
ts memcheck
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='*RaggedBatchEqualsSingleSequences/hd16_gqa_relu:*RaggedBatchesOfLong*:*stagger*' > $O/sanitizer_memcheck.log 2>&1; echo "rc $?" >> $O/sanitizer_memcheck.log; grep -E "PASSED|FAILED|ERROR SUMMARY|rc " $O/sanitizer_memcheck.log
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head
for L in 4 38; do
  M=/tmp/m$L; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', $L)" 2>&1 | tail -3
  ts probe $L layers
  TWELL_LIBRARY=$B/libtwell_c.so timeout 240 $PY bench/results/h200/s39/batch/probe.py $M > $O/batch_$L.json 2> $O/batch_$L.err; tail -8 $O/batch_$L.err
done
rm -rf /tmp/m38
ts twell run
timeout 120 $B/twell run /tmp/m4 --byte-tokenizer -p "The sky is" -p "Water boils at a temperature of" -p "x" -n 32 --temperature 0.8 --seed 1 > $O/twell_run_batch.out 2> $O/twell_run_batch.err; echo "rc $?" >> $O/twell_run_batch.err; tail -3 $O/twell_run_batch.err
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts done
