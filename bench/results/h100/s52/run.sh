#!/bin/bash
# Fifty-second session's check, on 86c8ef5's build (the fifty-first session's last commit, 6aeb115, whose GPU
# suite had not run, with this session's review fixes: decode attention's cluster capped at what the device
# runs, an unfilled spilled tile unpacked as zeros, a backward after a forward that overwrote x refusing dWg/dWu; two new GPU tests):
#  1. the GPU suite (predicted 197/197: 195 and the two new);
#  2. s51/run3.sh's question, can the one-token test fail: `*WeightsWrittenJustBeforeAreReadAsWritten*` on
#     this build (head/) and on a build of 6aeb115 (the same test) whose one-token kernels copy their weights
#     before waiting, as before the fifty-first session's fix (early_reads/). Predicted: head passes,
#     early_reads fails the calls made after the writer kernel (stale weights);
#  3. the Python tests on this build's library (predicted 57/57, 2 skipped);
#  4. `twell bench ffn` and `twell bench model`, the standard runs (kernels unchanged since the
#     thirty-ninth session; predicted within its spread: 0.576-0.625x at M = 131072 on an H200,
#     0.59-0.62x on an H100; prefill 0.765-0.773x, decode batch 1 unchanged by the cluster cap, 16 here).
# Binaries (out/b12.tar.xz): head/ as h200/s47/run.sh says (twell, twell_gpu_tests, libtwell_c.so,
# stripped, COMMIT: 86c8ef5); early_reads/twell_gpu_tests from a worktree of 6aeb115 with third_party/ copied and
#   sed -i 's/  if (!a.early_weight_reads) wait_for_previous_grid();/  if (false) wait_for_previous_grid();/' \
#     src/cuda/kernels/ffn_gather.cu src/cuda/kernels/decode_gemv.cu
# then `cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build tests/twell_gpu_tests`.
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s52/run.sh` (default 560);
# CHECKS_ONLY=1 stops before the benchmarks.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b12.tar.xz -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s52; mkdir -p $O; cp "$0" $O/run.sh; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz s52); }  # after each step: a run cut short keeps what it did
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
if [ -n "${CHECKS_ONLY:-}" ]; then rm -rf $O; exit 0; fi  # little device time: the checks alone
timeout $(left 150) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; cat $O/ffn.txt; save
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt; save
rm -rf $O
