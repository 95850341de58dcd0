#!/bin/bash
# Session 37, call 5 (--gpu-memory, 2de013c): the whole twell_tests on the GPU machine (the CLI's cap:
# CPU under auto, refused under cuda), the Python tests under PyTorch (gpu_memory=), the C interface's
# GPU tests under memcheck.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/gpu_memory; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf gpu_memory.tar.xz gpu_memory && rm -rf gpu_memory); }
trap finish EXIT
cp out/run146.sh $O/run.sh
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc |gpu_memory|cap" $O/python_tests.log | head; grep -B2 -A25 "^ERROR:\|^FAIL:" $O/python_tests.log | head -60
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
$B/twell_tests --gtest_filter='CliModel.AGpuMemory*:CliModel.DeviceSelection' > $O/cli_gpu_memory.log 2>&1; grep -E "OK|FAILED" $O/cli_gpu_memory.log
ts memcheck
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='CApiGpu.*' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; grep -E 'ERROR SUMMARY|PASSED|FAILED|rc ' $O/memcheck.log
ts done
