#!/bin/bash
# Session 37, call 1: twell.Model (the C interface's models, twell::runtime's loader): the Python tests
# under PyTorch (the GPU model against the CPU backend), model_speed.py (twell.Model against
# transformers on a random 4-layer model of the 2B widths) and `twell run` on the same model, then the
# whole GPU suite and twell_tests on the GPU machine (the CLI through the moved loader).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/model_api; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf model_api.tar.xz model_api && rm -rf model_api); }
trap finish EXIT
cp out/run142.sh $O/run.sh
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc |GPU|gpu" $O/python_tests.log | head -20; grep -B2 -A25 "^ERROR:\|^FAIL:" $O/python_tests.log | head -60
$PY -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -1
ts model_speed
M=/tmp/m4; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 4)" 2>&1 | tail -3
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY python/examples/model_speed.py --model $M --json $O/model_speed.json > $O/model_speed.txt 2>&1; echo "rc $?" >> $O/model_speed.txt; tail -12 $O/model_speed.txt
ts twell run
P=$($PY -c "print('ab' * 1023 + 'a')")
timeout 120 $B/twell run $M --byte-tokenizer --device cuda -p "$P" -n 128 --no-stop > $O/twell_run.txt 2> $O/twell_run.err; echo "rc $?" >> $O/twell_run.err; tail -3 $O/twell_run.err
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts done
