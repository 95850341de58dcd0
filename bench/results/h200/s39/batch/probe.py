"""Batched generation through twell.Model.generate_batch on a random model of the 2B widths (vocab 49152,
no tokenizer): B prompts of 64 to 511 tokens (random lengths), 128 new tokens each, greedy and sampled
(temperature 0.8, top-p 0.95). Reported: the prefill (the batch's prompts and first tokens), and the
decode rate over the batch, sum(n - 1) / the longest decode_seconds; best of 2 after a warm-up that
records the decode graphs. B = 1 is generate_batch of one prompt (as generate())."""
import json, os, random, sys, time
sys.path.insert(0, "python")
import twell
m = twell.Model(sys.argv[1], device="cuda", context=640, tokenizer=None, max_batch=64)
rng = random.Random(0)
out = {"library": os.environ["TWELL_LIBRARY"], "runs": []}
for B in (1, 4, 16, 64):
    prompts = [[rng.randrange(32000) for _ in range(rng.randrange(64, 512))] for _ in range(B)]
    for name, kw in [("greedy", {}), ("sampled", {"temperature": 0.8, "top_p": 0.95, "seed": 1})]:
        m.generate_batch(prompts, max_new_tokens=4, stop=False, **kw)
        best = None
        for _ in range(2):
            t = time.perf_counter()
            m.generate_batch(prompts, max_new_tokens=128, stop=False, **kw)
            wall = time.perf_counter() - t
            g = m.last_generation
            rate = sum(len(x["tokens"]) - 1 for x in g) / max(x["decode_seconds"] for x in g)
            run = {"B": B, "sampling": name, "prompt_tokens": sum(map(len, prompts)), "longest": max(map(len, prompts)),
                   "prefill_s": g[0]["prefill_seconds"], "decode_tokens_per_s": rate, "wall_s": wall}
            if best is None or rate > best["decode_tokens_per_s"]:
                best = run
        out["runs"].append(best)
        print(json.dumps(best), file=sys.stderr, flush=True)
print(json.dumps(out, indent=1))
