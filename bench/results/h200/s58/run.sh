#!/bin/bash
# Fifty-eighth session: prefix reuse (LanguageModel::prefill_from, PromptCache; `twell run --chat`'s
# conversation, the C API's twell_model_set_prefix_reuse, Python's generate(reuse_cache=True)). On the device:
#  1. the GPU suite (predicted 199/199, LlamaCuda.PrefillFromAKeptPrefixMatchesCpu new);
#  2. memcheck of that test (predicted 0 errors);
#  3. the Python tests on the GPU (predicted all pass);
#  4. reuse.py: a conversation's second turn on a random model of the 2B model's widths (8 layers, context
#     8192): the time to its first token with and without reuse (predicted: without, a prefill of ~4000
#     tokens, ~10 ms; with, ~20 new tokens after 4000 cached, ~1 ms) and the tokens the same both ways (greedy);
#     `twell run --chat` on that model with a conversation on stdin: each turn's timing line.
#  5. only on an H200: `twell bench ffn` and `twell bench model` (kernels unchanged since the thirty-ninth session).
# Binaries ($TAR): head/ (twell, twell_gpu_tests, libtwell_c.so of build-cuda, stripped, COMMIT).
# On the device, with carry ["out"]: `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s58/run.sh`.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-500} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
NAME=${NAME:-s58}
tar xJf ${TAR:-out/b41.tar.xz} -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/$NAME; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz $NAME); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
if [ -z "${SKIP_SUITE:-}" ]; then
timeout $(left 170) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
timeout $(left 90) compute-sanitizer --tool memcheck $B/twell_gpu_tests --gtest_filter='LlamaCuda.PrefillFrom*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -4 $O/memcheck.log; save
timeout $(left 100) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head; save
fi
M=/tmp/twell_reuse_model
timeout $(left 200) $PY bench/results/h200/s58/reuse.py $M tests/model/data/bpe_gpt2.json > $O/reuse.log 2>&1
echo "rc $?" >> $O/reuse.log; cat $O/reuse.log; save
rm -rf $M
grep -q H200 $O/gpu.txt || { echo "not an H200: the standard benches are not run"; exit 0; }
timeout $(left 150) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E "^(16384|131072) .*(0.50|1.00)% .* twell  |^rc" $O/ffn.txt; save
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
