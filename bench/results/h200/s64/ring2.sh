#!/bin/bash
# Sixty-fourth session: ring.sh cut to what the device time left allows. R = out/b64r.tar.xz (75b619b: the decode
# attention's K/V through a per-warp cp.async ring, 5 steps ahead; its own rule took 1 warp at 64 sequences),
# A = out/b64h.tar.xz (HEAD: 4 steps into registers, 2 or 4 warps a block). Predictions as in ring.sh: at 32
# sequences the twell step 4.51 -> ~4.1 ms; batch 1 even or better.
# On the device, with carry ["out/b64h.tar.xz", "out/b64r.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s64/ring2.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s64_ring2} TAR=out/b64r.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/R; tar xJf out/b64h.tar.xz -C out; mv $PWD/out/head $PWD/out/A; cp out/A/COMMIT $O/COMMIT_A
timeout $(left 40) out/R/twell_gpu_tests --gtest_filter='DecodeAttention.*:LlamaCuda.*' > $O/tests.log 2>&1
echo "rc $?" >> $O/tests.log; tail -2 $O/tests.log; grep -E "FAILED|Failure" -A6 $O/tests.log | head -20; save
bench() {  # bench NAME BUILD [ARGS...]
  local n=$1 v=$2; shift 2
  timeout $(left 40) out/$v/twell bench model --no-prefill --decode-batch 1,32,64 --gather-batches 1 "$@" \
    --json $O/decode_$n.json > $O/decode_$n.txt 2> $O/decode_${n}_progress.log
  echo "rc $?" >> $O/decode_$n.txt; grep -E "model_decode|rc" $O/decode_$n.txt | awk '{print n, $0}' n=$n
}
bench A A; bench R R; bench R2 R --decode-attention-warps 2; bench R4 R --decode-attention-warps 4; save
