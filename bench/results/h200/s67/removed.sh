#!/bin/bash
# Sixty-seventh session, third call: HEAD 0f8b7c7 (the decode L2 prefetch removed: its option, kernel, side
# stream and test) = out/b67r.tar.xz. The model and decode tests (LlamaCuda*, Decode*), then decode steps of
# 1 and 2 sequences. Predicted: all pass; twell ~1.39-1.43 ms at one sequence, as without the prefetch before.
# On the device, with carry ["out/b67r.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s67/removed.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s67_removed} TAR=out/b67r.tar.xz
source bench/results/device_preamble.sh
timeout $(left 150) $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='LlamaCuda*:Decode*:*Llama*' > $O/tests.log 2>&1
echo "rc $?" >> $O/tests.log; tail -3 $O/tests.log; grep -E "FAILED|Failure" -A6 $O/tests.log | head -20; save
decode head head 1,2; save
