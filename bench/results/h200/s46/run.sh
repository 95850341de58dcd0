#!/bin/bash
# The checks pending since session 44 (no GPU was lent in sessions 44-46; this script replaces
# s44/pending/run.sh), in order of importance and within one deadline, then session 46's additions:
# - the whole GPU suite (session 44: LanguageModel::sequences_a_forward and batched ffn_stats_in_windows,
#   memory_overlaps by strides, TWELL_REQUIRE messages, decode_step's message; session 45: FfnForward's
#   precision check and optional gradients with a shape but no data, the C API's no-element tensors with
#   NULL data);
# - Python, with twell.FFN as custom operators (session 46), compiled by torch.compile on the GPU;
# - python/examples/train_sparse.py at its GPU defaults (session 46);
# - examples/generate on the GPU, then `bench model --save` of the calibrated sparse 2B model and Python's
#   ffn_stats on it with one window a forward against 8. Prediction (session 44, before any run):
#   max_batch 8 takes 5-15% less time than 1 (eval --sparsity's batched windows took 0.94 s against
#   1.02 s in s43/run046), the same counts to ~1e-3.
# Binaries: a build with no C++ change since 84ddeb3, tarred as earlier runs did:
#   mkdir -p out/n2 && cp build-cuda/twell build-cuda/tests/twell_gpu_tests \
#     build-cuda/tests/install_example/build-generate/generate out/n2/ && cp -L build-cuda/libtwell_c.so out/n2/ \
#     && strip out/n2/* && tar cJf out/b9.tar.xz -C out n2
# then on the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s46/run.sh` (default 560).
# Everything is tarred into one file at the end (the device returns at most eight).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s46; mkdir -p $O; cp "$0" $O/run.sh
timeout $(left 180) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
TWELL_LIBRARY=$B/libtwell_c.so timeout $(left 240) $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head
TWELL_LIBRARY=$B/libtwell_c.so timeout $(left 150) $PY python/examples/train_sparse.py --out /tmp/train_out \
  > $O/train.txt 2>&1; echo "rc $?" >> $O/train.txt; grep -v "Writing model" $O/train.txt | tail -6
cp /tmp/train_out/train_log.json /tmp/train_out/train.png $O/ 2>/dev/null
timeout $(left 30) $B/generate > $O/generate_example.txt 2>&1; echo "rc $?" >> $O/generate_example.txt
tail -3 $O/generate_example.txt
timeout $(left 90) $B/twell bench model --no-decode --batch 8 --iters 3 --save /tmp/sp > $O/bench_model_save.txt 2>&1
echo "rc $?" >> $O/bench_model_save.txt; tail -3 $O/bench_model_save.txt
python3 -c "import random,sys; random.seed(1); sys.stdout.buffer.write(bytes(random.getrandbits(8) for _ in range(65536)))" \
  > /tmp/rand.bin
TWELL_LIBRARY=$B/libtwell_c.so timeout $(left 150) $PY - > $O/ffn_stats_py.txt 2>&1 <<'PY'
import time, twell
data = open("/tmp/rand.bin", "rb").read()
for mb in (1, 8):
    m = twell.Model("/tmp/sp", device="cuda", tokenizer="bytes", context=2048, max_batch=mb, kv_cache=False)
    for rep in range(3):
        t = time.time(); s = m.ffn_stats(data, context=2048); dt = time.time() - t
        print(f"max_batch {mb} run {rep}: {dt:.3f} s, layer 0 {s[0]['tokens']} tokens "
              f"{s[0]['nnz_per_token']:.3f} nnz/token, layer 37 {s[37]['nnz_per_token']:.3f}", flush=True)
    del m
PY
tail -7 $O/ffn_stats_py.txt
cd $OUT && tar cJf results.tar.xz s46 && rm -rf s46
