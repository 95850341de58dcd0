#!/bin/bash
# Session 31, call 2: model item 31 (the attention's residual add deferred to the norm after the
# FFN: the f32 residual written once a layer) and the bench CLI fixes. The GPU suite (with the new
# bitwise test), the CLI tests, memcheck of the new test; prefill A/B alternated twice (default
# against --eager-residual-add, the same binary); a small bench ffn.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/item31; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf item31.tar.xz item31 && rm -rf item31); }
trap finish EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv > $O/gpu.txt 2>&1
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -30
[ $rc = 0 ] || exit 1
ts cli tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 --gtest_filter='CliModel*:InspectCli*:LlamaLoad*:LlamaSampling*:Cli.*:LoadTokenizer*:BenchFfn*:BenchModel*' > $O/cli_tests_gpu.log 2>&1; echo "rc $?" >> $O/cli_tests_gpu.log; tail -3 $O/cli_tests_gpu.log
for r in 1 2; do for v in new eager; do
  ts model $v $r
  flag=""; [ $v = eager ] && flag="--eager-residual-add"
  $B/twell bench model --no-decode --iters 6 $flag --json $O/model_${v}_$r.json > $O/model_${v}_$r.txt 2>&1; grep -E "model_prefill|rel err" $O/model_${v}_$r.txt
done; done
ts memcheck
timeout 90 compute-sanitizer --tool memcheck $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='LlamaCuda.DeferredResidualAddKeepsTheBits' > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -3 $O/memcheck.log
ts done
