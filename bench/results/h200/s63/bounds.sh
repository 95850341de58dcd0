#!/bin/bash
# Sixty-third session, seventh run: the decode attention held to 64 registers (eight blocks an SM, one wave of
# the 1024 blocks at 32 sequences). A = out/b63d.tar.xz (352fe19), C = out/b63f.tar.xz (this build).
# Predicted (H100): the attention at batch 32 58 -> ~45 µs (ncu), a twell step 4.5 -> ~4.1 ms; batch 1 even.
# Not run: no device time was left. The change (4b51f6b: `__launch_bounds__(kThreads, 8)` on the kernel) was
# taken back out of the tree in the commit that adds this line; b63f.tar.xz is 4b51f6b's build of it.
# On the device, with carry ["out/b63d.tar.xz", "out/b63f.tar.xz"]: `BUDGET=<s> NAME=s63_bounds bash bench/results/h200/s63/bounds.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s63_bounds} TAR=out/b63f.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/C; tar xJf out/b63d.tar.xz -C out; mv $PWD/out/head $PWD/out/A
cp out/A/COMMIT $O/COMMIT_A
timeout $(left 50) out/C/twell_gpu_tests --gtest_filter='DecodeAttention.*:LlamaCuda.Decode*' > $O/tests.log 2>&1; echo "rc $?" >> $O/tests.log
tail -2 $O/tests.log; grep -E "FAILED|Failure" -A6 $O/tests.log | head -20; save
for v in C A; do
  timeout $(left 40) out/$v/twell bench model --no-prefill --decode-batch 1,16,32 --gather-batches 1 \
    --json $O/decode_$v.json > $O/decode_$v.txt 2> $O/decode_${v}_progress.log
  echo "rc $?" >> $O/decode_$v.txt; cat $O/decode_$v.txt
done; save
