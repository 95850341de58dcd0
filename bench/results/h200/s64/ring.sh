#!/bin/bash
# Sixty-fourth session, written for the next (no device could be started for the session's last hour): the
# decode attention's K/V through a per-warp cp.async ring (6 slots, 5 steps ahead), R = out/b64r.tar.xz (75b619b,
# taken back out in 32cd03e; its own rule took 1 warp a block at 64 sequences), against A = out/b64h.tar.xz
# (32cd03e's build: 4 steps into registers, 2 or 4 warps a block).
# Predicted (H100): at 32 sequences the attention 56.6 -> ~45 µs (ncu; ~85% of DRAM bandwidth), the twell step
# 4.51 -> ~4.1 ms; at 64 the 1-warp blocks no longer lose to 4 (7.75 against 7.18 in warps.sh); batch 1 even or
# better (5 steps in flight before the QKV's wait, not 4).
# On the device, with carry ["out/b64h.tar.xz", "out/b64r.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s64/ring.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s64_ring} TAR=out/b64r.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/R; unpack A out/b64h.tar.xz
timeout $(left 90) out/R/twell_gpu_tests --gtest_filter='DecodeAttention.*:*LlamaCuda*:*Attention*' > $O/tests.log 2>&1
echo "rc $?" >> $O/tests.log; tail -2 $O/tests.log; grep -E "FAILED|Failure" -A6 $O/tests.log | head -20; save
for v in "R R" "A A" "R4 R --decode-attention-warps 4" "R2 R --decode-attention-warps 2" "R_2 R" "A_2 A"; do
  set -- $v; n=$1 b=$2; shift 2; decode $n $b 1,16,32,64 "$@"
done; save
timeout $(left 70) ncu --set full --kernel-name regex:decode_attention --launch-skip 400 --launch-count 1 \
  -o $O/attn32 out/R/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/attn32.log 2>&1
echo "rc $?" >> $O/attn32.log; ncu --import $O/attn32.ncu-rep --page details > $O/attn32.txt 2>&1
grep -E "^  [a-z_]|Duration|DRAM Throughput|Registers Per|Local Memory Spilling Requests |Achieved Occupancy|Waves" $O/attn32.txt | head -12
rm -f $O/attn32.ncu-rep; save
