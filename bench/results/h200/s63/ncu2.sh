#!/bin/bash
# Sixty-third session, sixth run: ncu.sh's second try caught the decode attention of one sequence (a step
# before the batch's); here each kernel past its 400th launch, in the decode steps of 32 sequences.
# On the device, with carry ["out/b63d.tar.xz"]: `BUDGET=<seconds> NAME=s63_ncu2 bash bench/results/h200/s63/ncu2.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s63_ncu2} TAR=out/b63d.tar.xz
source bench/results/device_preamble.sh
for k in decode_attention "few_token_gemm_kernel<1, 4>"; do
  n=$(echo $k | cut -c1-6)
  timeout $(left 60) ncu --set full --kernel-name regex:"$k" --launch-skip 400 --launch-count 1 -o $O/$n \
    $B/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/$n.log 2>&1; echo "rc $?" >> $O/$n.log
  ncu --import $O/$n.ncu-rep --page details > $O/$n.txt 2>&1
  grep -E "^  [a-z_]|Duration|DRAM Throughput|L2 Hit|L1/TEX Hit|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Mem Busy|Max Bandwidth" $O/$n.txt | head -16
  rm -f $O/$n.ncu-rep; save
done
