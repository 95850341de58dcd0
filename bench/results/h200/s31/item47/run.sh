#!/bin/bash
# Session 31, call 1: FFN item 47 (two k-blocks of wgmma in flight in the ping-pong mainloop,
# sm90::DeepMainloop): the micro with its d2 variants; the gate/QKV/FFN/model GPU tests with
# TWELL_MMA_IN_FLIGHT=2; prefill and FFN A/B (env 1 against 2, alternated); then the whole GPU
# suite and the CLI tests on the default (CUTLASS's mainloop: HEAD's kernels).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/item47; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf item47.tar.xz item47 && rm -rf item47); }
trap finish EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv > $O/gpu.txt 2>&1
ts micro
timeout 150 $B/twell_micro_gate_tiles > $O/gate_tiles.txt 2>&1; echo "rc $?" >> $O/gate_tiles.txt; cat $O/gate_tiles.txt | tail -32
ts tests d2
TWELL_MMA_IN_FLIGHT=2 $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='*QkvRope*:*GatePack*:*FfnForwardGpu*:*LlamaCuda*:*TwellDevice*' > $O/tests_d2.log 2>&1; rc=$?; echo "rc $rc" >> $O/tests_d2.log; tail -3 $O/tests_d2.log
grep -B3 -A12 "Failure" $O/tests_d2.log | head -30
[ $rc = 0 ] || exit 1
for r in 1 2; do for v in 2 1; do
  ts model $v $r
  TWELL_MMA_IN_FLIGHT=$v $B/twell bench model --no-decode --iters 6 --json $O/model_d${v}_$r.json > $O/model_d${v}_$r.txt 2>&1; grep model_prefill $O/model_d${v}_$r.txt
done; done
for v in 2 1; do
  ts ffn $v
  TWELL_MMA_IN_FLIGHT=$v $B/twell bench ffn --backend cuda -M 131072 -M 16384 -d 0.005 --json $O/ffn_d$v.json > $O/ffn_d$v.txt 2>&1; grep -E "^ *(131072|16384) " $O/ffn_d$v.txt
done
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -20
ts cli tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 --gtest_filter='CliModel*:InspectCli*:LlamaLoad*:LlamaSampling*:Cli.*:LoadTokenizer*:BenchFfn*' > $O/cli_tests_gpu.log 2>&1; echo "rc $?" >> $O/cli_tests_gpu.log; tail -3 $O/cli_tests_gpu.log
ts done
