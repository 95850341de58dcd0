#!/bin/bash
# Fifty-eighth session, the key splits of the prefill attention (AttentionArgs::key_splits). On the device:
#  1. PrefillAttention.* (four new cases of few rows over many keys; every case also with key_splits 2, 3 and
#     8 against float64: predicted errors as the unsplit kernel's), PrefillAttentionSplits.*, LlamaCuda.* and
#     LlamaCudaShapes.* with cuDNN required (predicted all pass);
#  2. memcheck of PrefillAttention.* (the merge reads other blocks' shared memory: predicted 0 errors);
#  3. reuse.py (as run.sh): the second turn's first token, predicted 1.78 -> 1.2-1.4 ms with the cache
#     (its attention ~5x faster: 160 blocks instead of 32), 6.85 ms without (unchanged: 4036 rows fill the GPU);
#  4. the Python tests (predicted all pass).
# Binaries ($TAR): head/ (twell, twell_gpu_tests, libtwell_c.so of build-cuda, stripped, COMMIT).
# With carry ["out"]: `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s58/splits.sh`.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-400} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
NAME=${NAME:-s58_splits}
tar xJf ${TAR:-out/b44.tar.xz} -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so TWELL_REQUIRE_CUDNN=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/$NAME; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz $NAME); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 120) $B/twell_gpu_tests --gtest_filter='*PrefillAttention*:*LlamaCuda*:*DecodeAttention*:*CudnnSdpa*' \
  > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
grep -E "key_splits|twell kernel" $O/gpu_tests.log | head -40; tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
timeout $(left 120) compute-sanitizer --tool memcheck $B/twell_gpu_tests --gtest_filter='*PrefillAttention.*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -4 $O/memcheck.log; save
M=/tmp/twell_reuse_model
timeout $(left 150) $PY bench/results/h200/s58/reuse.py $M tests/model/data/bpe_gpt2.json > $O/reuse.log 2>&1
echo "rc $?" >> $O/reuse.log; cat $O/reuse.log; save; rm -rf $M
timeout $(left 100) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head; save
