#!/bin/bash
# Sixty-third session, fifth run: why the decode attention reads its K/V at ~2.4 TB/s at batch 32 (h100/s63/attn/)
# and the few-token GEMM its weights at ~2.0-2.5: ncu (full set) of one layer's QKV GEMM, attention, output
# projection in `bench model --decode-batch 32` (352fe19's build, out/b63d.tar.xz); the first try (skip 40 of
# either name) caught four few-token GEMMs of 9-16 tokens before the decode steps (`ncu_first/`).
# On the device, with carry ["out/b63d.tar.xz"]: `BUDGET=<seconds> NAME=s63_ncu bash bench/results/h200/s63/ncu.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s63_ncu} TAR=out/b63d.tar.xz
source bench/results/device_preamble.sh
timeout $(left 200) ncu --set full --kernel-name regex:"decode_attention|few_token_gemm_kernel<1, 4>" --launch-skip 4 --launch-count 3 \
  -o $O/layer $B/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/ncu.log 2>&1; echo "rc $?" >> $O/ncu.log
tail -5 $O/ncu.log
ncu --import $O/layer.ncu-rep --page details > $O/layer.txt 2>&1
grep -E "^  [a-z_]|Duration|Memory Throughput|DRAM Throughput|L2 Hit|L1/TEX Hit|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Max Bandwidth|Mem Busy|Mem Pipes" $O/layer.txt | head -70
rm -f $O/layer.ncu-rep; save
