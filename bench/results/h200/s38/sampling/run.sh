#!/bin/bash
# Session 38, call 1 (GPU sampling, uncommitted tree on 38-1): the DeviceSampler tests, under memcheck and
# racecheck too; twell.Model's decode rates (greedy and sampled) on the random 4-layer model of the 2B widths
# (the s37 probe: before, s37/final/python_decode.json); the whole GPU suite, twell_tests and the Python tests.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/sampling; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf sampling.tar.xz sampling && rm -rf sampling); }
trap finish EXIT
cp out/run148.sh $O/run.sh
ts sampler tests
$B/twell_gpu_tests --gtest_filter='DeviceSampler*' > $O/device_sampler_tests.log 2>&1; echo "rc $?" >> $O/device_sampler_tests.log; tail -4 $O/device_sampler_tests.log; grep -B3 -A15 "Failure" $O/device_sampler_tests.log | head -60
ts sanitizer
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='DeviceSampler.OneSampler*:DeviceSampler.RowsItCannot*' > $O/sanitizer_$tool.log 2>&1; echo "rc $?" >> $O/sanitizer_$tool.log; tail -3 $O/sanitizer_$tool.log
done
ts probe
M=/tmp/m4; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 4)" 2>&1 | tail -3
TWELL_LIBRARY=$B/libtwell_c.so timeout 200 $PY bench/results/h200/s37/sampler3/probe.py $M > $O/python_decode.json 2> $O/python_decode.err; cat $O/python_decode.json; tail -2 $O/python_decode.err
P=$($PY -c "print('ab' * 1023 + 'a')")
for s in "--temperature 0" "--temperature 0.8 --top-p 0.95 --seed 1"; do
  ts twell run $s
  timeout 120 $B/twell run $M --byte-tokenizer --device cuda -p "$P" -n 128 --no-stop $s > /dev/null 2>> $O/twell_run.err; tail -1 $O/twell_run.err
done
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head; grep -B2 -A25 "^ERROR:\|^FAIL:" $O/python_tests.log | head -60
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts done
