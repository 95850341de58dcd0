#!/bin/bash
# Sixty-third session, second run: the LM head (49152 × 2048, f32 logits) through twell's decode GEMV
# at one row and its few-token GEMM at 2 to 32 (was cuBLASLt). A = out/b63.tar.xz (82ae4e6), C =
# out/b63c.tar.xz (this build, binaries of build-cuda). Predicted (H100): the head at 2.4-2.5 TB/s
# against cuBLASLt's ~1.9 (~106 -> ~82 µs), so a decode step -20 to -25 µs at batches 1 to 32 (~1%).
# On the device, with carry ["out/b63.tar.xz", "out/b63c.tar.xz"]:
# `BUDGET=<seconds> NAME=s63_head bash bench/results/h200/s63/head.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s63_head} TAR=out/b63c.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/C; tar xJf out/b63.tar.xz -C out; mv $PWD/out/head $PWD/out/A
cp out/A/COMMIT $O/COMMIT_A
F='*FewTokenGemm*:*DecodeGemv*:*LlamaCuda*:BenchModel.*:*GraphCapture*'
timeout $(left 150) out/C/twell_gpu_tests --gtest_filter="$F" > $O/new_tests.log 2>&1; echo "rc $?" >> $O/new_tests.log
tail -3 $O/new_tests.log; grep -E "FAILED|Failure" -A8 $O/new_tests.log | head -30; grep "f32" $O/new_tests.log; save
timeout $(left 150) out/C/twell_micro_few_token_gemm > $O/micro_gemm.txt 2>&1; echo "rc $?" >> $O/micro_gemm.txt
grep -E "head|match|rc" $O/micro_gemm.txt; save
for r in 1 2; do for v in A C; do
  timeout $(left 60) out/$v/twell bench model --no-prefill --decode-batch 1,2,4,8,16,32 --gather-batches 1 \
    --json $O/decode_${v}$r.json > $O/decode_${v}$r.txt 2> $O/decode_${v}${r}_progress.log
  echo "rc $?" >> $O/decode_${v}$r.txt; cat $O/decode_${v}$r.txt
done; done; save
timeout $(left 200) out/C/twell_gpu_tests --gtest_brief=1 --gtest_filter="-$F" > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
timeout $(left 60) compute-sanitizer --tool memcheck out/C/twell_gpu_tests --gtest_filter='*F32Outputs*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -3 $O/memcheck.log; save
