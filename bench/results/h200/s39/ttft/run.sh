#!/bin/bash
# Session 39, call 8: where `twell run`'s "prompt N tokens in X s" goes on the random 4-layer model (the
# prefill itself is ~3 ms): prompts of 2047 (twell's attention) and 2049 tokens (cuDNN's), with and
# without the cuBLASLt autotune, and twice in one process (Python: the second generate has every plan).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
PY=/opt/torch/.venv/bin/python
O=$OUT/ttft; mkdir -p $O
cp out/run164.sh $O/run.sh
M=/tmp/m4; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 4)" 2>&1 | tail -3
for n in 2046 2048; do
  P=$($PY -c "print('a' * $n)")
  for tune in 1 0; do
    echo "== prompt $((n + 1)) tokens, TWELL_LT_AUTOTUNE=$tune"
    TWELL_LT_AUTOTUNE=$tune timeout 120 $B/twell run $M --byte-tokenizer --device cuda -p "$P" -n 8 --no-stop 2>&1 >/dev/null | tail -1
  done
done
TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys, time; sys.path.insert(0, 'python'); import twell
m = twell.Model('$M', device='cuda', context=2304, tokenizer=None)
for n in (2047, 2049, 2049, 100, 100):
    m.generate([5] * n, max_new_tokens=8, stop=False)
    g = m.last_generation
    print(f'generate, prompt {n}: prefill {g[\"prefill_seconds\"]*1000:.1f} ms')
" 2>&1 | tail -6
