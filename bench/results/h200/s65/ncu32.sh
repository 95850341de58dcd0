#!/bin/bash
# Sixty-fifth session: ncu of HEAD's decode step at 32 sequences: the decode attention (2 warps, registers)
# beside the ring's 55.8 µs (ring.sh), and the few-token GEMMs (QKV, O, gate) by their demangled names.
# On the device, with carry ["out/b65h.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s65/ncu32.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s65_ncu32} TAR=out/b65h.tar.xz
source bench/results/device_preamble.sh
for k in "attn regex:decode_attention 400 1" "gemm regex:few_token_gemm 400 3"; do
  set -- $k
  timeout $(left 90) ncu --set full --kernel-name-base demangled --kernel-name $2 --launch-skip $3 --launch-count $4 \
    -o $O/$1 $B/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/$1.log 2>&1
  echo "rc $?" >> $O/$1.log; ncu --import $O/$1.ncu-rep --page details > $O/$1.txt 2>&1
  grep -E "^  [a-z_ ]*[a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Registers Per|Achieved Occupancy|Waves" $O/$1.txt | head -30
  rm -f $O/$1.ncu-rep; save
done
