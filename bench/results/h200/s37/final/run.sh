#!/bin/bash
# Session 37, call 6, the session's last build (5f6bca2: LlamaCuda's prefill/decode_step without a second copy,
# the reviews' fixes): the whole GPU suite, the whole twell_tests and the Python tests on the GPU machine,
# and twell.Model's decode rates (bench/results/h200/s37/sampler3/probe.py) on a random 4-layer model of
# the 2B widths.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/final; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf final.tar.xz final && rm -rf final); }
trap finish EXIT
cp out/run147.sh $O/run.sh
ts probe
M=/tmp/m4; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 4)" 2>&1 | tail -3
TWELL_LIBRARY=$B/libtwell_c.so timeout 200 $PY bench/results/h200/s37/sampler3/probe.py $M > $O/python_decode.json 2> $O/python_decode.err; cat $O/python_decode.json; tail -2 $O/python_decode.err
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head; grep -B2 -A25 "^ERROR:\|^FAIL:" $O/python_tests.log | head -60
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts done
