#!/bin/bash
# Session 42, second call (build c548615): the GPU suite (the fixed BadCalls test; dense_h and grow() refactors), Python,
# and eval with and without --sparsity at one context.
set -u
cd "$(dirname "$0")/.."
tar xJf out/b2.tar.xz -C out
B=$PWD/out/n2
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
PY=/opt/torch/.venv/bin/python
O=$OUT/s42b; mkdir -p $O
cp "$0" $O/run.sh
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log; tail -4 $O/gpu_tests.log; grep -B2 -A10 Failure $O/gpu_tests.log | head -30
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; tail -3 $O/python_tests.log
M=/tmp/m4; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 4)" 2>&1 | tail -3
$PY -c "import random; random.seed(1); print(''.join(random.choice('abcdefgh ') for _ in range(65536)))" > /tmp/text.txt
for ctx in 2048 4096; do for s in "" "--sparsity"; do for rep in 1 2; do
  echo "context $ctx $s (rep $rep): $($B/twell eval $M /tmp/text.txt --byte-tokenizer --device cuda --context $ctx $s --json $O/eval_${ctx}${s:+_sparsity}.json 2>&1 | grep -E 'scored in|perplexity' | tr '\n' ' ')"
done; done; done | tee $O/eval_timing.txt
