#!/usr/bin/env bash
# Session 26, FFN item 41: the register-epilogue GEMMs (gate+pack, QKV+RoPE) as CUTLASS's cooperative kernel (128 x 256) against ping-pong (64 x 256 a warpgroup).
set -uo pipefail
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
(cd out && tar xJf bins.tar.xz)
B=$PWD/out/new
$B/twell_gpu_tests_coop --gtest_brief=1 --gtest_filter='*GatePack*:*QkvRope*:Cases/FfnForwardGpu.*M7_*:Cases/FfnForwardGpu.*M33_*:*Determinism*:FfnForwardGpuEdges.*' > $OUT/coop_tests.log 2>&1; echo "coop tests rc=$?"; tail -2 $OUT/coop_tests.log; grep -E 'FAILED|Failure' $OUT/coop_tests.log | head -5
for r in 1 2; do for v in pp coop; do
  $B/twell_$v bench ffn --backend cuda -M 16384 -M 131072 -d 0.005 --iters 10 > $OUT/ffn_${v}_$r.txt 2>/dev/null; echo "$v $r rc=$?"; grep -E ' twell ' $OUT/ffn_${v}_$r.txt
done; done
for v in pp coop; do
  $B/twell_$v bench model --no-decode --iters 3 --warmup 1 > $OUT/model_${v}.txt 2>/dev/null; echo "$v model rc=$?"; grep model_prefill $OUT/model_${v}.txt
done
