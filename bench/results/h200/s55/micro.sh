#!/bin/bash
# Fifty-fifth session: bench/micro/sddmm_tiles.cu, the up pass with each weight row read once a block of 512
# tokens (a thread a token, x from global memory, the rows' 16-byte pieces staged in shared memory) against a
# warp-per-token gather. Predicted (docs/perf.md, fifty-fifth session): bound by shared-memory wavefronts of
# random rows (~2.3-way conflicts), ~1.1 ms at M = 131072, E = 28 against the gather's ~1.8-2.0; at E = 56 ~2.2
# against ~3.6; at M = 16384 no gain (32 blocks for 132 SMs).
# Second run (the same call, KERNEL=groups): the tiles kernel was bound by the L2's 16-byte requests (ncu: L2 83%,
# shared memory 55%); groups_kernel takes the neurons a quarter at a time with 64-byte pieces. Predicted ~1.5 ms at
# M = 131072, E = 28 (the shared memory's floor from the first run's 55% of 2.82 ms), against the gather's ~1.95.
# Binary: out/micro/twell_micro_sddmm_tiles (build-cuda's). On the device, with carry ["out"]:
# `NAME=<folder> bash bench/results/h200/s55/micro.sh`.
set -u
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s55_micro}
O=$OUT/$NAME; mkdir -p $O
save() { (cd $OUT && tar cJf results.tar.xz $NAME); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
X=$PWD/out/micro/twell_micro_sddmm_tiles
for args in "131072 28" "131072 56" "16384 28"; do timeout 120 $X $args 2>&1 | tee -a $O/micro.txt; done; save
timeout 200 ncu --clock-control none -k regex:${KERNEL:-tiles}_kernel -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section SchedulerStats --section WarpStateStats --section InstructionStats $X 131072 28 > $O/ncu_tiles.txt 2>&1
timeout 120 ncu --clock-control none -k regex:gather_kernel -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
  $X 131072 28 > $O/ncu_gather.txt 2>&1
grep -E "Duration|Throughput|Bank|Wavefront|Executed Ipc|Issue Slots|Registers" $O/ncu_tiles.txt | head -30
grep -E "Duration|Throughput" $O/ncu_gather.txt | head -10
