#!/usr/bin/env python3
"""Generates the HuggingFace parity fixtures of tests/model/test_llama_cpu.cpp.

For each model below: a tiny random `transformers` LlamaForCausalLM (GQA, RoPE theta 1e5),
saved with save_pretrained (safetensors, float32) into tests/model/data/llama/<name>/, and
HF's logits for a fixed token sequence in <name>/logits.safetensors:
    tokens      I32 [T]
    logits      F32 [T, V]   the float32 model's output
    logits_f64  F64 [T, V]   the same model in float64 (reference for twell's f64 path)

The gpu_* models are shaped for the GPU runtime's kernels (head_dim 32 and 64, FFN widths a
multiple of 64, 80 tokens so that attention crosses its 64-key tiles) and also hold
    logits_bf16 F32 [T, V]   the same model cast to bfloat16 (what a bf16 PyTorch user sees)

Run once, by hand (the C++ tests need no Python), for all models or the ones named:
    pip install torch transformers safetensors
    python3 tests/model/make_hf_fixture.py [NAME ...]
Each CPU model directory is about 110 KB, each gpu_* one about 1 MB.
"""
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "llama")

# 16 fixed tokens, every id < vocab_size.
TOKENS = [1, 17, 42, 96, 0, 5, 63, 63, 28, 71, 11, 90, 3, 54, 37, 8]

# 80 fixed tokens for the gpu_* models.
LONG_TOKENS = [(7 * i * i + 3 * i + 1) % 97 for i in range(80)]

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=88, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64)

MODELS = {
    # The paper's kind of model: ReLU gate, tied embeddings.
    "relu_tied": dict(hidden_act="relu", tie_word_embeddings=True, seed=1, shape=SMALL),
    # Standard Llama FFN with an untied LM head.
    "silu_untied": dict(hidden_act="silu", tie_word_embeddings=False, seed=2, shape=SMALL),
    # GPU runtime: head_dim 32 with GQA, and head_dim 64 without.
    # Llama 3.1's RoPE scaling (factor 8 from a 256-token context): head_dim 8 puts one rotary pair
    # in each of its three bands (kept, interpolated, divided by the factor), plus a fourth low one.
    "llama3_rope": dict(hidden_act="silu", tie_word_embeddings=True, seed=5, shape=SMALL,
                        rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=256)),
    "gpu_relu_tied": dict(hidden_act="relu", tie_word_embeddings=True, seed=3, tokens=LONG_TOKENS, init=0.05,
                          shape=dict(vocab_size=97, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                     num_key_value_heads=2, max_position_embeddings=128)),
    "gpu_silu_untied": dict(hidden_act="silu", tie_word_embeddings=False, seed=4, tokens=LONG_TOKENS, init=0.05,
                            shape=dict(vocab_size=97, hidden_size=128, intermediate_size=320, num_attention_heads=2,
                                       num_key_value_heads=2, max_position_embeddings=128)),
    # The GPU's RoPE table with llama3 scaling: head_dim 32, pairs 5 and 6 interpolated, 7-15 divided.
    "gpu_relu_llama3": dict(hidden_act="relu", tie_word_embeddings=True, seed=6, tokens=LONG_TOKENS, init=0.05,
                            rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=512),
                            shape=dict(vocab_size=97, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=128)),
}


def make(name, hidden_act, tie_word_embeddings, seed, shape, tokens=TOKENS, init=0.2, rope=None):
    torch.manual_seed(seed)
    config = LlamaConfig(
        **({"rope_scaling": rope} if rope else {}),
        **shape,
        num_hidden_layers=2,
        hidden_act=hidden_act,
        rms_norm_eps=1e-5,
        rope_theta=1e5,
        tie_word_embeddings=tie_word_embeddings,
        # CPU fixtures: large enough that attention and the gates are far from trivial. The gpu_*
        # ones use 0.05: at 0.2, bf16 rounding alone moves HF's own logits by 5%.
        initializer_range=init,
        attention_bias=False,
        mlp_bias=False,
    )
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        # Norm weights start at 1: make them random so a misplaced norm weight shows.
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))

    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path, safe_serialization=True)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)

    ids = torch.tensor([tokens], dtype=torch.long)
    out = {"tokens": torch.tensor(tokens, dtype=torch.int32)}
    with torch.no_grad():
        out["logits"] = logits = model(ids).logits[0].float().contiguous()
        out["logits_f64"] = model.to(torch.float64)(ids).logits[0].contiguous()
        if name.startswith("gpu_"):  # last: the cast rounds the weights
            out["logits_bf16"] = model.to(torch.bfloat16)(ids).logits[0].float().contiguous()
    save_file(
        out,
        os.path.join(path, "logits.safetensors"),
    )
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"{name}: {size} bytes, logits range [{logits.min():.3f}, {logits.max():.3f}]")


if __name__ == "__main__":
    import sys

    import transformers

    print("torch", torch.__version__, "transformers", transformers.__version__)
    for name in sys.argv[1:] or MODELS:
        make(name, **MODELS[name])
