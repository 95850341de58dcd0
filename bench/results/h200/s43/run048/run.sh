#!/bin/bash
# Session 43, the fit's last change: LoadModel tests, eval at 4.6G (one window a call, taken as --batch 1 is).
set -u
cd "$(dirname "$0")/.."
tar xJf out/b7.tar.xz -C out
B=$PWD/out/n2
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s43d; mkdir -p $O
cp "$0" $O/run.sh
{
$B/twell_gpu_tests --gtest_brief=1 --gtest_filter='LoadModel.*:LlamaCuda.NextToken*' 2>&1 | grep -E "FAILED|PASSED|Failure|Which is|Expected|test_llama" | head -20
$B/twell bench model --no-decode --batch 8 --iters 1 --warmup 0 --save /tmp/sp 2>&1 | tail -1
python3 -c "import random,sys; random.seed(1); sys.stdout.buffer.write(bytes(random.getrandbits(8) for _ in range(65536)))" > /tmp/rand.bin
for cap in 4.4G 4.6G; do
  echo "== --gpu-memory $cap, context 2048"
  $B/twell eval /tmp/sp /tmp/rand.bin --byte-tokenizer --device cuda --context 2048 --gpu-memory $cap --max-windows 8 2>&1 | grep -vE '^\[|windows, perplexity so far|UTF-8' | tail -5
done
} > $O/check.txt 2>&1; cat $O/check.txt
