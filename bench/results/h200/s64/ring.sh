#!/bin/bash
# Sixty-fourth session, third run: the decode attention's K/V through a per-warp cp.async ring (6 slots, 5 steps
# ahead), R = out/b64r.tar.xz (COMMIT), against A = out/b64.tar.xz (4ca53c8: 4 steps into registers, 4 warps) and
# W = out/b64w.tar.xz (warps.sh's build: the register loads, 1/2/4 warps a block).
# Predicted (H100): at 32 sequences the attention 56.6 -> ~45 µs (ncu; ~85% of DRAM bandwidth), the twell step
# 4.51 -> ~4.1 ms; at 64 the 1-warp blocks no longer lose to 4 (7.75 against 7.18 in warps.sh); batch 1 even or
# better (5 steps in flight before the QKV's wait, not 4).
# On the device, with carry ["out/b64.tar.xz", "out/b64w.tar.xz", "out/b64r.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s64/ring.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s64_ring} TAR=out/b64r.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/R
for v in A:b64 W:b64w; do tar xJf out/${v#*:}.tar.xz -C out; mv $PWD/out/head $PWD/out/${v%:*}; cp out/${v%:*}/COMMIT $O/COMMIT_${v%:*}; done
timeout $(left 90) out/R/twell_gpu_tests --gtest_filter='DecodeAttention.*:*LlamaCuda*:*Attention*' > $O/tests.log 2>&1
echo "rc $?" >> $O/tests.log; tail -2 $O/tests.log; grep -E "FAILED|Failure" -A6 $O/tests.log | head -20; save
bench() {  # bench NAME BUILD [ARGS...]
  local n=$1 v=$2; shift 2
  timeout $(left 60) out/$v/twell bench model --no-prefill --decode-batch 1,16,32,64 --gather-batches 1 "$@" \
    --json $O/decode_$n.json > $O/decode_$n.txt 2> $O/decode_${n}_progress.log
  echo "rc $?" >> $O/decode_$n.txt; grep -E "model_decode|rc" $O/decode_$n.txt | awk '{print n, $0}' n=$n
}
bench R R; bench A A; bench R4 R --decode-attention-warps 4; bench R2 R --decode-attention-warps 2; bench R_2 R; save
timeout $(left 70) ncu --set full --kernel-name regex:decode_attention --launch-skip 400 --launch-count 1 \
  -o $O/attn32 out/R/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/attn32.log 2>&1
echo "rc $?" >> $O/attn32.log; ncu --import $O/attn32.ncu-rep --page details > $O/attn32.txt 2>&1
grep -E "^  [a-z_]|Duration|DRAM Throughput|Registers Per|Local Memory Spilling Requests |Achieved Occupancy|Waves" $O/attn32.txt | head -12
rm -f $O/attn32.ncu-rep; save
