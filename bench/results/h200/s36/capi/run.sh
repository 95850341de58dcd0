#!/bin/bash
# Session 36, call 1: the C interface and the Python package (libtwell_c.so, python/twell) on the GPU,
# and the build with position-independent static libraries checked for speed: the whole GPU suite,
# memcheck of the C interface's GPU tests, the whole twell_tests on the GPU machine (the new CLI test
# of a model too large for the GPU), the Python tests under PyTorch, python/examples/ffn_speed.py,
# the quick FFN benchmark and one prefill.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/capi; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf capi.tar.xz capi && rm -rf capi); }
trap finish EXIT
cp out/run132.sh $O/run.sh
PY=/opt/torch/.venv/bin/python
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; tail -25 $O/python_tests.log
ts ffn_speed
TWELL_LIBRARY=$B/libtwell_c.so timeout 240 $PY python/examples/ffn_speed.py --json $O/python_ffn.json > $O/python_ffn.txt 2>&1; echo "rc $?" >> $O/python_ffn.txt; head -5 $O/python_ffn.txt; tail -2 $O/python_ffn.txt
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts memcheck
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='CApiGpu.*' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; grep -E 'ERROR SUMMARY|PASSED|FAILED|rc ' $O/memcheck.log
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts bench
timeout 200 scripts/gpu-check.sh $O/bench --bin $B --quick --only bench > $O/bench.log 2>&1; echo "rc $?" >> $O/bench.log; tail -22 $O/bench.log
ts prefill
$B/twell bench model --no-decode --iters 6 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_prefill|rel err|mem" $O/model.txt
ts done
