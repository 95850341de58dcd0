#!/bin/bash
# Sixty-eighth session, first call: HEAD a71d4bb (the sixty-seventh's Python and C API review fixes, never run on
# a GPU) = out/b68a.tar.xz.
# 1. The Python tests with PyTorch on the GPU, then the C API / tokenizer / generation GPU tests. Predicted: all pass.
# 2. A feasibility check for splitting an FFN's hot neurons off to a dense path (skewed activations: the 512-704
#    neurons that fire most hold ~45-50% of the non-zeros). Costed from the parts: the dense FFN at I = 512 / 640 /
#    704 (the hot part), and twell at I = 4928 (= 5632 - 704, 28 tiles of 176) at the cold part's density,
#    skewed and uniform. Predicted (docs/perf.md, sixty-eighth session): dense(704) ~1.6 ms, twell(4928, 0.28%)
#    ~5.7 ms, together ~7.3 ms against the skewed FFN's 8.04 at I = 5632.
# On the device, with carry ["out/b68a.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s68/first.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s68_first} TAR=out/b68a.tar.xz
source bench/results/device_preamble.sh
timeout $(left 200) $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; tail -4 $O/python_tests.log; grep -E "^(FAIL|ERROR):" $O/python_tests.log | head; save
timeout $(left 100) $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='CApiGpu*:*Tokenizer*:LlamaCuda.*Generat*' > $O/gpu_tests.log 2>&1
echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; save
for I in 512 640 704; do
  timeout $(left 60) $B/twell bench ffn -M 131072 -I $I -d 0.005 --distribution uniform --json $O/hot_dense_I$I.json \
    > $O/hot_dense_I$I.txt 2> $O/hot_dense_I${I}_progress.log
  echo "rc $?" >> $O/hot_dense_I$I.txt; grep -E "dense|twell|^rc" $O/hot_dense_I$I.txt | head -6; save
done
timeout $(left 120) $B/twell bench ffn -M 131072 -I 4928 -d 0.0028 --json $O/cold_I4928.json \
  > $O/cold_I4928.txt 2> $O/cold_I4928_progress.log
echo "rc $?" >> $O/cold_I4928.txt; grep -E "dense|twell|^rc" $O/cold_I4928.txt | head -8; save
