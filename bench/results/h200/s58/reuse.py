"""A conversation's next turn with and without prefix reuse (generate(reuse_cache=True)) on a random model of
the 2B model's widths (hidden 2048, FFN 5632, 32 heads, vocab 49152; 8 layers, context 8192), written here
in HF format with the tests' byte-level BPE tokenizer and a chat template. Prints the time to the first new
token of the second turn both ways (median of 7, alternated) and whether the tokens agree; then runs
`twell run --chat` on a conversation on stdin, whose timing lines say how much each turn took from the cache.
Usage: reuse.py MODEL_DIR TOKENIZER_JSON (needs torch and the twell package on PYTHONPATH)."""
import json, os, shutil, statistics, struct, subprocess, sys, time
import torch
import twell

d, tokenizer = sys.argv[1], sys.argv[2]
os.makedirs(d, exist_ok=True)
H, I, L, V, heads = 2048, 5632, 8, 49152, 32
t0 = time.time()
c = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=H, intermediate_size=I,
         num_hidden_layers=L, num_attention_heads=heads, num_key_value_heads=heads, vocab_size=V, hidden_act="relu",
         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
         torch_dtype="bfloat16", eos_token_id=0)
json.dump(c, open(f"{d}/config.json", "w"))
g = torch.Generator(device="cuda").manual_seed(3)
def rnd(*shape, scale):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16).cpu()
t = {"model.embed_tokens.weight": rnd(V, H, scale=1.0), "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)}
for l in range(L):
    p = f"model.layers.{l}."
    for n, s in (("self_attn.q_proj", (H, H)), ("self_attn.k_proj", (H, H)), ("self_attn.v_proj", (H, H)),
                 ("self_attn.o_proj", (H, H)), ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)),
                 ("mlp.down_proj", (H, I))):
        t[p + n + ".weight"] = rnd(*s, scale=0.02)
    t[p + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    t[p + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
header, at = {}, 0
for k, v in t.items():
    n = v.numel() * 2
    header[k] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [at, at + n]}
    at += n
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(f"{d}/model.safetensors", "wb") as f:  # by hand: the device's Python may lack safetensors
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for v in t.values():
        f.write(v.view(torch.uint16).numpy().tobytes())
shutil.copy(tokenizer, f"{d}/tokenizer.json")
json.dump({"eos_token": "<|endoftext|>", "chat_template": "{% for m in messages %}<sep>{{ m.role }}: {{ m.content }}"
           "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<mask>{% endif %}"},
          open(f"{d}/tokenizer_config.json", "w"))
print(f"model written in {time.time() - t0:.1f} s: {d}", flush=True)

with twell.Model(d) as m:
    print(repr(m), flush=True)
    first = [(i * 7919) % 30000 + 100 for i in range(4000)]
    a = m.generate(first, max_new_tokens=16, stop=False)
    second = first + a + [(i * 31) % 30000 + 100 for i in range(20)]
    times = {True: [], False: []}
    tokens = {True: [], False: []}
    for rep in range(8):
        for reuse in (False, True):
            m.reset()  # the first turn from scratch, as it ran for `a`
            m.generate(first, max_new_tokens=16, stop=False, reuse_cache=reuse)
            out = m.generate(second, max_new_tokens=8, stop=False, reuse_cache=reuse)
            assert m.last_generation["reused_tokens"] == (4015 if reuse else 0), m.last_generation
            if rep > 0:  # the first: plans built, GEMMs tuned
                times[reuse].append(m.last_generation["prefill_seconds"])
                tokens[reuse].append(out)
    for reuse in (False, True):
        print(f"second turn ({len(second)} tokens{', 4015 of them cached' if reuse else ''}): first token in "
              f"{statistics.median(times[reuse]) * 1e3:.2f} ms (median of {len(times[reuse])}; "
              f"{min(times[reuse]) * 1e3:.2f}-{max(times[reuse]) * 1e3:.2f})")
    print("greedy tokens the same with and without reuse:", tokens[True][0] == tokens[False][0], tokens[True][0],
          tokens[False][0])
    print("each way the same tokens every time:", all(x == tokens[True][0] for x in tokens[True]),
          all(x == tokens[False][0] for x in tokens[False]), flush=True)

lines = "".join(f"message {i}: " + "lorem ipsum dolor sit amet " * (200 if i == 0 else 3) + "\n" for i in range(4))
r = subprocess.run([os.environ.get("TWELL_CLI", os.path.join(os.path.dirname(os.environ["TWELL_LIBRARY"]), "twell")),
                    "run", d, "--chat", "--no-stop", "-n", "16"], input=lines, capture_output=True, text=True)
print("== twell run --chat, four messages on stdin (the first ~1000 tokens): rc", r.returncode)
print("stderr:\n" + r.stderr)
