#!/bin/bash
# Session 36, call 2: the review's fixes to the C interface and the Python package (46d22c9): the
# Python tests under PyTorch (streams, threads, copies, autograd's corners), the C interface's GPU
# tests and their memcheck, and python/examples/train_l1.py at three L1 strengths and on the CPU.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
O=$OUT/capi2; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf capi2.tar.xz capi2 && rm -rf capi2); }
trap finish EXIT
cp out/run133.sh $O/run.sh
PY=/opt/torch/.venv/bin/python
export TWELL_LIBRARY=$B/libtwell_c.so
ts python tests
timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; tail -30 $O/python_tests.log
ts C interface GPU tests
$B/twell_gpu_tests --gtest_brief=1 --gtest_filter='CApiGpu.*:FfnForwardGpuEdges.*' > $O/gpu_tests_capi.log 2>&1; echo "rc $?" >> $O/gpu_tests_capi.log; tail -3 $O/gpu_tests_capi.log; grep -B3 -A12 "Failure" $O/gpu_tests_capi.log | head -30
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='CApiGpu.*' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; grep -E 'ERROR SUMMARY|PASSED|FAILED|rc ' $O/memcheck.log
for l1 in 1e-3 3e-3 1e-2; do
  ts train_l1 $l1
  timeout 60 $PY python/examples/train_l1.py --l1 $l1 --json $O/train_l1_$l1.json > $O/train_l1_$l1.txt 2>&1; echo "rc $?" >> $O/train_l1_$l1.txt; cat $O/train_l1_$l1.txt
done
ts train_l1 cpu
timeout 60 $PY python/examples/train_l1.py --device cpu --steps 40 --log-every 10 > $O/train_l1_cpu.txt 2>&1; echo "rc $?" >> $O/train_l1_cpu.txt; cat $O/train_l1_cpu.txt
ts done
