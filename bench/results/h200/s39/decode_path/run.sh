#!/bin/bash
# Session 39, call 3 (the decode FFN path from the prefill's density, small calls sampled): the whole GPU
# suite; twell bench model with decode batches 1, 2, 4, 8 and 64 (the calibrated sparse model: the gather
# path must stay at 2-8); batched generation on the random (not sparse) 38-layer model; bench ffn at
# M = 2048 (dense by its token count, now sampled) and 16384.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/decode_path; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp out/run159.sh $O/run.sh
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts memcheck
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='*DecodeBatchesOfADenseModel*' > $O/sanitizer_memcheck.log 2>&1; echo "rc $?" >> $O/sanitizer_memcheck.log; grep -E "PASSED|FAILED|ERROR SUMMARY|rc " $O/sanitizer_memcheck.log
ts bench model
$B/twell bench model --iters 6 --decode-batch 1,2,4,8,64 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_prefill|model_decode|rel err" $O/model.txt | head -20
ts bench ffn
$B/twell bench ffn -M 2048 -M 16384 -d 0.005 -d 0.5 --distribution uniform --json $O/ffn.json > $O/ffn.txt 2>&1; grep -E "twell |dense_cublas" $O/ffn.txt | head -20
M=/tmp/m38; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 38)" 2>&1 | tail -3
ts probe 38 layers
TWELL_LIBRARY=$B/libtwell_c.so timeout 240 $PY bench/results/h200/s39/batch/probe.py $M > $O/batch_38.json 2> $O/batch_38.err; tail -8 $O/batch_38.err
ts done
