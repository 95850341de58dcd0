#!/bin/bash
# Fifty-seventh session: chat templates (`twell run --chat`, Python's conversations). On the device:
#  1. the GPU suite (predicted 198/198: no GPU kernel changed);
#  2. memcheck of the DeviceSampler tests (predicted 0 errors);
#  3. the Python tests on the GPU (predicted all pass, ChatTemplates new);
#  4. `twell run --chat` on a random model with the byte-level BPE fixture's tokenizer and a chat template:
#     predicted the reply is the text that the plain run of the rendered conversation prints after it, on
#     the GPU as on the CPU backend; a --system message and a batch of two;
#  5. only on an H200 (the issues' targets are H200 figures; every run since the forty-seventh session got an
#     H100): `twell bench ffn` and `twell bench model`, the standard cases. Kernels of the FFN unchanged since
#     the thirty-ninth session: predicted within perf.md's top table.
# Binaries ($TAR): head/ (twell, twell_gpu_tests, libtwell_c.so of build-cuda, stripped, COMMIT).
# On the device, with carry ["out"]: `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s57/run.sh`.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-500} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
NAME=${NAME:-s57}
tar xJf ${TAR:-out/b29.tar.xz} -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/$NAME; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz $NAME); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 170) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
if [ -z "${SKIP_MEMCHECK:-}" ]; then  # (SKIP_MEMCHECK=1 where device time is short: no GPU code changed)
timeout $(left 100) compute-sanitizer --tool memcheck $B/twell_gpu_tests --gtest_filter='DeviceSampler.*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -4 $O/memcheck.log; save
fi
timeout $(left 90) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head; save
# A random model of small widths (HF format: config.json, model.safetensors), written with torch, with the
# byte-level BPE fixture of the tests as its tokenizer and a chat template.
M=$O/tiny; $PY - $M tests/model/data/bpe_gpt2.json > $O/run_cli.log 2>&1 <<'PYEOF'
import json, os, shutil, struct, sys, torch
d = sys.argv[1]; os.makedirs(d, exist_ok=True)
def save_file(tensors, path):  # safetensors by hand: the device's Python may lack the package
    header, blobs, at = {}, [], 0
    for k, v in tensors.items():
        b = v.view(torch.uint16).numpy().tobytes()
        header[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b); at += len(b)
    h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h); [f.write(b) for b in blobs]
V = 310
c = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=704,
         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=V, hidden_act="relu",
         max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
         torch_dtype="bfloat16", eos_token_id=0)
json.dump(c, open(f"{d}/config.json", "w"))
g = torch.Generator().manual_seed(3); H, I, L = 256, 704, 2
t = {"model.embed_tokens.weight": torch.randn(V, H, generator=g), "model.norm.weight": torch.ones(H),
     "lm_head.weight": torch.randn(V, H, generator=g) * 0.3}
for l in range(L):
    p = f"model.layers.{l}."
    for n, s in (("self_attn.q_proj", (H, H)), ("self_attn.k_proj", (H, H)), ("self_attn.v_proj", (H, H)),
                 ("self_attn.o_proj", (H, H)), ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)), ("mlp.down_proj", (H, I))):
        t[p + n + ".weight"] = torch.randn(*s, generator=g) * 0.06
    t[p + "input_layernorm.weight"] = torch.ones(H); t[p + "post_attention_layernorm.weight"] = torch.ones(H)
save_file({k: v.to(torch.bfloat16).contiguous() for k, v in t.items()}, f"{d}/model.safetensors")
shutil.copy(sys.argv[2], f"{d}/tokenizer.json")
json.dump({"eos_token": "<|endoftext|>", "chat_template": "{% for m in messages %}<sep>{{ m.role }}: {{ m.content | trim }}"
           "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<mask>{% endif %}"}, open(f"{d}/tokenizer_config.json", "w"))
print("written", d)
PYEOF
R="$B/twell run $M --no-stop -n 24"
{ echo "== --chat -p ' hi ' (predicted: a note of the template, then the reply alone)"; $R --chat -p ' hi ' 2>&1
  echo "== the rendered conversation as a plain prompt (predicted: it, then the reply above)"; $R -p '<sep>user: hi<|endoftext|><mask>' 2>&1
  echo "== --chat --system 'be brief', a batch of two (predicted: [1] and [2] the same reply, greedy)"; $R --chat --system 'be brief' -p yo -p yo 2>&1
  echo "== the same conversation, plain"; $R -p '<sep>system: be brief<|endoftext|><sep>user: yo<|endoftext|><mask>' 2>&1
  echo "== CPU backend, --chat -p ' hi ' (predicted: the GPU's reply, or one that parts from it late: bf16 logits)"; $R --device cpu --chat -p ' hi ' 2>&1
  echo "== a conversation on stdin: hi, then yo (predicted: the first reply that of --chat -p hi, then a second)"; printf 'hi\nyo\n' | $R --chat 2>&1
  } >> $O/run_cli.log
cat $O/run_cli.log | head -60; rm -rf $M; save
grep -q H200 $O/gpu.txt || { echo "not an H200: the standard benches are not run"; exit 0; }
timeout $(left 150) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E "^(16384|131072) .*(0.50|1.00)% .* twell  |^rc" $O/ffn.txt; save
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
