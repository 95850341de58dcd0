#!/bin/bash
# Session 38, call 3 (GPU sampling, third kernel: batched loads, one pass a selection round (buckets keep their min and max),
# the ties' weight computed, failure stages reported; uncommitted on ed1ccc0): the DeviceSampler
# tests, memcheck and racecheck; the sampler micro-benchmark (host vs GPU, V = 49152 and 128256);
# twell.Model's decode rates (before: s38/sampling/python_decode.json); twell run; the Python tests.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
PY=/opt/torch/.venv/bin/python
O=$OUT/sampling3; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf sampling3.tar.xz sampling3 && rm -rf sampling3); }
trap finish EXIT
cp out/run150.sh $O/run.sh
ts sampler tests
$B/twell_gpu_tests --gtest_filter='DeviceSampler*' > $O/device_sampler_tests.log 2>&1; echo "rc $?" >> $O/device_sampler_tests.log; tail -4 $O/device_sampler_tests.log; grep -B3 -A15 "Failure" $O/device_sampler_tests.log | head -60
ts sanitizer
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='DeviceSampler.OneSampler*:DeviceSampler.RowsItCannot*' > $O/sanitizer_$tool.log 2>&1; echo "rc $?" >> $O/sanitizer_$tool.log; tail -3 $O/sanitizer_$tool.log
done
ts micro
for v in 49152 128256; do $B/twell_micro_sampler $v >> $O/micro_sampler.txt 2>&1; echo "rc $?" >> $O/micro_sampler.txt; done; cat $O/micro_sampler.txt
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
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head
ts done
