#!/bin/bash
# Session 43, last build: the whole GPU suite, Python under PyTorch, and eval under a memory cap (the
# review's fit fixes: notes, headroom).
set -u
cd "$(dirname "$0")/.."
tar xJf out/b6.tar.xz -C out
B=$PWD/out/n2
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s43c; mkdir -p $O
cp "$0" $O/run.sh
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -40
TWELL_LIBRARY=$B/libtwell_c.so timeout 200 /opt/torch/.venv/bin/python -m unittest discover -s python/tests > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; tail -3 $O/python_tests.log
$B/twell bench model --no-decode --batch 8 --iters 3 --save /tmp/sp > /tmp/bs.txt 2>&1; tail -2 /tmp/bs.txt
python3 -c "import random,sys; random.seed(1); sys.stdout.buffer.write(bytes(random.getrandbits(8) for _ in range(65536)))" > /tmp/rand.bin
{
for cap in 4.5G 4.6G 5G; do
  echo "== --gpu-memory $cap, context 2048"
  $B/twell eval /tmp/sp /tmp/rand.bin --byte-tokenizer --device cuda --context 2048 --gpu-memory $cap --max-windows 16 --sparsity 2>&1 | grep -vE '^\[|windows, perplexity so far|UTF-8|^ *[0-9]+ ' | tail -7
done
echo "== default, all windows, --sparsity"
$B/twell eval /tmp/sp /tmp/rand.bin --byte-tokenizer --device cuda --context 2048 --sparsity 2>&1 | grep -E 'scored in|^mean|over'
} > $O/eval_caps.txt 2>&1; cat $O/eval_caps.txt
