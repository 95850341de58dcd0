#!/bin/bash
# Sixtieth session: why a block of the flash kernel takes ~1.1 µs a key tile with warps_split_keys at S = 21
# (`h100/s60/attn/micro.txt`: 73 µs for 65 tiles at key_splits 1, where a tile's loads and math predict
# ~0.3 µs). ncu (full set) of the micro-benchmark's keys kernel at key_splits 1 and at the plan's 5, and of
# the rows kernel at key_splits 1, S = 21 after 4096.
# On the device, with carry ["out"]: `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s60/ncu.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s60_ncu} TAR=${TAR:-out/b60a.tar.xz}
source bench/results/device_preamble.sh
prof() {  # name, kernel regex (mangled), launches to skip
  timeout $(left 60) ncu --set full --kernel-name-base mangled --kernel-name regex:"$2" --launch-skip $3 --launch-count 1 \
    -o $O/$1 $B/twell_micro_turn_attention 4096 21 > $O/$1.log 2>&1; echo "rc $?" >> $O/$1.log
  ncu --import $O/$1.ncu-rep --page details > $O/$1.txt 2>&1
  grep -E "^  [a-z_]|Duration|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy" $O/$1.txt | head -14
  rm -f $O/$1.ncu-rep; save
}
prof keys1 'Lb1E' 2
prof keys_plan 'Lb1E' 1062
prof rows1 'Lb0E' 2
