#!/bin/bash
# Sixtieth session: the prefill attention of a few new tokens over a long history. A ktrace of a turn of
# 21 tokens after 4096 (`h100/s60/trace/`) found the flash kernel at 47 µs of a layer's ~116 (its 128-row
# blocks held 21 rows: three of four warps scored rows past S). AttentionArgs::warps_split_keys: the warps
# share 32 rows and split each key tile. On the device:
#  1. the attention tests (PrefillAttention: every case also with warps_split_keys at key_splits 1, 2, 3, 8),
#     memcheck and racecheck of them (predicted: pass, 0 errors, 0 hazards);
#  2. the micro-benchmark (bench/micro/turn_attention.cpp) for B = 1 after 4096, S = 1 to 256, and for a
#     decode-like B = 64 after 1024. Predicted for S = 21: rows ~47 µs at the plan's 5 splits (the trace),
#     keys ~12-15 µs (a warp's work a tile a quarter of a row-warp's; the K/V reads, 34 MB, ~10 µs at HBM's
#     rate, bound it);
#  3. `twell bench model --turn 1,21,32,64,128 --turn-context 4096`: predicted for 21 tokens on an H100
#     dense 4.84 -> ~3.6 ms, twell 4.41 -> ~3.2 ms (-33 µs a layer);
#  4. ncu (full set) of the keys kernel at S = 21, where time is left.
# Binaries ($TAR): head/ (twell, twell_gpu_tests, twell_micro_turn_attention, libtwell_c.so, stripped, COMMIT).
# On the device, with carry ["out"]: `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s60/attn.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s60_attn} TAR=${TAR:-out/b60a.tar.xz}
source bench/results/device_preamble.sh
timeout $(left 60) $B/twell_gpu_tests --gtest_filter='*Attention*' > $O/attn_tests.log 2>&1; echo "rc $?" >> $O/attn_tests.log
tail -3 $O/attn_tests.log; grep -E "FAILED|Failure" -A8 $O/attn_tests.log | head -30; save
timeout $(left 60) $B/twell_micro_turn_attention 4096 > $O/micro.txt 2>&1; echo "rc $?" >> $O/micro.txt; cat $O/micro.txt; save
timeout $(left 40) $B/twell_micro_turn_attention 1024 1,2,4 64 > $O/micro_b64.txt 2>&1; echo "rc $?" >> $O/micro_b64.txt
cat $O/micro_b64.txt; save
timeout $(left 120) $B/twell bench model --no-prefill --no-decode --turn ${TURNS:-1,21,32,64,128} --turn-context 4096 \
  --json $O/turn.json > $O/turn.txt 2> $O/turn_progress.log
echo "rc $?" >> $O/turn.txt; cat $O/turn.txt; save
timeout $(left 90) compute-sanitizer --tool memcheck $B/twell_gpu_tests --gtest_filter='*PrefillAttention.*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -3 $O/memcheck.log; save
timeout $(left 90) compute-sanitizer --tool racecheck $B/twell_gpu_tests --gtest_filter='*PrefillAttention.*' \
  > $O/racecheck.log 2>&1; echo "rc $?" >> $O/racecheck.log; tail -3 $O/racecheck.log; save
[ $(left 60) -ge 60 ] && { timeout $(left 60) ncu --set full --kernel-name regex:'flash_prefill.*Lb1E' --launch-skip 2 \
  --launch-count 1 -o $O/keys21 $B/twell_micro_turn_attention 4096 21 > $O/ncu.log 2>&1; echo "rc $?" >> $O/ncu.log
  ncu --import $O/keys21.ncu-rep --page details > $O/keys21.txt 2>&1; grep -E "Duration|Throughput|Registers|Achieved Occ|Theoretical Occ" $O/keys21.txt | head -20; save; }
