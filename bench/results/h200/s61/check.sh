#!/bin/bash
# Sixty-first session, first run: the host-side changes of the sixtieth session's end that no GPU has run
# (d6ed54e: the turn bench checks each model's third call, the first graph launch, and its note says whether
# the timed calls replay a graph; de43c92: a capture that fails leaves its key eager; 083ed3a:
# FfnForward::capturable()). Predicted: the GPU suite passes (207 + the BenchModel turn test's new note
# strings), the turn figures as `h100/s60/attn2/` (21 tokens: dense ~3.43, twell ~2.98 ms). On an H200 also
# `twell bench model` and `twell bench ffn`, the standard cases (the top table's targets; predicted within it).
# On the device, with carry ["out"]: `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s61/check.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s61_check} TAR=${TAR:-out/b61a.tar.xz}
source bench/results/device_preamble.sh
timeout $(left 150) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
timeout $(left 120) $B/twell bench model --no-prefill --no-decode --turn ${TURNS:-1,21,32,64,128} --turn-context 4096 \
  --json $O/turn.json > $O/turn.txt 2> $O/turn_progress.log
echo "rc $?" >> $O/turn.txt; cat $O/turn.txt; save
grep -q H200 $O/gpu.txt || exit 0
timeout $(left 190) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; tail -25 $O/model.txt; save
timeout $(left 140) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E "^(16384|131072) .*(0.50|1.00)% .* twell  |^rc" $O/ffn.txt
