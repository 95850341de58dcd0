#!/bin/bash
# Written in session 40, not yet run (the device was withdrawn); for the next session, on the build of its last
# commit (bff6f1b..: the review fixes; `twell bench model --ragged`; automatic attention takes cuDNN
# from a shape's second call): the changed tests, memcheck of the sparse-model ragged test, Python, the GPU
# suite; the ragged prefill bench (new binary, and the binary before the attention rule: old_twell);
# twell run's first token at 2049 tokens (new and old); the standard prefill bench (cuDNN at its first call).
# Session 41 added the chunked prefill (LongPromptsRunInChunksOfMaxTokens in the filters; `bench model --long`) and
# perplexity reduced on the GPU (NextTokenNll*; `twell eval` timed, new against old). Session 42 added the
# activations fitted to the GPU memory given (LoadModel.FitsTheActivationsToTheGpuMemoryGiven) and FFN statistics on the
# GPU (FfnStatisticsCountWhatTheCpuCounts, under memcheck too; `twell eval --sparsity` on the GPU).
# Use: as out/runNNN.sh beside out/bins.tar.xz, whose new/ holds twell, twell_gpu_tests, twell_tests,
# libtwell_c.so of the build to check and old_twell (twell built at 9eb5986, before the attention rule; session 42
# left it stripped in the working tree's ignored build-old/old_twell_9eb5986, and out/bins.tar.xz + out/run043.sh
# ready for its last commit: rebuild new/ if anything changed since).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
PY=/opt/torch/.venv/bin/python
O=$OUT/review; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
cp "$0" $O/run.sh
ts changed tests
$B/twell_gpu_tests --gtest_filter='*Ragged*:*FollowsEachPrefillsDensity*:*AutomaticAttention*:*Cudnn*:*InChunks*:*NextTokenNll*:*ALongPrompt*:*LoadModel*:*FfnStatistics*:*RowActivationStats*' 2>&1 | grep -E "OK \]|FAIL|Failure|Expected|Which|step|sequence|attention" | head -30
ts memcheck
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 $B/twell_gpu_tests --gtest_filter='*SparseFfnOfASparseModel*:*InChunks*:*NextTokenNll*:*FfnStatistics*' > $O/sanitizer_memcheck.log 2>&1; echo "rc $?" >> $O/sanitizer_memcheck.log; grep -E "PASSED|FAILED|ERROR SUMMARY|rc " $O/sanitizer_memcheck.log
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
for v in new old; do
  T=$B/twell; [ $v = old ] && T=$B/old_twell
  ts ragged 64 $v
  $T bench model --no-prefill --no-decode --ragged 64 --iters 10 --json $O/ragged64_$v.json > $O/ragged64_$v.txt 2>&1; grep -E "ragged prefill of|model_ragged|rror" $O/ragged64_$v.txt | head
done
ts ragged 16
$B/twell bench model --no-prefill --no-decode --ragged 16 --iters 10 --json $O/ragged16.json > $O/ragged16.txt 2>&1; grep -E "ragged prefill of|model_ragged|rror" $O/ragged16.txt | head
M=/tmp/m4; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 4)" 2>&1 | tail -3
ts ttft
for v in new old new old; do
  T=$B/twell; [ $v = old ] && T=$B/old_twell
  P=$($PY -c "print('a' * 2048)")
  echo "$v: $(timeout 120 $T run $M --byte-tokenizer --device cuda -p "$P" -n 8 --no-stop 2>&1 >/dev/null | tail -1)"
done | tee $O/twell_run.txt
ts eval
$PY -c "import random; random.seed(1); print(''.join(random.choice('abcdefgh ') for _ in range(65536)))" > /tmp/text.txt
for v in new old; do
  T=$B/twell; [ $v = old ] && T=$B/old_twell
  s0=$(date +%s%N); out=$(timeout 300 $T eval $M /tmp/text.txt --byte-tokenizer --device cuda 2>/dev/null | tail -1)
  echo "$v: $out ($(( ($(date +%s%N) - s0) / 1000000 )) ms)"
done | tee $O/eval.txt
timeout 300 $B/twell eval $M /tmp/text.txt --byte-tokenizer --device cuda --context 2048 --stride 512 2>&1 | tail -2 | tee -a $O/eval.txt
timeout 300 $B/twell eval $M /tmp/text.txt --byte-tokenizer --device cuda --context 2048 --sparsity 2>&1 | tail -9 | tee -a $O/eval.txt
ts long prompt
$B/twell bench model --no-prefill --no-decode --long 20000 --iters 6 --json $O/long.json > $O/long.txt 2>&1; grep -E "long prompt of|model_long|rror" $O/long.txt | head
ts bench model prefill
$B/twell bench model --no-decode --iters 6 --json $O/model.json > $O/model.txt 2>&1; grep -E "prefill attention|model_prefill" $O/model.txt | head
ts done
