#!/bin/bash
# Session 38, call 5 (the GPU sampler on a cluster of 8 blocks a row, 512 threads each; uncommitted on 44fae51):
# the DeviceSampler tests, memcheck and racecheck; the sampler micro-benchmark (V = 49152 and 128256);
# twell.Model's decode rates on the random 4-layer model (the s37 probe); twell run; the Python tests; the whole
# GPU suite.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/cluster; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf cluster.tar.xz cluster && rm -rf cluster); }
trap finish EXIT
cp out/run152.sh $O/run.sh
ts sampler tests
$B/twell_gpu_tests --gtest_filter='DeviceSampler*' > $O/device_sampler_tests.log 2>&1; echo "rc $?" >> $O/device_sampler_tests.log; tail -3 $O/device_sampler_tests.log; grep -B3 -A15 "Failure" $O/device_sampler_tests.log | head -40
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='DeviceSampler.OneSampler*:DeviceSampler.RowsItCannot*' > $O/sanitizer_$tool.log 2>&1; echo "rc $?" >> $O/sanitizer_$tool.log; tail -2 $O/sanitizer_$tool.log
done
ts micro
for v in 49152 128256; do $B/twell_micro_sampler $v >> $O/micro_sampler.txt 2>&1; echo "rc $?" >> $O/micro_sampler.txt; done; cat $O/micro_sampler.txt
ts probe
for L in 4; do
  M=/tmp/m$L; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', $L)" 2>&1 | tail -3
  ts probe $L layers
  TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY bench/results/h200/s37/sampler3/probe.py $M > $O/python_decode_$L.json 2> $O/python_decode_$L.err; cat $O/python_decode_$L.json; tail -2 $O/python_decode_$L.err
done
P=$($PY -c "print('ab' * 1023 + 'a')")
for s in "--temperature 0" "--temperature 0.8 --top-p 0.95 --seed 1"; do
  ts twell run $s
  timeout 120 $B/twell run /tmp/m4 --byte-tokenizer --device cuda -p "$P" -n 128 --no-stop $s > /dev/null 2>> $O/twell_run.err; tail -1 $O/twell_run.err
done
rm -rf /tmp/m38
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts done
