"""twell.Model against HuggingFace transformers on the same checkpoint: logits first, then speed.

    python3 python/examples/model_speed.py [--model DIR] [--prompt-tokens 2048] [--new-tokens 128] [--json out.json]

Without --model it writes a random ReLU Llama of the paper's 2B widths (hidden 2048, FFN 5632, 32
heads, vocab 49152; --layers 4 by default) to a temporary folder. Checked first: the last token's
logits of a 64-token prompt, twell's and transformers' (bf16, SDPA) against transformers in float32:
twell's relative error must be at most twice transformers' bf16 one. Then
timed, best of --repeats: the prefill of --prompt-tokens tokens (the last token's logits back on the
host), and greedy decoding of --new-tokens tokens at batch 1 (tokens per second, sampling and the
Python callback included on both sides). A random model's FFN is ~50% dense, so twell dispatches it
to the dense FFN: this compares the runtimes, not the sparsity (twell bench model does that).
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import twell  # noqa: E402


def write_random_model(folder, layers, seed=0):
    """A ReLU Llama of the 2B widths in HF's layout, bf16, in folder."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
              "intermediate_size": 5632, "num_hidden_layers": layers, "num_attention_heads": 32,
              "num_key_value_heads": 32, "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 4096,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "relu",
              "torch_dtype": "bfloat16", "bos_token_id": 256, "eos_token_id": 257}
    g = torch.Generator().manual_seed(seed)
    h, i, v = 2048, 5632, 49152

    def normal(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": normal(v, h, std=1.0), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
         "lm_head.weight": normal(v, h)}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            t[p + f"self_attn.{name}.weight"] = normal(h, h)
        t[p + "mlp.gate_proj.weight"] = normal(i, h)
        t[p + "mlp.up_proj.weight"] = normal(i, h)
        t[p + "mlp.down_proj.weight"] = normal(h, i)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    header, offset = {}, 0
    for name, tensor in t.items():
        n = tensor.numel() * 2
        header[name] = {"dtype": "BF16", "shape": list(tensor.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for tensor in t.values():
            f.write(tensor.contiguous().view(torch.uint8).numpy().tobytes())


def best_of(repeats, fn):
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a model directory (default: a random one of the 2B widths)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the random model")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if not twell.cuda_available():
        sys.exit("model_speed: needs a Hopper GPU: " + twell.cuda_unavailable_reason())

    folder = args.model or tempfile.mkdtemp(prefix="twell_model_speed_")
    try:
        if not args.model:
            print(f"writing a random {args.layers}-layer model of the 2B widths to {folder}", flush=True)
            write_random_model(folder, args.layers)
        results = run(folder, args)
    finally:
        if not args.model:
            shutil.rmtree(folder)
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def run(folder, args):
    context = args.prompt_tokens + args.new_tokens
    model = twell.Model(folder, device="cuda", context=context, tokenizer=None, verbose=True)
    vocab = model.config["vocab_size"]
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, min(vocab, 32000), (args.prompt_tokens,), generator=g).tolist()
    results = {"model": folder if args.model else f"random, {args.layers} layers of the 2B widths",
               "config": model.config, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
               "twell_version": twell.__version__, "gpu": torch.cuda.get_device_name()}

    hf = None
    try:
        import transformers
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16,
                                                               attn_implementation="sdpa").cuda().eval()
        results["transformers_version"] = transformers.__version__
    except ImportError:
        print("transformers is not installed: twell alone is timed", flush=True)

    # Correctness first: the last token's logits of a short prompt.
    short = prompt[:64]
    ours = model.prefill(short).float()
    model.reset()
    if hf is not None:
        import transformers
        ids = torch.tensor([short], device="cuda")
        with torch.no_grad():
            theirs = hf(ids).logits[0, -1].double().cpu()
            # The reference both bf16 runs are judged against: transformers in float32.
            ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                    attn_implementation="sdpa").cuda().eval()
            exact = ref(ids).logits[0, -1].double().cpu()
            del ref
            torch.cuda.empty_cache()
        rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
        err, err_ours, err_theirs = rel(ours, theirs), rel(ours, exact), rel(theirs, exact)
        results["last_logits_relative_error_vs_transformers"] = err
        results["last_logits_relative_error_vs_fp32"] = {"twell": err_ours, "transformers_bf16": err_theirs}
        print(f"last-token logits: twell against transformers (bf16) {err:.2e}; against transformers in float32: "
              f"twell {err_ours:.2e}, transformers bf16 {err_theirs:.2e}", flush=True)
        if not err_ours <= max(2 * err_theirs, 1e-3):
            sys.exit(f"model_speed: twell's logits are further from float32 ({err_ours:.2e}) than twice transformers' "
                     f"bf16 ones ({err_theirs:.2e}): not timing")

    prefill_s = best_of(args.repeats, lambda: (model.prefill(prompt), model.reset()))
    results["twell_prefill_ms"] = prefill_s * 1e3
    results["twell_prefill_tokens_per_ms"] = args.prompt_tokens / (prefill_s * 1e3)
    rates = []
    for _ in range(args.repeats):
        model.generate(prompt, max_new_tokens=args.new_tokens, stop=False, temperature=0)  # greedy, as HF below
        rates.append(model.last_generation["tokens_per_second"])
    results["twell_decode_tokens_per_second"] = max(rates)

    if hf is not None:
        ids = torch.tensor([prompt], device="cuda")
        with torch.no_grad():
            prefill_hf = best_of(args.repeats, lambda: hf(ids, logits_to_keep=1).logits[0, -1].float().cpu())
            decode_hf = best_of(args.repeats, lambda: hf.generate(
                ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False))
        results["transformers_prefill_ms"] = prefill_hf * 1e3
        results["transformers_prefill_tokens_per_ms"] = args.prompt_tokens / (prefill_hf * 1e3)
        # generate's time includes its prefill: take it out for a decode rate.
        results["transformers_decode_tokens_per_second"] = args.new_tokens / max(decode_hf - prefill_hf, 1e-9)

    print(f"\n| | prefill {args.prompt_tokens} tokens (ms) | tokens/ms | decode tokens/s (batch 1) |")
    print("|---|---|---|---|")
    print(f"| twell.Model | {results['twell_prefill_ms']:.1f} | {results['twell_prefill_tokens_per_ms']:.1f} | "
          f"{results['twell_decode_tokens_per_second']:.1f} |")
    if hf is not None:
        print(f"| transformers {results['transformers_version']} | {results['transformers_prefill_ms']:.1f} | "
              f"{results['transformers_prefill_tokens_per_ms']:.1f} | "
              f"{results['transformers_decode_tokens_per_second']:.1f} |")
    model.close()
    assert all(math.isfinite(v) for k, v in results.items() if isinstance(v, float)), results
    return results


if __name__ == "__main__":
    main()
