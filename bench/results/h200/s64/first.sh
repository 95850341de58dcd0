#!/bin/bash
# Sixty-fourth session, first run. A = out/b64.tar.xz (HEAD 4ca53c8, `pack.sh --build build-cuda out/b64.tar.xz
# twell_ktrace`), C = out/b63f.tar.xz (4b51f6b: the decode attention held to 64 registers, s63/bounds.sh).
# 1. A's whole GPU test suite (no GPU has run the commits after 352fe19).
# 2. C's attention and decode tests, then decode at 1 / 16 / 32 sequences, A then C.
#    Predicted (H100): C's attention at batch 32 58 -> ~45 µs, the twell step 4.5 -> ~4.1 ms; batch 1 even.
# 3. ncu of C's decode attention at batch 32 (spills and occupancy), and of A's few-token GEMM at batch 8
#    (s63/ncu2.sh's regex matched nothing: ncu matches --kernel-name against the bare function name unless
#    --kernel-name-base demangled).
# On the device, with carry ["out/b64.tar.xz", "out/b63f.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s64/first.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s64_first} TAR=out/b63f.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/C; tar xJf out/b64.tar.xz -C out; mv $PWD/out/head $PWD/out/A
cp out/A/COMMIT $O/COMMIT_A; cp out/C/COMMIT $O/COMMIT_C
timeout $(left 240) out/A/twell_gpu_tests > $O/tests_A.log 2>&1; echo "rc $?" >> $O/tests_A.log
tail -3 $O/tests_A.log; grep -E "FAILED|Failure" -A6 $O/tests_A.log | head -30; save
timeout $(left 60) out/C/twell_gpu_tests --gtest_filter='DecodeAttention.*:LlamaCuda.Decode*' > $O/tests_C.log 2>&1
echo "rc $?" >> $O/tests_C.log; tail -2 $O/tests_C.log; grep -E "FAILED|Failure" -A6 $O/tests_C.log | head -20; save
for v in A C; do
  timeout $(left 60) out/$v/twell bench model --no-prefill --decode-batch 1,16,32 --gather-batches 1 \
    --json $O/decode_$v.json > $O/decode_$v.txt 2> $O/decode_${v}_progress.log
  echo "rc $?" >> $O/decode_$v.txt; cat $O/decode_$v.txt
done; save
prof() {  # prof BUILD REGEX BATCH NAME
  timeout $(left 70) ncu --set full --kernel-name-base demangled --kernel-name regex:"$2" --launch-skip 400 --launch-count 1 \
    -o $O/$4 out/$1/twell bench model --no-prefill --decode-batch $3 --gather-batches 1 > $O/$4.log 2>&1; echo "rc $?" >> $O/$4.log
  ncu --import $O/$4.ncu-rep --page details > $O/$4.txt 2>&1
  grep -E "^  [a-z_]|Duration|DRAM Throughput|L2 Hit|L1/TEX Hit|Registers Per|Local|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Mem Busy|Max Bandwidth|Waves" $O/$4.txt | head -24
  rm -f $O/$4.ncu-rep; save
}
prof C decode_attention 32 attn32_C
prof A "few_token_gemm_kernel<1, 1>" 8 gemm8_A
