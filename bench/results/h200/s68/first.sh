#!/bin/bash
# Sixty-eighth session, first call: out/b68b.tar.xz (SplitFfn, not yet run on a GPU; with the sixty-seventh's Python
# and C API review fixes, not run on one either).
# 1. The split's GPU tests, then the Python tests with PyTorch, then the C API / tokenizer / generation GPU tests.
#    Predicted: all pass.
# 2. twell bench ffn --split at the targets' shapes, 0.5%, uniform and skewed. Predicted (docs/perf.md, sixty-eighth
#    session, from the parts' costs): skewed twell_split ~7.2-7.4 ms against twell's ~8.0 at M = 131072 (~0.55-0.56x);
#    uniform: no neuron qualifies at 0.5% (every rate ~0.5%), twell_split = twell.
# On the device, with carry ["out/b68b.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s68/first.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s68_first} TAR=out/b68b.tar.xz
source bench/results/device_preamble.sh
timeout $(left 120) $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='*Split*:ChooseHot*' > $O/split_tests.log 2>&1
echo "rc $?" >> $O/split_tests.log; tail -3 $O/split_tests.log; grep -E "^\[  FAILED" $O/split_tests.log | head; save
timeout $(left 200) $B/twell bench ffn -M 131072,16384 -d 0.005 --split --json $O/split.json > $O/split.txt 2> $O/split_progress.log
echo "rc $?" >> $O/split.txt; cat $O/split.txt | tail -30; save
timeout $(left 150) $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; tail -4 $O/python_tests.log; grep -E "^(FAIL|ERROR):" $O/python_tests.log | head; save
timeout $(left 100) $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='CApiGpu*:*Tokenizer*:LlamaCuda.*Generat*' > $O/gpu_tests.log 2>&1
echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; save
