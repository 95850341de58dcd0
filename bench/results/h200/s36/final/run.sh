#!/bin/bash
# Session 36, call 6: the final build of the session (7d3593f: the second review's fixes to the C
# interface, the Python package and the CLI's fallback): the whole GPU suite, memcheck of the C
# interface's GPU tests, the whole twell_tests on the GPU machine, the Python tests under PyTorch.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/final; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf final.tar.xz final && rm -rf final); }
trap finish EXIT
cp out/run137.sh $O/run.sh
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 /opt/torch/.venv/bin/python -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log; grep -B2 -A25 "^ERROR:\|^FAIL:" $O/python_tests.log | head -60
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts memcheck
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='CApiGpu.*' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; grep -E 'ERROR SUMMARY|PASSED|FAILED|rc ' $O/memcheck.log
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
$B/twell_tests --gtest_filter='CliModel.AModelTooLarge*' > $O/cli_too_large.log 2>&1; grep -E "OK|FAILED|Skipped" $O/cli_too_large.log
ts done
