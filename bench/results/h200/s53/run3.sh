#!/bin/bash
# Fifty-third session, third check, on 97342b2's build (the training path's review fixes: the C API's tensors of no
# elements with data NULL are given and checked, l1_coeff within float's range, Python copies CUDA tensors that are
# not 16-byte aligned; TextStream's early U+FFFD; save_dir's directory fsync). Predicted: the GPU suite 197/197;
# the Python tests 58/58 (2 skipped: one GPU), test_gpu_takes_views_not_16_byte_aligned among them (its
# misaligned x, weights and dy give the aligned run's bits).
# The fourth check (9b69deb's build: Python's _aligned passes on torch.vmap's batched CUDA tensors, which have
# no address; the CLI's checks) ran this script too, as `TARBALL=b17 RESULTS=s53_4`; predicted the same, with the
# alignment test's new torch.vmap step passing.
# Binaries (out/$TARBALL.tar.xz, b16 by default): head/ (twell, twell_gpu_tests, libtwell_c.so of build-cuda,
# stripped, COMMIT).
# On the device, with carry ["out"]: `bash bench/results/h200/s53/run3.sh`.
set -u
cd "$(dirname "$0")/../../../.."
T=${TARBALL:-b16} R=${RESULTS:-s53_3}
tar xJf out/$T.tar.xz -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/$R; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz $R); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
timeout 120 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED|aligned" $O/python_tests.log | head; save
timeout 200 $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
