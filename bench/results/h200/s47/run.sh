#!/bin/bash
# The checks pending since session 44 (no GPU was lent in sessions 44-46; this script replaces
# s44/pending/run.sh and s46/run.sh), in order of importance and within one deadline:
# - the whole GPU suite (session 44: LanguageModel::sequences_a_forward and batched ffn_stats_in_windows,
#   memory_overlaps by strides, TWELL_REQUIRE messages, decode_step's message; session 45: FfnForward's
#   precision check and optional gradients with a shape but no data, the C API's no-element tensors with
#   NULL data; session 47: FfnForward objects sharing one workspace, the dense backward's StreamScratch,
#   the C API's cuBLASLt workspace);
# - Python, with twell.FFN as custom operators (session 46), compiled by torch.compile on the GPU, and
#   (session 47) inference FFNs sharing one forward workspace and one cuBLASLt workspace a GPU;
# - the memory of 38 FFN modules of the 2B shape (session 47). Prediction: inference at 8192 tokens
#   holds one forward workspace (~0.4 GB) and one 64 MiB cuBLASLt workspace, where each module held
#   its own before (38 x ~0.47 GB = ~18 GB); a dense training step of 8 layers at 8192 tokens leaves
#   ~0.37 GB outside PyTorch (one layer's dense backward scratch, kept by the pool), where each layer
#   kept ~0.48 GB before (~3.8 GB);
# - python/examples/train_sparse.py at its GPU defaults (session 46);
# - examples/generate on the GPU, then `bench model --save` of the calibrated sparse 2B model and Python's
#   ffn_stats on it with one window a forward against 8. Prediction (session 44, before any run):
#   max_batch 8 takes 5-15% less time than 1 (eval --sparsity's batched windows took 0.94 s against
#   1.02 s in s43/run046), the same counts to ~1e-3.
# Binaries: a build of the commit in out/n2/COMMIT, tarred as earlier runs did:
#   mkdir -p out/n2 && cp build-cuda/twell build-cuda/tests/twell_gpu_tests \
#     build-cuda/tests/install_example/build-generate/generate out/n2/ && cp -L build-cuda/libtwell_c.so out/n2/ \
#     && strip out/n2/* && git rev-parse --short HEAD > out/n2/COMMIT && tar cJf out/b9.tar.xz -C out n2
# then on the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s47/run.sh` (default 560).
# Everything is tarred into one file at the end (the device returns at most eight).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python  # the scripts read from stdin import twell from the tree
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s47; mkdir -p $O; cp "$0" $O/run.sh
# ONLY=py: the two Python steps read from stdin alone (the memory, ffn_stats), on a machine that ran the
# rest (ffn_stats needs its /tmp/sp): as they ran again in session 47, when its first run lacked PYTHONPATH.
case "${ONLY:-}" in "" | py) ;; *) echo "ONLY must be py or unset, got $ONLY" >&2; exit 2 ;; esac
all() { [ -z "${ONLY:-}" ]; }
all && {
timeout $(left 180) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
TWELL_LIBRARY=$B/libtwell_c.so timeout $(left 240) $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head
}
TWELL_LIBRARY=$B/libtwell_c.so timeout $(left 90) $PY - > $O/ffn_memory.txt 2>&1 <<'PY'
import torch, twell
H, I, L, M = 2048, 5632, 38, 8192
mods = [twell.FFN(H, I, device="cuda") for _ in range(L)]
x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize(); base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
with torch.no_grad():
    for m in mods:
        y = m(x)
torch.cuda.synchronize()
print(f"inference, {L} layers at {M} tokens: {(torch.cuda.memory_allocated() - base) / 1e9:.3f} GB held after, "
      f"peak {(torch.cuda.max_memory_allocated() - base) / 1e9:.3f} GB", flush=True)
for m in mods:
    m.wg.requires_grad_(True)
    m.max_tokens = M
def outside():  # device memory in use that PyTorch's allocator did not hand out (twell's own)
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0] - torch.cuda.memory_reserved()
before = outside()
outs = [m(x.clone().requires_grad_(True)) for m in mods[:8]]  # a dense step (random weights: ~50% active)
sum(o.float().sum() for o in outs).backward()
print(f"training, 8 layers at {M} tokens, dense: {(outside() - before) / 1e9:.3f} GB more outside PyTorch after "
      f"the step, paths {[m.last_stats()['path'] for m in mods[:2]]}", flush=True)
twell.clear_cache()
print(f"after twell.clear_cache(): {(outside() - before) / 1e9:.3f} GB", flush=True)
PY
echo "rc $?" >> $O/ffn_memory.txt; cat $O/ffn_memory.txt
all && {
TWELL_LIBRARY=$B/libtwell_c.so timeout $(left 150) $PY python/examples/train_sparse.py --out /tmp/train_out \
  > $O/train.txt 2>&1; echo "rc $?" >> $O/train.txt; grep -v "Writing model" $O/train.txt | tail -6
cp /tmp/train_out/train_log.json /tmp/train_out/train.png $O/ 2>/dev/null
timeout $(left 30) $B/generate > $O/generate_example.txt 2>&1; echo "rc $?" >> $O/generate_example.txt
tail -3 $O/generate_example.txt
timeout $(left 90) $B/twell bench model --no-decode --batch 8 --iters 3 --save /tmp/sp > $O/bench_model_save.txt 2>&1
echo "rc $?" >> $O/bench_model_save.txt; tail -3 $O/bench_model_save.txt
}
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
cd $OUT && tar cJf results.tar.xz s47 && rm -rf s47
