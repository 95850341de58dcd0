#!/bin/bash
# Session 38, call 6 (2c037aa: results written by the sampler kernel into pinned memory, its workspace in
# LlamaCuda's plan, rates over the steps after the first token): the DeviceSampler tests, memcheck of them and
# racecheck of the small one; the sampler micro-benchmark; twell.Model's decode rates on the random 4-layer and
# 38-layer models of the 2B widths; twell run; the Python tests; the whole GPU suite and twell_tests.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/last; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf last.tar.xz last && rm -rf last); }
trap finish EXIT
cp out/run153.sh $O/run.sh
ts sampler tests
$B/twell_gpu_tests --gtest_filter='DeviceSampler*' > $O/device_sampler_tests.log 2>&1; echo "rc $?" >> $O/device_sampler_tests.log; tail -3 $O/device_sampler_tests.log; grep -B3 -A15 "Failure" $O/device_sampler_tests.log | head -40
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='DeviceSampler.OneSampler*:DeviceSampler.RowsItCannot*:DeviceSampler.ManyRows*' > $O/sanitizer_memcheck.log 2>&1; echo "rc $?" >> $O/sanitizer_memcheck.log; tail -2 $O/sanitizer_memcheck.log
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='DeviceSampler.RowsItCannot*' > $O/sanitizer_racecheck.log 2>&1; echo "rc $?" >> $O/sanitizer_racecheck.log; tail -2 $O/sanitizer_racecheck.log
ts micro
$B/twell_micro_sampler 49152 > $O/micro_sampler.txt 2>&1; echo "rc $?" >> $O/micro_sampler.txt; cat $O/micro_sampler.txt
for L in 4 38; do
  M=/tmp/m$L; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', $L)" 2>&1 | tail -3
  ts probe $L layers
  TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY bench/results/h200/s37/sampler3/probe.py $M > $O/python_decode_$L.json 2> $O/python_decode_$L.err; cat $O/python_decode_$L.json; tail -2 $O/python_decode_$L.err
done
rm -rf /tmp/m38
P=$($PY -c "print('ab' * 1023 + 'a')")
for s in "--temperature 0" "--temperature 0.8 --top-p 0.95 --seed 1"; do
  ts twell run $s
  timeout 120 $B/twell run /tmp/m4 --byte-tokenizer --device cuda -p "$P" -n 128 --no-stop $s > /dev/null 2>> $O/twell_run.err; tail -1 $O/twell_run.err
done
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts done
