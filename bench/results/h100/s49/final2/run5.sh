#!/bin/bash
# Forty-ninth session: the operands' memory checked (FfnForward::check_memory) and the C API's review fixes;
# the whole GPU suite, the Python tests on the GPU, one 4-layer bench model (predicted: the checks, a few driver calls a call, change no figure);
# on an H200 also bench ffn's headline cases and the 38-layer prefill (predicted: 0.58-0.63x, 0.767-0.773x).
# Binaries: out/b9.tar.xz. On the device, with carry ["out"]: `bash bench/results/h200/s49/run5.sh`.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-400} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s49g; mkdir -p $O; cp "$0" $O/; cp $B/COMMIT $O/
nvidia-smi --query-gpu=name --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 200) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
timeout $(left 120) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head
timeout $(left 90) $B/twell bench model --layers 4 --iters 3 --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
if grep -q H200 $O/gpu.txt; then  # the acceptance board: its headline figures of this build too
  timeout $(left 60) $B/twell bench ffn --backend cuda -M 16384 -M 131072 -d 0.005 --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
  echo "rc $?" >> $O/ffn.txt; cat $O/ffn.txt
  timeout $(left 100) $B/twell bench model --no-decode --iters 5 --json $O/model38.json > $O/model38.txt 2> $O/model38_progress.log
  echo "rc $?" >> $O/model38.txt; cat $O/model38.txt
fi
cd $OUT && tar cJf final2.tar.xz s49g && rm -rf s49g
