#!/bin/bash
# Sixty-fourth session, second run: the decode attention with 1, 2 or 4 warps a block, the most that keep every
# block resident (commit in COMMIT). A = out/b64.tar.xz (4ca53c8: 4 warps, 93 registers), B = out/b64w.tar.xz.
# Predicted (H100): at 32 sequences (1024 blocks, 2 warps now) the attention 58-64 -> ~45-48 µs a layer, the twell
# step 4.72 -> ~4.3 ms; batch 64 (1 warp) gains as much again; batch 1 and 16 (4 warps) even.
# B with --decode-attention-warps 4 separates the grid rule from the kernel's new register count (80).
# On the device, with carry ["out/b64.tar.xz", "out/b64w.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s64/warps.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s64_warps} TAR=out/b64w.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/B; tar xJf out/b64.tar.xz -C out; mv $PWD/out/head $PWD/out/A
cp out/A/COMMIT $O/COMMIT_A
timeout $(left 90) out/B/twell_gpu_tests --gtest_filter='DecodeAttention.*:*LlamaCuda*:*Attention*' > $O/tests.log 2>&1
echo "rc $?" >> $O/tests.log; tail -2 $O/tests.log; grep -E "FAILED|Failure" -A6 $O/tests.log | head -20; save
bench() {  # bench NAME BUILD [ARGS...]
  local n=$1 v=$2; shift 2
  timeout $(left 60) out/$v/twell bench model --no-prefill --decode-batch 1,16,32,64 --gather-batches 1 "$@" \
    --json $O/decode_$n.json > $O/decode_$n.txt 2> $O/decode_${n}_progress.log
  echo "rc $?" >> $O/decode_$n.txt; grep -E "impl|model_decode|rc" $O/decode_$n.txt
}
bench A A; bench B B; bench B4 B --decode-attention-warps 4; bench A2 A; bench B2 B; save
timeout $(left 70) ncu --set full --kernel-name regex:decode_attention --launch-skip 400 --launch-count 1 \
  -o $O/attn32 out/B/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/attn32.log 2>&1
echo "rc $?" >> $O/attn32.log; ncu --import $O/attn32.ncu-rep --page details > $O/attn32.txt 2>&1
grep -E "^  [a-z_]|Duration|DRAM Throughput|Registers Per|Local Memory Spilling Requests |Achieved Occupancy|Waves" $O/attn32.txt | head -12
rm -f $O/attn32.ncu-rep; save
