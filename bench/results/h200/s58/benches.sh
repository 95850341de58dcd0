#!/bin/bash
# Fifty-eighth session: only on an H200 (the issues' targets are H200 figures), `twell bench ffn` and
# `twell bench model`, the standard cases, with this session's build (FFN kernels unchanged since the
# thirty-ninth session; the prefill attention's key splits do not apply to the 64 × 2048 prefill, whose rows
# fill the GPU). Predicted: within perf.md's top table (FFN 0.576-0.625x at M = 131072, prefill ~0.77x,
# 182-190 tokens/ms, decode batch 1 ~0.645x).
# With carry ["out"]: `TAR=<tarball> NAME=<results folder> bash bench/results/h200/s58/benches.sh`.
set -u
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s58_benches}
nvidia-smi --query-gpu=name --format=csv | grep -q H200 || { echo "not an H200: nothing run"; exit 0; }
tar xJf ${TAR:-out/b44.tar.xz} -C out
B=$PWD/out/head O=$OUT/$NAME; mkdir -p $O; cp $B/COMMIT $O/COMMIT
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
save() { (cd $OUT && tar cJf results.tar.xz $NAME); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt
# The model first (the prefill targets); the FFN where the device time allows (SKIP_FFN=1: not at all).
timeout 190 $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; tail -25 $O/model.txt; save
[ -n "${SKIP_FFN:-}" ] && exit 0
timeout 140 $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E "^(16384|131072) .*(0.50|1.00)% .* twell  |^rc" $O/ffn.txt
