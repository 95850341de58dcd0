#!/bin/bash
# Fiftieth session's check, written without a GPU (none was lent) for the next session to run: the
# session's changes on the board, with the predictions of docs/perf.md's fiftieth-session section.
# - `twell bench ffn` (standard cases): every output element must now be finite and the first spilled
#   rows are checked against float64; predicted: every case "yes", ratios as before (0.576-0.625x at
#   M = 131072, 0.62-0.65x at 16384).
# - `twell bench ffn --train -M 16384 -M 131072`: --timing host now from an idle GPU; predicted: training
#   ratios at most ~1% above 0.488-0.507x.
# - `twell bench model`: checked before timing, one more untimed decode step; predicted: prefill
#   0.767-0.773x, 182-190 tokens/ms, decode batch 1 0.64-0.67x.
# - the GPU suite and the Python tests (a model without a KV cache refusing a 2-token generation up
#   front, in ModelOnTheGpu).
# Binaries: a build of the commit in out/n2/COMMIT, tarred as bench/results/h200/s47/run.sh says.
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s50/run.sh` (default 560).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s50; mkdir -p $O; cp "$0" $O/run.sh; cp $B/COMMIT $O/
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 150) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; cat $O/ffn.txt
timeout $(left 80) $B/twell bench ffn --backend cuda --train -M 16384 -M 131072 -d 0.005 --json $O/train.json \
  > $O/train.txt 2> $O/train_progress.log
echo "rc $?" >> $O/train.txt; cat $O/train.txt
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
timeout $(left 170) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
timeout $(left 90) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head
cd $OUT && tar cJf results.tar.xz s50 && rm -rf s50
