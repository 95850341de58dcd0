#!/bin/bash
# Session 43: the batched eval windows, FFN statistics in pieces, the no-cache fit (GPU tests, memcheck); a
# calibrated sparse 2B model saved by `bench model --save`, then `twell eval` on it: --batch 1 against the
# default batch, --sparsity, and under --gpu-memory caps.
set -u
cd "$(dirname "$0")/.."
tar xJf out/b5.tar.xz -C out
B=$PWD/out/n2
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s43b; mkdir -p $O
cp "$0" $O/run.sh
{
$B/twell_gpu_tests --gtest_brief=1 --gtest_filter='LlamaCuda.FfnStatistics*:LoadModel.*:LlamaCuda.BadCalls*:LlamaCuda.NextToken*' 2>&1 | grep -E "FAILED|PASSED|Failure|Which is|Expected|Value of|trace|test_llama|error" | head -40
compute-sanitizer --tool memcheck --print-limit 5 $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='LlamaCuda.NextTokenNllBatch*' 2>&1 | tail -3
} > $O/tests.log 2>&1; cat $O/tests.log
$B/twell bench model --no-decode --batch 8 --iters 5 --save /tmp/sp > $O/bench_save.txt 2>&1; tail -5 $O/bench_save.txt
python3 -c "import random,sys; random.seed(1); sys.stdout.buffer.write(bytes(random.getrandbits(8) for _ in range(65536)))" > /tmp/rand.bin
E="$B/twell eval /tmp/sp /tmp/rand.bin --byte-tokenizer --device cuda"
{
for ctx in 2048 1024; do for b in "--batch 1" ""; do for rep in 1 2; do
  echo "context $ctx ${b:-default batch} rep $rep: $($E --context $ctx $b --json $O/e_${ctx}_${b:+b1}.json 2>&1 | grep -E 'scored in|perplexity [0-9]' | tr '\n' ' ')"
done; done; done
for b in "--batch 1" ""; do
  echo "context 2048 --sparsity ${b:-default batch}: $($E --context 2048 $b --sparsity --json $O/e_sparsity${b:+_b1}.json 2>&1 | grep -E 'scored in|^mean' | tr '\n' ' ')"
done
for cap in 4.6G 5G 6G 8G; do
  echo "== --gpu-memory $cap, context 2048"
  $E --context 2048 --gpu-memory $cap --max-windows 16 2>&1 | grep -vE '^\[|windows, perplexity so far|UTF-8' | tail -5
done
} > $O/eval.txt 2>&1; cat $O/eval.txt
TWELL_LIBRARY=$B/libtwell_c.so timeout 200 /opt/torch/.venv/bin/python -m unittest discover -s python/tests > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; tail -3 $O/python_tests.log
