#!/bin/bash
# Fifty-fourth session's last check, on the session's last build (after run2.sh's 1a84cda: train_sparse.py's
# atomic save and early --out check, save_dir's cleanup, the CLI's signal handlers, bench model --save's link check):
#  1. the GPU suite (predicted 197/197);
#  2. memcheck of the decode attention and cluster tests (predicted 0 errors);
#  3. the Python tests on this build's library, train_sparse.py's included (predicted 58/58, 2 skipped);
#  4. `twell bench ffn -M 1 -M 16384` (predicted: all records correct, 16384 within 0.64-0.67x).
# Binaries (out/b22.tar.xz): head/ (twell, twell_gpu_tests, libtwell_c.so of build-cuda, stripped, COMMIT).
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s54/run3.sh` (default 400).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-400} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b22.tar.xz -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s54_3; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz s54_3); }
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
