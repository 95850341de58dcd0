#!/bin/bash
# Fifty-ninth session: a prefill of a few tokens on a sparse model takes the gather FFN
# (LlamaCudaOptions::prefill_gather: a conversation's next turn after its cached history), `twell bench
# model --turn`, and launch_prefill's unsplit kernel launched in one place. On the device:
#  1. the GPU suite (predicted all pass; LlamaCuda.FewTokensAfterACachedPrefixGatherOnASparseModel and
#     BenchModel.AConversationsNextTurnGathersTheActiveRows new);
#  2. memcheck of the new tests and of PrefillAttention.* (predicted 0 errors);
#  3. `twell bench model --turn 1,21,32 --turn-context 4096` at the 2B shape (38 layers, ~28 non-zeros a token):
#     predicted, for 21 tokens on an H100, dense ~2.3 ms, twell_no_gather ~ dense, twell ~1.9 ms (-11 µs a layer:
#     the gather FFN's up and down against the dense up, product and down, as at decode batch 16); for one
#     token both twell models alike (the one-token kernel), below dense;
#  4. only on an H200 and where time is left: `twell bench model` and `twell bench ffn`, the standard cases.
# Binaries ($TAR): head/ (twell, twell_gpu_tests, libtwell_c.so of build-cuda, stripped, COMMIT).
# On the device, with carry ["out"]: `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s59/run.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s59} TAR=${TAR:-out/b47.tar.xz}
source bench/results/device_preamble.sh
if [ -z "${SKIP_SUITE:-}" ]; then
timeout $(left 200) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
timeout $(left 90) compute-sanitizer --tool memcheck $B/twell_gpu_tests \
  --gtest_filter='LlamaCuda.FewTokens*:BenchModel.AConversation*:*PrefillAttention.*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -4 $O/memcheck.log; save
fi
timeout $(left 150) $B/twell bench model --no-prefill --no-decode --turn ${TURNS:-1,21,32,64,128} --turn-context 4096 \
  --json $O/turn.json > $O/turn.txt 2> $O/turn_progress.log
echo "rc $?" >> $O/turn.txt; cat $O/turn.txt; grep "turn of" $O/turn_progress.log; save
# cuBLASLt's autotune (a problem's second call) at turns of 64 and 128 rows, where the GEMMs read more
# weight bytes than they compute: the same turns untuned (predicted within 2% of the tuned times above).
[ $(left 100) -ge 100 ] && { TWELL_LT_AUTOTUNE=0 timeout $(left 100) $B/twell bench model --no-prefill --no-decode \
  --turn 64,128 --turn-context 4096 --json $O/turn_untuned.json > $O/turn_untuned.txt 2> $O/turn_untuned_progress.log
  echo "rc $?" >> $O/turn_untuned.txt; cat $O/turn_untuned.txt; save; }
grep -q H200 $O/gpu.txt || { echo "not an H200: the standard benches are not run"; exit 0; }
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; tail -25 $O/model.txt; save
timeout $(left 140) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E "^(16384|131072) .*(0.50|1.00)% .* twell  |^rc" $O/ffn.txt
