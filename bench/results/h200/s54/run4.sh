#!/bin/bash
# Fifty-fourth session, after re-reading the change: max_cluster_blocks caps at 8 from its own record of
# allow_non_portable_clusters (no driver attribute query); the AtomicFile signal slot freed with one store:
#  1. the GPU suite (predicted 197/197);
#  2. memcheck of the decode attention and cluster tests (predicted 0 errors: no cluster query past 8 for a
#     kernel not allowed more);
#  3. the Python tests (predicted 58/58, 2 skipped);
#  4. `twell bench ffn -M 1 -M 16384` (predicted: all records correct).
# Binaries (out/b23.tar.xz): head/ (twell, twell_gpu_tests, libtwell_c.so of build-cuda, stripped, COMMIT).
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s54/run4.sh` (default 400).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-400} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b23.tar.xz -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s54_4; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz s54_4); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 170) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
timeout $(left 120) compute-sanitizer --tool memcheck $B/twell_gpu_tests \
  --gtest_filter='*DecodeAttention*:*MaxClusterBlocks*:*Cluster*' > $O/memcheck.log 2>&1
echo "rc $?" >> $O/memcheck.log; tail -4 $O/memcheck.log; save
timeout $(left 90) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head; save
timeout $(left 120) $B/twell bench ffn --backend cuda -M 1 -M 16384 --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E "^(1|16384) .*(0.50|1.00)% .* twell  |^rc" $O/ffn.txt; save
