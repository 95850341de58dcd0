#!/bin/bash
# Sixtieth session, second attention run: the flash kernel's K/V tile copies unrolled at compile time
# (ncu of `attn/`: ~700 instructions a warp a tile at S = 21, ~200 of them the copies' generic loop), the
# output's rescale skipped where no row's maximum moved, and warps_split_keys' four ranges a row merged
# in the block before the cluster merges (one DSMEM read a block, not four). Predicted (H100, S = 21 after
# 4096, the plan's 5 splits): keys 27 -> ~17 µs; rows faster too (the same copies); the turn of 21 tokens
# dense 3.89 -> ~3.5 ms. Also short prefills replay a graph (short_prefill_graph): the new
# LlamaCuda.ShortPrefillsReplayAGraph (predicted pass), and the turn then bound by its kernels: 21 tokens
# dense ~3.0, twell ~2.6 ms (the trace's GPU time less the attention's gain); `--no-graphs` for the A/B. Then the GPU suite where time is left.
# On the device, with carry ["out"]: `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s60/attn2.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s60_attn2} TAR=${TAR:-out/b60c.tar.xz}
source bench/results/device_preamble.sh
timeout $(left 150) $B/twell_gpu_tests --gtest_filter='*Attention*:LlamaCuda.*' > $O/attn_tests.log 2>&1; echo "rc $?" >> $O/attn_tests.log
tail -3 $O/attn_tests.log; grep -E "FAILED|Failure" -A8 $O/attn_tests.log | head -30; save
timeout $(left 60) $B/twell_micro_turn_attention 4096 ${SIZES:-1,8,21,32,48,64,96,128,256} > $O/micro.txt 2>&1
echo "rc $?" >> $O/micro.txt; grep -E "plan|rc|WRONG|match" $O/micro.txt; save
timeout $(left 120) $B/twell bench model --no-prefill --no-decode --turn ${TURNS:-1,21,32,64,128} --turn-context 4096 \
  --json $O/turn.json > $O/turn.txt 2> $O/turn_progress.log
echo "rc $?" >> $O/turn.txt; cat $O/turn.txt; save
timeout $(left 60) $B/twell bench model --no-prefill --no-decode --turn 21 --turn-context 4096 --no-graphs \
  --json $O/turn_no_graphs.json > $O/turn_no_graphs.txt 2> $O/turn_no_graphs_progress.log
echo "rc $?" >> $O/turn_no_graphs.txt; cat $O/turn_no_graphs.txt; save
timeout $(left 90) compute-sanitizer --tool memcheck $B/twell_gpu_tests --gtest_filter='*PrefillAttention.*:LlamaCuda.ShortPrefills*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -3 $O/memcheck.log; save
timeout $(left 60) ncu --set full --kernel-name-base mangled --kernel-name regex:'Lb1E' --launch-skip 1062 --launch-count 1 \
  -o $O/keys_plan $B/twell_micro_turn_attention 4096 21 > $O/ncu.log 2>&1; echo "rc $?" >> $O/ncu.log
ncu --import $O/keys_plan.ncu-rep --page details > $O/keys_plan.txt 2>&1; rm -f $O/keys_plan.ncu-rep
grep -E "Duration|DRAM Throughput|Registers Per|Warp Cycles Per Issued|Executed Instructions  " $O/keys_plan.txt | head
save
[ $(left 100) -ge 100 ] && { timeout $(left 100) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
  tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; }
