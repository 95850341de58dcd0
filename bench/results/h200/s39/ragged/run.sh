#!/bin/bash
# Session 39, call 1 (ragged batches: per-sequence positions p0[b] in the RoPE/attention kernels, the
# ragged prefill's last rows gathered, kNoToken steps): the attention, QKV and LlamaCuda tests; memcheck
# of the ragged tests; the model bench (prefill and decode, unchanged paths); the whole GPU suite.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/ragged; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp out/run157.sh $O/run.sh
ts targeted tests
$B/twell_gpu_tests --gtest_filter='*Attention*:QkvRope*:LlamaCuda*:CudnnSdpa*' > $O/targeted_tests.log 2>&1; echo "rc $?" >> $O/targeted_tests.log; tail -3 $O/targeted_tests.log; grep -B3 -A15 "Failure" $O/targeted_tests.log | head -60
ts memcheck
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='LlamaCudaShapes.RaggedBatch*/0:DecodeAttention.MatchesRope*:PrefillAttention.*stagger*' > $O/sanitizer_memcheck.log 2>&1; echo "rc $?" >> $O/sanitizer_memcheck.log; tail -3 $O/sanitizer_memcheck.log
ts bench model
$B/twell bench model --iters 6 --json $O/model.json > $O/model.txt 2>&1; grep -E "model_prefill|model_decode|rel err" $O/model.txt | head -20
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts done
