#!/bin/bash
# Session 39, call 7 (eb76389: decode_gather_tokens 32, B x density <= 0.25): the GPU suite; twell bench
# model decode batches 1 to 64 (twell takes the gather FFN up to 32); batched generation on the random
# 4-layer model (not sparse: dense at B >= 2).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/gather32; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp out/run163.sh $O/run.sh
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts bench model
$B/twell bench model --no-prefill --decode-batch 1,2,8,16,32,64 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_decode|error" $O/model.txt | head -20
M=/tmp/m4; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 4)" 2>&1 | tail -3
ts probe 4 layers
TWELL_LIBRARY=$B/libtwell_c.so timeout 200 $PY bench/results/h200/s39/batch/probe.py $M > $O/batch_4.json 2> $O/batch_4.err; tail -8 $O/batch_4.err
ts done
