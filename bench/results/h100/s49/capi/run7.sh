#!/bin/bash
# Forty-ninth session's last check of the C API change (twell_cuda_ffn_workspace_bytes and
# twell_cuda_release_scratch check for a Hopper GPU first): the C API's GPU tests and the Python tests.
# Binaries: out/b9.tar.xz. On the device, with carry ["out"]: `bash bench/results/h200/s49/run7.sh`.
set -u
cd "$(dirname "$0")/../../../.."
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s49i; mkdir -p $O; cp "$0" $O/; cp $B/COMMIT $O/
nvidia-smi --query-gpu=name --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout 60 $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='CApiGpu.*' > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log
timeout 100 $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head
cd $OUT && tar cJf capi.tar.xz s49i && rm -rf s49i
