#!/bin/bash
# Fifty-third session, fourth check, on 9b69deb's build (the reviews' last fixes: Python's _aligned passes on
# torch.vmap's batched CUDA tensors, which have no address; the CLI's checks). Predicted: Python 58/58 (2 skipped),
# test_gpu_takes_views_not_16_byte_aligned with its new torch.vmap step passing; the GPU suite 197/197.
# Binaries (out/b17.tar.xz): head/ (twell, twell_gpu_tests, libtwell_c.so of build-cuda, stripped, COMMIT).
# On the device, with carry ["out"]: `bash bench/results/h200/s53/run4.sh`.
set -u
cd "$(dirname "$0")/../../../.."
tar xJf out/b17.tar.xz -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s53_4; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz s53_4); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
timeout 120 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED|aligned" $O/python_tests.log | head; save
timeout 200 $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
