#!/bin/bash
# Forty-ninth session's check of its changes: the whole GPU suite (BenchModel.APhaseThatCannotFitIsRefusedFirst
# new), the Python tests on the GPU (precision "auto", replace_hf_mlps of a shared MLP, the Model's argument
# checks), and `twell bench model` asked for a decode batch the GPU cannot hold: refused before the weights
# are made (predicted: within seconds, naming "decode at batch 256"), where s49/decode64.sh ran two batches
# first and lost them.
# Binaries: out/b9.tar.xz as in s49/run.sh. On the device, with carry ["out"]: `bash bench/results/h200/s49/run2.sh`.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-400} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s49c; mkdir -p $O; cp "$0" $O/; cp $B/COMMIT $O/
nvidia-smi --query-gpu=name,memory.total --format=csv > $O/gpu.txt; cat $O/gpu.txt
S=$(date +%s%N)
timeout 120 $B/twell bench model --no-prefill --decode-batch 1,64,512 > $O/refusal.txt 2>&1; echo "rc $? after $(( ($(date +%s%N) - S) / 1000000 )) ms" >> $O/refusal.txt
cat $O/refusal.txt
timeout $(left 200) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
timeout $(left 120) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head
cd $OUT && tar cJf check.tar.xz s49c && rm -rf s49c
