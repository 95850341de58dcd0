#!/bin/bash
# Session 39, call 5 (ab6d320: the review's fixes to the decode FFN choice): the whole GPU suite; memcheck of
# the ragged and dense-model decode tests; the Python tests; twell bench model decode batches 1, 2, 4, 8 (the
# sparse model keeps the gather path) and bench ffn at M = 2048 (dispatch's overhead).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/review2; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp out/run161.sh $O/run.sh
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts memcheck
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='*RaggedBatchEqualsSingleSequences/hd16_gqa_relu:*DecodeBatchesOfADenseModel*' > $O/sanitizer_memcheck.log 2>&1; echo "rc $?" >> $O/sanitizer_memcheck.log; grep -E "PASSED|FAILED|ERROR SUMMARY|rc " $O/sanitizer_memcheck.log
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head
ts bench model
$B/twell bench model --no-prefill --decode-batch 1,2,4,8 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_decode" $O/model.txt | head
ts bench ffn
$B/twell bench ffn -M 2048 -d 0.005 -d 0.5 --json $O/ffn.json > $O/ffn.txt 2>&1; grep -E " twell |dense_cublas" $O/ffn.txt | head
ts done
