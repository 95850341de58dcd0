#!/bin/bash
# Sixty-first session, A/B of two builds: A = HEAD at the session's start (b61a), B = (1) the KW flash
# blocks (warps_split_keys) with 5 K/V stages at head_dim 64, 3 at 128 (were 3 / 2; still two blocks an
# SM), (2) a one-token prefill of the twell model replayed as a CUDA graph (FfnForward::capturable(M):
# the one-token kernel reads nothing back), (3) the few-token GEMM (launch_few_token_gemm) for the QKV and
# O projections and the dense FFN's gate and up at 2 to 32 tokens (LlamaCudaOptions::few_token_gemm, off by
# default until measured: B's `--few-token-gemm` is the A/B of (3) alone). Predicted: turn attention micro at S = 21 after 4096 23.9 -> ~16 µs (the K/V
# loads' latency, ncu's bound in `h100/s60/attn2/`); the few-token GEMM at ~2.8-3.0 TB/s of weights
# against cuBLASLt's 1.4-2.1 (QKV 25 MB ~11.8 -> ~8.5 µs); the 21-token turn twell 2.98 -> ~2.4 ms; the
# one-token turn twell 2.00 -> ~1.4 ms (eager launches were ~0.6 ms of it), dense unchanged; decode at
# batch 16 -0.2 to -0.3 ms a step in both models.
# Not yet run (no GPU came in the sixty-first or sixty-second session). The tarballs (out/ is not tracked):
# `bench/results/pack.sh 083ed3a out/b61a.tar.xz twell_micro_turn_attention` and
# `bench/results/pack.sh 9e9a5d2 out/b61b.tar.xz twell_micro_turn_attention twell_micro_few_token_gemm`.
# On the device, with carry ["out"]: `BUDGET=<seconds> NAME=<results folder> bash bench/results/h200/s61/ab.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s61_ab} TAR=out/b61a.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/A; tar xJf out/b61b.tar.xz -C out; mv $PWD/out/head $PWD/out/B
cp out/B/COMMIT $O/COMMIT_B
timeout $(left 120) out/B/twell_gpu_tests --gtest_filter='*FewTokenGemm*:*GraphCapture*:LlamaCuda.*:BenchModel.*:*Attention*' \
  > $O/new_tests_B.log 2>&1; echo "rc $?" >> $O/new_tests_B.log
tail -3 $O/new_tests_B.log; grep -E "FAILED|Failure" -A8 $O/new_tests_B.log | head -30; save
timeout $(left 120) out/B/twell_micro_few_token_gemm > $O/micro_gemm.txt 2>&1; echo "rc $?" >> $O/micro_gemm.txt
cat $O/micro_gemm.txt; save
for v in A B; do
  timeout $(left 60) out/$v/twell_micro_turn_attention 4096 1,8,21,32,48,64 > $O/micro_attn_$v.txt 2>&1
  echo "rc $?" >> $O/micro_attn_$v.txt; grep -E "plan|rc|WRONG" $O/micro_attn_$v.txt
done; save
for v in A B B_few; do
  timeout $(left 120) out/${v%_few}/twell bench model --no-prefill --no-decode --turn 1,21,32 --turn-context 4096 \
    $([ $v = B_few ] && echo --few-token-gemm) --json $O/turn_$v.json > $O/turn_$v.txt 2> $O/turn_progress_$v.log
  echo "rc $?" >> $O/turn_$v.txt; cat $O/turn_$v.txt
done; save
for f in "" "--few-token-gemm"; do
  n=decode${f:+_few}
  timeout $(left 150) out/B/twell bench model --no-prefill --decode-batch 4,16,32 --gather-batches 1 $f \
    --json $O/$n.json > $O/$n.txt 2> $O/${n}_progress.log
  echo "rc $?" >> $O/$n.txt; cat $O/$n.txt
done; save
timeout $(left 200) out/B/twell_gpu_tests --gtest_brief=1 --gtest_filter='-*FewTokenGemm*:*GraphCapture*:LlamaCuda.*:BenchModel.*:*Attention*' > $O/gpu_tests_B.log 2>&1; echo "rc $?" >> $O/gpu_tests_B.log
tail -3 $O/gpu_tests_B.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests_B.log | head -30; save
timeout $(left 100) compute-sanitizer --tool memcheck out/B/twell_gpu_tests --gtest_filter='*FewTokenGemm*:*GraphCapture*:LlamaCuda.ShortPrefills*' \
  > $O/memcheck_B.log 2>&1; echo "rc $?" >> $O/memcheck_B.log; tail -3 $O/memcheck_B.log; save
