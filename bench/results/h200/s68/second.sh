#!/bin/bash
# Sixty-eighth session, second call: out/b68c.tar.xz. first.sh's split chose its hot set in 64-neuron steps, which
# left the sparse part a width that is not a multiple of 176, so its gate ran on 256-wide tiles with a partial one
# (twell at I = 4992: 6.56 ms against 5.49 at I = 4928, 0.25%, M = 131072, H100). choose_hot_neurons now moves
# 704-neuron steps where I is a multiple of 176. Predicted (H100, from first.sh's parts): skewed M = 131072
# twell_split ~5.6 + 1.6 = ~7.2 ms against twell's ~8.0 (~0.55x); M = 16384 ~1.0 ms against 1.03.
# On the device, with carry ["out/b68c.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s68/second.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s68_second} TAR=out/b68c.tar.xz
source bench/results/device_preamble.sh
timeout $(left 200) $B/twell bench ffn -M 131072,16384 -d 0.005,0.01 --distribution skewed --split --json $O/split.json \
  > $O/split.txt 2> $O/split_progress.log
echo "rc $?" >> $O/split.txt; cat $O/split.txt | grep -E "twell|dense_cublas|^rc"; save
timeout $(left 120) $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='*Split*:ChooseHot*' > $O/split_tests.log 2>&1
echo "rc $?" >> $O/split_tests.log; tail -3 $O/split_tests.log; save
timeout $(left 150) compute-sanitizer --tool memcheck $B/twell_gpu_tests --gtest_brief=1 \
  --gtest_filter='Cases/SplitFfnGpu.MatchesCpuReference/M300_H256_I1344_d20permille_skewed_gated:SplitFfnGpuBits.*' \
  > $O/memcheck_split.log 2>&1
echo "rc $?" >> $O/memcheck_split.log; tail -4 $O/memcheck_split.log; save
# The 256 tile's cost at a width that is not a multiple of it: I = 4992 (19.5 tiles of 256, 28.4 of 176) and
# I = 8192 (32 of 256, 46.5 of 176), uniform 0.25%, each tile. first/parts.txt had 4992 at 256 20% slower than 4928
# at 176. Predicted: 176 faster at 4992 by ~15%, about even at 8192.
for I in 4992 8192; do for T in 176 256; do
  timeout $(left 60) $B/twell bench ffn -M 131072 -I $I -d 0.0025 --distribution uniform --tile $T \
    --json $O/tile_I${I}_T$T.json > $O/tile_I${I}_T$T.txt 2>/dev/null
  echo "rc $?" >> $O/tile_I${I}_T$T.txt; grep -E "twell |dense_cublas" $O/tile_I${I}_T$T.txt | sed "s/^/T$T /"; save
done; done
