"""Decode rates of twell.Model at batch 1 on a random 4-layer model of the 2B widths (vocab 49152):
greedy and sampled (temperature 0.8, top-p 0.95), with the whole vocabulary (no tokenizer) and with
the byte tokenizer's 258 ids (what `twell run --byte-tokenizer` samples from). Best of 3, 128 tokens."""
import json, os, sys
sys.path.insert(0, "python")
import twell
m = twell.Model(sys.argv[1], device="cuda", context=2048 + 128, tokenizer=None)
prompt = [(7 * i) % 32000 for i in range(2048)]
out = {"library": os.environ["TWELL_LIBRARY"]}
for name, kw in [("greedy", {}), ("sampled", {"temperature": 0.8, "top_p": 0.95, "seed": 1})]:
    for limit in ("vocab 49152", "vocab 258"):
        m.tokenizer = None if limit == "vocab 49152" else twell.Tokenizer(bytes=True)
        rates = []
        for _ in range(3):
            m.generate(prompt, max_new_tokens=128, stop=False, **kw)
            rates.append(m.last_generation["tokens_per_second"])
        out[f"{name}, {limit}"] = max(rates)
print(json.dumps(out))
