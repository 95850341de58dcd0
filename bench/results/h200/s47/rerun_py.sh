#!/bin/bash
# Session 47: run.sh's two Python steps read from stdin again (in its first run they found no twell
# module: no PYTHONPATH), on the machine that ran it (ffn_stats needs its /tmp/sp).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python  # the scripts read from stdin import twell from the tree
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s47b; mkdir -p $O; cp "$0" $O/
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
cd $OUT && tar cJf results.tar.xz s47b && rm -rf s47b
