#!/bin/bash
# Sixty-third session, fourth run: the decode attention with one query head a lane group (HB = 4 heads a
# block at head_dim 64), so that a warp's K/V loads read 512 contiguous bytes of a cache row; A = out/b63d.tar.xz
# (352fe19, one head a block), C = out/b63e.tar.xz (this build: heads grouped at every batch).
# Predicted (H100): the attention at batch 32 from 53 µs exclusive (2.4 TB/s, h100/s63/attn/trace32) to
# ~43 (3 TB/s), so a twell step 4.52 -> ~4.15 ms at batch 32, -0.1 to -0.2 ms at 8-16; batch 1 within noise.
# On the device, with carry ["out/b63d.tar.xz", "out/b63e.tar.xz"]: `BUDGET=<s> NAME=s63_dattn bash bench/results/h200/s63/decode_attn.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s63_dattn} TAR=out/b63e.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/C; tar xJf out/b63d.tar.xz -C out; mv $PWD/out/head $PWD/out/A
cp out/A/COMMIT $O/COMMIT_A
timeout $(left 120) out/C/twell_gpu_tests --gtest_filter='*DecodeAttention*:*Attention*:*LlamaCuda*' > $O/tests.log 2>&1; echo "rc $?" >> $O/tests.log
tail -3 $O/tests.log; grep -E "FAILED|Failure" -A8 $O/tests.log | head -30; grep "decode kernel rel err" $O/tests.log | head -12; save
for r in 1 2; do for v in A C; do
  timeout $(left 60) out/$v/twell bench model --no-prefill --decode-batch 1,4,16,32,64 --gather-batches 1 \
    --json $O/decode_${v}$r.json > $O/decode_${v}$r.txt 2> $O/decode_${v}${r}_progress.log
  echo "rc $?" >> $O/decode_${v}$r.txt; cat $O/decode_${v}$r.txt
done; done; save
CUDA_INJECTION64_PATH=out/A/libtwell_ktrace.so TWELL_KTRACE_OUT=$O/trace32.tsv \
  timeout $(left 60) out/C/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/trace32_bench.txt 2>&1
timeout $(left 40) $PY scripts/ktrace.py $O/trace32.tsv --window 8 > $O/trace32_summary.txt 2>&1; grep -E "graph|decode_attention" $O/trace32_summary.txt | head; rm -f $O/trace32.tsv; save
timeout $(left 60) compute-sanitizer --tool memcheck out/C/twell_gpu_tests --gtest_filter='DecodeAttention.*' > $O/memcheck.log 2>&1
echo "rc $?" >> $O/memcheck.log; tail -3 $O/memcheck.log; save
timeout $(left 150) out/C/twell_gpu_tests --gtest_brief=1 --gtest_filter='-*Attention*:*LlamaCuda*' > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -20; save
