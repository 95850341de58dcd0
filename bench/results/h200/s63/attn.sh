#!/bin/bash
# Sixty-third session, third run: where a decode step of 8 to 32 sequences goes. At batch 32 a twell step
# took 4.56 ms on the H100 against 1.39 at batch 1 (h100/s63/head/), with the same 4.1 GB of weights: the
# rest is the attention over 32 × 512 cached positions (128 MB a layer, ~40 µs at 3.2 TB/s) and the
# FFN's per-token work. Predicted: the attention runs below 2.5 TB/s at batch 32, where its splits rule
# (decode_attention_splits: 4 blocks an SM) gives one block per (sequence, head), eight rounds of 64 keys
# each behind one load; 2 splits faster there. The decode bench at batches 8 / 16 / 32 with each
# `--decode-attention-splits` 0 (the rule), 1, 2, 4, then ktrace of batch 32 (`scripts/ktrace.py`).
# On the device, with carry ["out/b63d.tar.xz"]: `BUDGET=<seconds> NAME=s63_attn bash bench/results/h200/s63/attn.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s63_attn} TAR=out/b63d.tar.xz
source bench/results/device_preamble.sh
for s in 0 1 2 4; do
  timeout $(left 60) $B/twell bench model --no-prefill --decode-batch 8,16,32 --gather-batches 1 --decode-attention-splits $s \
    --json $O/decode_s$s.json > $O/decode_s$s.txt 2> $O/decode_s${s}_progress.log
  echo "rc $?" >> $O/decode_s$s.txt; cat $O/decode_s$s.txt
done; save
CUDA_INJECTION64_PATH=$B/libtwell_ktrace.so TWELL_KTRACE_OUT=$O/trace32.tsv \
  timeout $(left 90) $B/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/trace32_bench.txt 2>&1
echo "rc $?" >> $O/trace32_bench.txt; tail -4 $O/trace32_bench.txt
timeout $(left 60) $PY scripts/ktrace.py $O/trace32.tsv --window 14 > $O/trace32_summary.txt 2>&1; echo "rc $?" >> $O/trace32_summary.txt
cat $O/trace32_summary.txt | head -80; xz -9 $O/trace32.tsv; ls -la $O; save
