#!/bin/bash
# Fifty-sixth session: the standard benches (`twell bench ffn`, `twell bench model`), only where the board is an
# H200 (the issues' targets are H200 figures; every run since the forty-seventh session got an H100): on any
# other board it stops at once. Kernels of the FFN and the model unchanged since the thirty-ninth session:
# predicted within perf.md's top table (FFN 0.576-0.625x at M = 131072, prefill 0.767-0.773x, 182-190 tokens/ms).
# Binaries ($TAR): head/ (twell of build-cuda, stripped, COMMIT). With carry ["out"]:
# `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s56/bench.sh`.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-450} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { nvidia-smi --query-gpu=name --format=csv; echo "not an H200: nothing run"; exit 0; }
NAME=${NAME:-s56_bench}
tar xJf ${TAR:-out/b31.tar.xz} -C out
B=$PWD/out/head
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/$NAME; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz $NAME); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 170) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E "^(16384|131072) .*(0.50|1.00)% .* twell  |^rc" $O/ffn.txt; save
timeout $(left 230) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
