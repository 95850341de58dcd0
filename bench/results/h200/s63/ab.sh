#!/bin/bash
# Sixty-third session: the few-token GEMM on by default after its first measurement (h100/s61/ab/): its
# launcher now counts resident blocks with the occupancy calculator (the old 65536 / registers count
# put the 16-row kernels at 9 to 24 tokens in two waves) and takes 32 rows a block at 9 to 24 tokens only;
# the KW attention blocks back to 3 / 2 stages. A/B in one build: default against --no-few-token-gemm.
# Predicted (H100): micro at 16 tokens QKV 13.7 -> ~11.3 µs, gate 13.7 -> ~10.9; at 21 QKV ~12.2; at 32
# QKV 20.5 -> ~12.7, gate ~12.1 (cuBLASLt 13.3 / 11.7); decode twell vs cuBLASLt -0.36 ms at batch 4 (as
# s61), -0.1 to -0.15 ms at 16, about even at 32; turn attention micro back to ~21.2 µs at S = 1.
# The tarball: HEAD's build-cuda binaries (twell, twell_gpu_tests, libtwell_c.so, the two micros; COMMIT).
# On the device, with carry ["out/b63.tar.xz"]: `BUDGET=<seconds> NAME=s63 bash bench/results/h200/s63/ab.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s63} TAR=out/b63.tar.xz
source bench/results/device_preamble.sh
timeout $(left 120) $B/twell_gpu_tests --gtest_filter='*FewTokenGemm*:*GraphCapture*:*LlamaCuda*:BenchModel.*' \
  > $O/new_tests.log 2>&1; echo "rc $?" >> $O/new_tests.log
tail -3 $O/new_tests.log; grep -E "FAILED|Failure" -A8 $O/new_tests.log | head -30; save
timeout $(left 120) $B/twell_micro_few_token_gemm > $O/micro_gemm.txt 2>&1; echo "rc $?" >> $O/micro_gemm.txt
cat $O/micro_gemm.txt; save
timeout $(left 60) $B/twell_micro_turn_attention 4096 1,21,32 > $O/micro_attn.txt 2>&1
echo "rc $?" >> $O/micro_attn.txt; grep -E "plan|rc|WRONG" $O/micro_attn.txt; save
for f in "" "--no-few-token-gemm"; do
  n=decode${f:+_cublaslt}
  timeout $(left 150) $B/twell bench model --no-prefill --decode-batch 2,4,8,16,32 --gather-batches 1 $f \
    --json $O/$n.json > $O/$n.txt 2> $O/${n}_progress.log
  echo "rc $?" >> $O/$n.txt; cat $O/$n.txt
done; save
for f in "" "--no-few-token-gemm"; do
  n=turn${f:+_cublaslt}
  timeout $(left 120) $B/twell bench model --no-prefill --no-decode --turn 1,8,21,32 --turn-context 4096 $f \
    --json $O/$n.json > $O/$n.txt 2> $O/${n}_progress.log
  echo "rc $?" >> $O/$n.txt; cat $O/$n.txt
done; save
timeout $(left 200) $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='-*FewTokenGemm*:*GraphCapture*:*LlamaCuda*:BenchModel.*' > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
timeout $(left 100) compute-sanitizer --tool memcheck $B/twell_gpu_tests --gtest_filter='*FewTokenGemm*:LlamaCuda.ShortPrefills*:*/BatchEqualsSingleSequences*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -3 $O/memcheck.log; save
