#!/bin/bash
# Session 40, call 1 (3c4a2fd: tuning per first B operand, 256th-call fallback): the GPU suite; `twell run` at 2047 / 2049
# tokens; twell bench model decode at 1, 8 and 64 (no prefill).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/validate; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp out/run167.sh $O/run.sh
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
ts bench model
$B/twell bench model --no-prefill --decode-batch 1,8,64 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_decode" $O/model.txt | head
ts done
ts python
(cd python && TWELL_LIBRARY=$B/libtwell_c.so $PY -m unittest discover -s tests > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log); tail -3 $O/python_tests.log
ts done2
