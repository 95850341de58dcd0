#!/bin/bash
# Fifty-fifth session: bench/micro/sampler.cpp with the min-p and repetition-penalty modes (2048 seen ids), one
# row of 49152 logits. Predicted: min-p as T 0.8 (one compare more a logit in the draw); the penalty on the GPU
# +10-20 us (a 192 KB copy, a kernel over 2048 ids, the ids staged in pinned memory), on the host +50-150 us (a
# copy of the row).
# Binary: out/micro/twell_micro_sampler (build-cuda's). On the device, with carry ["out"]:
# `NAME=<folder> bash bench/results/h200/s55/sampler.sh`.
set -u
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s55_sampler}
O=$OUT/$NAME; mkdir -p $O
trap '(cd $OUT && tar cJf results.tar.xz $NAME); rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout 200 $PWD/out/micro/twell_micro_sampler 2>&1 | tee $O/micro_sampler.txt; echo "rc ${PIPESTATUS[0]}" >> $O/micro_sampler.txt
