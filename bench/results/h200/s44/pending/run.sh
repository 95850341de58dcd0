#!/bin/bash
# Session 44's checks, not run: no GPU was lent that session, nor the forty-fifth. The next session
# runs them first, on a build of its first commit (the code of both sessions), binaries tarred as the
# earlier runs did:
#   mkdir -p out/n2 && cp build-cuda/twell build-cuda/tests/twell_gpu_tests \
#     build-cuda/tests/install_example/build-generate/generate out/n2/ && cp -L build-cuda/libtwell_c.so out/n2/ \
#     && strip out/n2/* && tar cJf out/b9.tar.xz -C out n2
# then the device runs `bash bench/results/h200/s44/pending/run.sh` with carry ["out"].
# What it checks: the whole GPU suite (session 44: LanguageModel::sequences_a_forward and batched
# ffn_stats_in_windows, memory_overlaps by strides, TWELL_REQUIRE messages, decode_step's message;
# session 45: FfnForward's precision check and optional gradients with a shape but no data, the C
# API's no-element tensors with NULL data, twell.FFN's size checks and dtypes under PyTorch),
# Python, examples/generate on the GPU (perplexity before generating: the GPU keeps a generation in
# its KV cache), and Python's ffn_stats on the calibrated sparse 2B model with one window a forward
# against 8. Prediction written before it ran: max_batch 8 takes 5–15% less time than 1 (eval
# --sparsity's batched windows took 0.94 s against 1.02 s in s43/run046), the same counts to ~1e-3.
set -u
cd "$(dirname "$0")/../../../../.."
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s44; mkdir -p $O
cp "$0" $O/run.sh
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log
grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -40
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 /opt/torch/.venv/bin/python -m unittest discover -s python/tests \
  > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; tail -3 $O/python_tests.log
$B/generate > $O/generate_example.txt 2>&1; echo "rc $?" >> $O/generate_example.txt; cat $O/generate_example.txt
$B/twell bench model --no-decode --batch 8 --iters 3 --save /tmp/sp > $O/bench_model_save.txt 2>&1
tail -4 $O/bench_model_save.txt
python3 -c "import random,sys; random.seed(1); sys.stdout.buffer.write(bytes(random.getrandbits(8) for _ in range(65536)))" \
  > /tmp/rand.bin
TWELL_LIBRARY=$B/libtwell_c.so timeout 240 /opt/torch/.venv/bin/python - > $O/ffn_stats_py.txt 2>&1 <<'PY'
import time, twell
data = open("/tmp/rand.bin", "rb").read()
for mb in (1, 8):
    m = twell.Model("/tmp/sp", device="cuda", tokenizer="bytes", context=2048, max_batch=mb, kv_cache=False)
    for rep in range(3):
        t = time.time(); s = m.ffn_stats(data, context=2048); dt = time.time() - t
        print(f"max_batch {mb} run {rep}: {dt:.3f} s, layer 0 {s[0]['tokens']} tokens "
              f"{s[0]['nnz_per_token']:.3f} nnz/token, layer 37 {s[37]['nnz_per_token']:.3f}")
    del m
PY
tail -8 $O/ffn_stats_py.txt
