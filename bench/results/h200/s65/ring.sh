#!/bin/bash
# Sixty-fifth session: HEAD's full GPU suite (no GPU has run the code since 3dc5c01), then the sixty-fourth
# session's A/B of its cp.async ring: R = out/b64r.tar.xz (75b619b, the decode attention's K/V through a
# per-warp cp.async ring, 6 slots, 5 steps ahead) against A = HEAD's build (out/b65h.tar.xz: 4 steps into
# registers, 2 or 4 warps a block).
# Predicted (s64): at 32 sequences the attention 56.6 -> ~45 µs, the twell step 4.51 -> ~4.1 ms; at 64 the
# ring's 1-warp blocks no longer lose to 4 warps; batch 1 even or better.
# On the device, with carry ["out/b65h.tar.xz", "out/b64r.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s65/ring.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s65_ring} TAR=out/b65h.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/A; unpack R out/b64r.tar.xz
timeout $(left 200) out/A/twell_gpu_tests > $O/tests_A.log 2>&1
echo "rc $?" >> $O/tests_A.log; tail -3 $O/tests_A.log; grep -E "FAILED|Failure" -A6 $O/tests_A.log | head -20
timeout $(left 60) out/R/twell_gpu_tests --gtest_filter='DecodeAttention.*:*LlamaCuda*:*Attention*' > $O/tests_R.log 2>&1
echo "rc $?" >> $O/tests_R.log; tail -2 $O/tests_R.log; grep -E "FAILED|Failure" -A6 $O/tests_R.log | head -20; save
for v in "R R" "A A" "R4 R --decode-attention-warps 4" "R_2 R" "A_2 A"; do
  set -- $v; n=$1 b=$2; shift 2; decode $n $b 1,16,32,64 "$@"
done; save
timeout $(left 70) ncu --set full --kernel-name regex:decode_attention --launch-skip 400 --launch-count 1 \
  -o $O/attn32 out/R/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/attn32.log 2>&1
echo "rc $?" >> $O/attn32.log; ncu --import $O/attn32.ncu-rep --page details > $O/attn32.txt 2>&1
grep -E "^  [a-z_]|Duration|DRAM Throughput|Registers Per|Local Memory Spilling Requests |Achieved Occupancy|Waves" $O/attn32.txt | head -12
rm -f $O/attn32.ncu-rep; save
