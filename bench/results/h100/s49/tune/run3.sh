#!/bin/bash
# Forty-ninth session: (1) the corrected BenchModel.APhaseThatCannotFitIsRefusedFirst and the other BenchModel
# tests; (2) an experiment: decode steps at batch 16 and 64 with cuBLASLt's autotune for every problem
# (kMinTuneFlops = 0 in out/n2/twell_tune_all, built from this commit with that one constant changed) against
# the default (no tune under 2.1 GFLOP: every decode GEMM at batch <= 64 takes the heuristics' first), run in
# turn twice. Prediction: the M = 64 GEMMs run at ~2.0 TB/s (s49/decode); a tuned tile shape or split-K could
# reach ~2.6, ~0.3 ms of a 6.5 ms step in both models, unless the tune's choice (timed on L2-hot operands)
# does worse on weights read from HBM.
# Binaries: out/b9.tar.xz. On the device, with carry ["out"]: `bash bench/results/h200/s49/run3.sh`.
set -u
cd "$(dirname "$0")/../../../.."
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s49t; mkdir -p $O; cp "$0" $O/; cp $B/COMMIT $O/
nvidia-smi --query-gpu=name --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout 200 $B/twell_gpu_tests --gtest_filter='BenchModel.*' > $O/bench_model_tests.log 2>&1; echo "rc $?" >> $O/bench_model_tests.log
grep -E "^\[  (PASSED|FAILED)|Failure|rc " -A3 $O/bench_model_tests.log | head -20
for round in 1 2; do
  for bin in twell twell_tune_all; do
    timeout 150 $B/$bin bench model --no-prefill --decode-batch 16,64 --gather-batches 1 --steps 64 \
      --json $O/${bin}_$round.json > $O/${bin}_$round.txt 2> $O/${bin}_$round.log
    echo "$bin round $round rc $?"; grep "decode batch" $O/${bin}_$round.log
  done
done
cd $OUT && tar cJf tune.tar.xz s49t && rm -rf s49t
