#!/bin/bash
# Forty-eighth session's check of the FFN workspace's shared region (the dense path's u and h and the
# TwELL path's matrix and u values at one place): the whole GPU suite (PathsTakenInTurnShareOneRegion new),
# the Python tests, the memory of the 2B shape's FFN modules (s47's probe, with the workspace each mode
# needs), and the benchmarks that use the workspace (bench ffn's headline cases, a 4-layer prefill).
# And FfnForward::use_workspace: twell.FFN's training forwards each on memory their autograd graph holds.
# Prediction: required bytes at I = 5632 ~3.4 · M · I · 2 in both modes (4.4 and 5.4 before); 38
# inference modules at 8192 tokens hold ~0.40 GB (0.512 in s47); after a training step of 8 layers
# nothing held beyond the gradients (8 workspaces, ~2.5 GB, before); checkpointed, the step's peak ~2.2 GB
# lower (one workspace at a time); speed unchanged within noise.
# Binaries: a build of the commit in out/n2/COMMIT, tarred as bench/results/h200/s47/run.sh says.
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s48/run.sh` (default 560).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s48; mkdir -p $O; cp "$0" $O/run.sh; cp $B/COMMIT $O/
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $O/gpu.txt
timeout $(left 200) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
timeout $(left 200) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head
timeout $(left 90) $PY - > $O/ffn_memory.txt 2>&1 <<'PY'
import torch, twell
from twell import _capi
H, I, L, M = 2048, 5632, 38, 8192
for m in (8192, 131072):
    need = {t: _capi.CudaFfn.workspace_bytes(_capi.CudaFfn.make_config(m, H, I, training=t)) for t in (False, True)}
    print(f"workspace at {m} tokens: inference {need[False] / 1e9:.3f} GB ({need[False] / (m * I * 2):.2f} M·I·2), "
          f"training {need[True] / 1e9:.3f} GB ({need[True] / (m * I * 2):.2f} M·I·2)", flush=True)
mods = [twell.FFN(H, I, device="cuda") for _ in range(L)]
x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize(); base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
with torch.no_grad():
    for m in mods:
        y = m(x)
torch.cuda.synchronize()
print(f"inference, {L} layers at {M} tokens: {(torch.cuda.memory_allocated() - base) / 1e9:.3f} GB held after, "
      f"peak {(torch.cuda.max_memory_allocated() - base) / 1e9:.3f} GB", flush=True)
import torch.utils.checkpoint as cp
for m in mods:
    m.wg.requires_grad_(True)
    m.max_tokens = M
def step(checkpointed, n=8):  # random weights: ~50% active, the dense path
    h = x.clone().requires_grad_(True)
    for m in mods[:n]:
        h = h + (cp.checkpoint(m, h, use_reentrant=False) if checkpointed else m(h))
    h.float().sum().backward()
    torch.cuda.synchronize()
step(False)
for checkpointed in (False, True):
    for p in (p for m in mods for p in m.parameters()):
        p.grad = None
    torch.cuda.synchronize(); base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
    step(checkpointed)
    grads = sum(p.grad.numel() * p.grad.element_size() for m in mods for p in m.parameters() if p.grad is not None)
    print(f"training, 8 layers at {M} tokens, checkpointed {checkpointed}: peak {(torch.cuda.max_memory_allocated() - base) / 1e9:.3f} GB, "
          f"held after the step beyond the gradients {(torch.cuda.memory_allocated() - base - grads) / 1e9:.3f} GB, "
          f"paths {[m.last_stats()['path'] for m in mods[:2]]}", flush=True)
PY
echo "rc $?" >> $O/ffn_memory.txt; cat $O/ffn_memory.txt
timeout $(left 120) $B/twell bench ffn --backend cuda -M 16384 -M 131072 -d 0.005 -d 0.01 --json $O/ffn.json \
  > $O/ffn.txt 2> $O/ffn_progress.log; echo "rc $?" >> $O/ffn.txt; cat $O/ffn.txt
timeout $(left 150) $B/twell bench model --no-decode --iters 3 --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
cd $OUT && tar cJf results.tar.xz s48 && rm -rf s48
