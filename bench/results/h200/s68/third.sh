#!/bin/bash
# Sixty-eighth session, third call (not run: no device was left): the session's HEAD, packed with
# `bench/results/pack.sh --build build-cuda out/b68e.tar.xz`. default_ffn_tile gives 176 at any FFN width outside
# training (second.sh: twell at I = 4992 5.63 against 6.55 ms at 256, at I = 8192 9.40 against 10.19), choose_hot_neurons
# moves 704-neuron steps at any width, LtGemm tunes beta = 1 problems apart, and SplitFfn has its review fixes.
# 1. The whole GPU suite (model tests with small I now on 176 tiles with a partial last one; two new FfnForwardGpu
#    cases with I below one tile; the split's new tests). Predicted: all pass.
# 2. bench ffn at I = 8192, 0.5%, with --split (the default tile now 176). Predicted: twell ~0.48-0.5x uniform
#    (second.sh's 0.25% at 176: 0.480x), twell_split below twell on skewed.
# On the device, with carry ["out/b68e.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s68/third.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s68_third} TAR=${TAR:-out/b68e.tar.xz}
source bench/results/device_preamble.sh
timeout $(left 230) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1
echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -E "^\[  FAILED" $O/gpu_tests.log | head; save
timeout $(left 90) $B/twell bench ffn -M 131072 -I 8192 -d 0.005 --split --json $O/i8192.json > $O/i8192.txt \
  2> $O/i8192_progress.log
echo "rc $?" >> $O/i8192.txt; grep -E "twell|dense_cublas|^rc" $O/i8192.txt; save
