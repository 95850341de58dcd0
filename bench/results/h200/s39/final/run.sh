#!/bin/bash
# Session 39, call 4 (HEAD: small calls sample the density once a slot): the whole GPU suite; the Python
# tests; bench ffn at M = 2048 and 16384 (dispatch's overhead back at ~1.00x); twell bench model with
# decode batches 1, 2, 4, 8, 64; batched generation on the random 38-layer model; twell_tests on the GPU.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/final; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp out/run160.sh $O/run.sh
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head
ts bench ffn
$B/twell bench ffn -M 2048 -M 16384 -d 0.005 -d 0.5 --json $O/ffn.json > $O/ffn.txt 2>&1; grep -E " twell |dense_cublas" $O/ffn.txt | head -20
ts bench model
$B/twell bench model --iters 6 --decode-batch 1,2,4,8,64 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_prefill|model_decode" $O/model.txt | head -20
M=/tmp/m38; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 38)" 2>&1 | tail -3
ts probe 38 layers
TWELL_LIBRARY=$B/libtwell_c.so timeout 240 $PY bench/results/h200/s39/batch/probe.py $M > $O/batch_38.json 2> $O/batch_38.err; tail -8 $O/batch_38.err
rm -rf $M
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts done
