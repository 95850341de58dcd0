#!/bin/bash
# Session 39, call 9 (0ac2180: cuBLASLt's autotune at a problem's second call): the GPU suite; `twell run`'s
# time to the first token at 2047 and 2049 tokens (with the autotune on, its default); twell.Model generate
# of new and repeated prompt lengths; bench ffn at M = 16384 (timed on the GPU: the tuning happens in the
# checked call, not under the timing hold); bench model prefill and decode at 1 and 8.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/lazy_tune; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp out/run165.sh $O/run.sh
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
M=/tmp/m4; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 4)" 2>&1 | tail -3
ts ttft
for n in 2046 2048; do
  P=$($PY -c "print('a' * $n)")
  timeout 120 $B/twell run $M --byte-tokenizer --device cuda -p "$P" -n 8 --no-stop 2>&1 >/dev/null | tail -1
done | tee $O/twell_run.txt
TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python'); import twell
m = twell.Model('$M', device='cuda', context=2304, tokenizer=None)
for n in (2047, 2049, 2049, 100, 100, 101):
    m.generate([5] * n, max_new_tokens=8, stop=False)
    print(f'generate, prompt {n}: prefill {m.last_generation[\"prefill_seconds\"]*1000:.1f} ms, decode {m.last_generation[\"tokens_per_second\"]:.0f} tokens/s')
" 2>&1 | tail -6 | tee $O/python_ttft.txt
ts bench ffn
$B/twell bench ffn -M 16384 -d 0.005 --distribution uniform --json $O/ffn.json > $O/ffn.txt 2>&1; grep -E " twell |dense_cublas|synchronised" $O/ffn.txt | head
ts bench model
$B/twell bench model --iters 4 --decode-batch 1,8 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_prefill|model_decode" $O/model.txt | head
ts done
