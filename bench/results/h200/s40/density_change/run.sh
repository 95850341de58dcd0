#!/bin/bash
# Session 40, call 3 (4a2a646 + the density-change test): the new test and its memcheck; the
# Python tests (generate_batch's stream) on the GPU; the whole GPU suite.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/density_change; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp out/run169.sh $O/run.sh
ts new test
$B/twell_gpu_tests --gtest_filter='*FollowsEachPrefillsDensity*:*DenseModelTakeTheDenseFfn*' 2>&1 | grep -E "OK|FAIL|Failure|Expected|Which|step|sequence" | head -30
ts memcheck
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='*FollowsEachPrefillsDensity*' > $O/sanitizer_memcheck.log 2>&1; echo "rc $?" >> $O/sanitizer_memcheck.log; grep -E "PASSED|FAILED|ERROR SUMMARY|rc " $O/sanitizer_memcheck.log
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts done
