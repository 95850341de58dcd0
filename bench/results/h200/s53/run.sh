#!/bin/bash
# Fifty-third session's check, on 3e8e760's build (the fifty-second session's last commit; its GPU suite had run
# on 86c8ef5, before the rewritten one-token test and the host tidy of ffn_forward.cpp):
#  1. the GPU suite (predicted 197/197);
#  2. can the one-token test fail (s52/run2.sh's question, never run): `*WeightsWrittenJustBeforeAreReadAsWritten*`
#     on this build (head/) and on a build of 816e470 (the same test code) whose one-token kernels copy their
#     weights before waiting (early_reads/, from s52/run2.sh's out/b13.tar.xz). The test's writer now writes all
#     three weights in one kernel, Wg last, after ~100 us. Predicted: head passes; early_reads fails its calls
#     with early = false (Wg stale for the whole of the early copies);
#  3. memcheck of the fifty-second session's new GPU tests (predicted 0 errors);
#  4. the Python tests on this build's library (predicted 57/57, 2 skipped);
#  5. `twell bench ffn` and `twell bench model`, the standard runs (kernels unchanged since the thirty-ninth
#     session; predicted within its spread: 0.576-0.625x at M = 131072 on an H200, 0.59-0.62x on an H100;
#     prefill 0.765-0.773x).
# Binaries (out/b14.tar.xz): head/ (twell, twell_gpu_tests, libtwell_c.so of build-cuda, stripped, COMMIT) and
# early_reads/ as s52/run2.sh says.
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s53/run.sh` (default 560);
# CHECKS_ONLY=1 stops before the benchmarks.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b14.tar.xz -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s53; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz s53); }  # after each step: a run cut short keeps what it did
trap 'save; rm -rf $O' EXIT  # one file comes back (the device returns at most eight)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 170) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
for b in head early_reads head early_reads; do
  timeout $(left 60) out/$b/twell_gpu_tests --gtest_filter='*WeightsWrittenJustBeforeAreReadAsWritten*' \
    >> $O/one_token_$b.log 2>&1
  echo "rc $?" >> $O/one_token_$b.log
done
grep -c "Failure" $O/one_token_*.log; grep -E "^rc |PASSED|FAILED  \]" $O/one_token_*.log; save
timeout $(left 90) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head; save
timeout $(left 120) compute-sanitizer --tool memcheck $B/twell_gpu_tests \
  --gtest_filter='*WeightsWrittenJustBeforeAreReadAsWritten*:*MaxClusterBlocks*:*NoBackupUnpacksAsZeros*:*NeedsASparseForward*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -4 $O/memcheck.log; save
if [ -n "${CHECKS_ONLY:-}" ]; then exit 0; fi  # little device time: the checks alone
timeout $(left 150) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; cat $O/ffn.txt; save
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt; save
