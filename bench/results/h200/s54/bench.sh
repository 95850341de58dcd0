#!/bin/bash
# Fifty-fourth session: the standard runs of the last build (fe2daa4, as `h100/s53_5/`), only where the device is an
# H200 (the issues' targets are H200 figures; every run since the forty-seventh session got an H100). On any other
# board it stops after nvidia-smi. Kernels unchanged since the thirty-ninth session: predicted within the H200 spread
# of perf.md's top table (0.576-0.625x at M = 131072, 0.618-0.654x at 16384, 0.805-0.838x at 1%; prefill
# 0.767-0.773x, 182-190 tokens/ms).
# Binaries (out/b19.tar.xz): head/ (twell, twell_gpu_tests of build-cuda, stripped, COMMIT).
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s54/bench.sh` (default 500).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-500} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
O=$OUT/s54_bench; mkdir -p $O
save() { (cd $OUT && tar cJf results.tar.xz s54_bench); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
grep -q H200 $O/gpu.txt || { echo "not an H200: stopped"; exit 0; }
tar xJf out/b19.tar.xz -C out
B=$PWD/out/head; cp $B/COMMIT $O/COMMIT
timeout $(left 150) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
timeout $(left 150) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E "^(16384|131072) .*(0.50|1.00)% .* twell  |^rc" $O/ffn.txt; save
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
