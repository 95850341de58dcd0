#!/bin/bash
# Forty-ninth session's first check: the build at out/n2/COMMIT (the forty-eighth session's last, no kernel
# changed since the thirty-ninth's H200 runs) on the board the acceptance names, which no session since the
# forty-sixth has had: the whole GPU suite, the Python tests, the standard `twell bench ffn` cases and
# `twell bench model` (prefill and decode).
# Prediction: the FFN and prefill ratios of the H200 runs of sessions 31-39 (FFN 0.576-0.593x uniform,
# 0.605-0.625x skewed at M = 131072; prefill 0.767-0.773x, 182-190 tokens/ms), since only where buffers sit
# changed; the decode ratio 0.64-0.67x.
# Binaries: a build of the commit in out/n2/COMMIT, tarred as bench/results/h200/s47/run.sh says.
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s49/run.sh` (default 560).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s49; mkdir -p $O; cp "$0" $O/run.sh; cp $B/COMMIT $O/
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 150) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; cat $O/ffn.txt
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
timeout $(left 170) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
timeout $(left 90) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head
cd $OUT && tar cJf results.tar.xz s49 && rm -rf s49
