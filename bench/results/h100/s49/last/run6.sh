#!/bin/bash
# Forty-ninth session's last call, on an H200 if one starts: the headline figures of this build (no kernel
# changed since the thirty-ninth session; the operands' memory checks added) and the GPU tests of the FFN's
# C API (the checks' refusals) and of its objects.
# Predicted: bench ffn 0.576-0.593x uniform, 0.605-0.625x skewed at M = 131072 (0.5%), 0.62-0.65x at 16384;
# prefill 0.767-0.773x, 182-190 tokens/ms (the H200 runs of sessions 31-39).
# Binaries: out/b9.tar.xz. On the device, with carry ["out"]: `bash bench/results/h200/s49/run6.sh`.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-200} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s49h; mkdir -p $O; cp "$0" $O/; cp $B/COMMIT $O/
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 60) $B/twell bench ffn --backend cuda -M 16384 -M 131072 -d 0.005 --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; cat $O/ffn.txt
timeout $(left 90) $B/twell bench model --no-decode --iters 5 --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
timeout $(left 40) $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='CApiGpu.*:FfnForward*' > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log
cd $OUT && tar cJf h200.tar.xz s49h && rm -rf s49h
