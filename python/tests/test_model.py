"""twell.Model and twell.Tokenizer with the standard library alone (CI has no PyTorch), on a tiny random
checkpoint written here in HuggingFace's layout: the calls agree with one another (logits, KV-cache
decoding, generation, perplexity, streaming), bad input is refused with the reason, and where a GPU is
present its logits match the CPU backend's."""
import array
import contextlib
import ctypes
import io
import json
import math
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import unittest
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import twell  # noqa: E402
from twell import _capi  # noqa: E402

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "vocab_size": 260, "max_position_embeddings": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
          "tie_word_embeddings": False, "hidden_act": "relu", "torch_dtype": "float32", "bos_token_id": 256,
          "eos_token_id": 257}


def write_safetensors(path, tensors):
    """tensors: name -> (shape, list of floats), stored as F32."""
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in sorted(tensors.items()):
        data = array.array("f", values).tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_model(folder, config=CONFIG, seed=3, nan_at=None):
    rng = random.Random(seed)
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    normal = lambda shape, s: (shape, [rng.gauss(0, s) for _ in range(math.prod(shape))])  # noqa: E731
    norm = lambda: ((h,), [1 + rng.gauss(0, 0.2) for _ in range(h)])  # noqa: E731
    t = {"model.embed_tokens.weight": normal((v, h), 1.0), "model.norm.weight": norm(),
         "lm_head.weight": normal((v, h), 0.2)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = normal((q, h), 0.25)
        t[p + "self_attn.k_proj.weight"] = normal((kv, h), 0.25)
        t[p + "self_attn.v_proj.weight"] = normal((kv, h), 0.2)
        t[p + "self_attn.o_proj.weight"] = normal((h, q), 0.2)
        t[p + "mlp.gate_proj.weight"] = normal((i, h), 0.2)
        t[p + "mlp.up_proj.weight"] = normal((i, h), 0.2)
        t[p + "mlp.down_proj.weight"] = normal((h, i), 0.1)
    if nan_at:
        t[nan_at][1][3] = float("nan")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    write_safetensors(os.path.join(folder, "model.safetensors"), t)


def rows(logits, vocab):
    """The rows of logits (a memoryview (T, V) or a torch tensor) as lists."""
    flat = logits.tolist()
    return flat if isinstance(flat[0], list) else [flat[k:k + vocab] for k in range(0, len(flat), vocab)]


def relative_error(got, want, vocab=260):
    """‖got − want‖ / ‖want‖ over whole logit matrices."""
    got, want = rows(got, vocab), rows(want, vocab)
    num = sum((a - b) ** 2 for ra, rb in zip(got, want) for a, b in zip(ra, rb))
    return math.sqrt(num / sum(b * b for rb in want for b in rb))


def argmax(row):
    return max(range(len(row)), key=lambda k: (row[k], -k))


class ModelOnTheCpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="twell_py_model_")
        write_model(cls.dir)
        cls.lines = []
        handler = _ListHandler(cls.lines)
        twell.model._log.addHandler(handler)
        twell.model._log.setLevel("INFO")
        try:
            cls.model = twell.Model(cls.dir, device="cpu", tokenizer="bytes")
        finally:
            twell.model._log.removeHandler(handler)

    @classmethod
    def tearDownClass(cls):
        cls.model.close()
        shutil.rmtree(cls.dir)

    def test_config_device_and_log(self):
        m = self.model
        self.assertEqual(m.device, "cpu")
        self.assertEqual(m.config["vocab_size"], 260)
        self.assertEqual(m.config["num_layers"], 2)
        self.assertEqual(m.config["hidden_act"], "relu")
        self.assertEqual(m.config["context"], 64)
        self.assertEqual(m.eos_ids, [257])
        self.assertIn("2 layers, hidden 64, FFN 128 (relu)", repr(m))
        self.assertTrue(any(line.startswith("loaded ") for line in self.lines), self.lines)
        self.assertIn("backend: CPU reference", self.lines)

    def test_tokenizer_round_trip(self):
        tok = self.model.tokenizer
        self.assertEqual((tok.vocab_size, tok.bos_id, tok.eos_id, tok.bos_to_add), (258, 256, 257, 256))
        self.assertEqual(tok.encode("hé"), [104, 195, 169])
        self.assertEqual(self.model.encode("hé"), [256, 104, 195, 169])
        self.assertEqual(tok.decode([104, 195, 169]), "hé")
        self.assertEqual(tok.decode_bytes([195]), b"\xc3")
        with self.assertRaisesRegex(twell.TwellError, "300"):
            tok.decode([300])

    def test_logits_prefill_and_decode_agree(self):
        m = self.model
        ids = [256, 10, 20, 30, 40, 50]
        full = rows(m.logits(ids), 260)
        self.assertEqual(len(full), 6)
        self.assertEqual(len(full[0]), 260)
        self.assertTrue(all(math.isfinite(x) for row in full for x in row))
        last = m.prefill(ids[:3]).tolist()
        self.assertEqual(m.cached_tokens, 3)
        for k in range(3, 6):
            last = m.decode_step(ids[k]).tolist()
        self.assertEqual(m.cached_tokens, 6)
        for a, b in zip(last, full[-1]):  # the same arithmetic: the same values to rounding
            self.assertAlmostEqual(a, b, delta=1e-4 * (1 + abs(b)))
        m.reset()
        self.assertEqual(m.cached_tokens, 0)

    def test_greedy_generation_is_the_argmax_chain(self):
        m = self.model
        prompt = [256, 5, 6, 7]
        out = m.generate(prompt, max_new_tokens=5, stop=False)
        self.assertEqual(len(out), 5)
        chain = list(prompt)
        for _ in range(5):
            chain.append(argmax(rows(m.logits(chain), 260)[-1][:258]))  # vocab_limit: the tokenizer's 258
        self.assertEqual(out, chain[len(prompt):])
        self.assertEqual(m.last_generation["reason"], "max_tokens")
        self.assertEqual(m.last_generation["tokens"], out)

    def test_sampling_is_reproducible_and_the_callback_stops_it(self):
        m = self.model
        a = m.generate([256, 1, 2], max_new_tokens=8, temperature=0.9, top_p=0.9, seed=11, stop=False)
        b = m.generate([256, 1, 2], max_new_tokens=8, temperature=0.9, top_p=0.9, seed=11, stop=False)
        self.assertEqual(a, b)
        seen = []
        c = m.generate([256, 1, 2], max_new_tokens=8, temperature=0.9, top_p=0.9, seed=11, stop=False,
                       stream=lambda t: seen.append(t) or len(seen) == 3)
        self.assertEqual(c, a[:3])
        self.assertEqual(seen, a[:3])
        self.assertEqual(m.last_generation["reason"], "callback")
        stop = m.generate([256, 1, 2], max_new_tokens=8, temperature=0.9, top_p=0.9, seed=11, stop=[a[4]])
        self.assertEqual(stop, a[:a.index(a[4]) + 1])
        self.assertEqual(m.last_generation["reason"], "stop_token")

    def test_reuse_cache_prefills_only_the_new_turn(self):
        m = self.model
        first = [256, 1, 2, 3]
        a = m.generate(first, max_new_tokens=4, stop=False, reuse_cache=True)
        self.assertEqual(m.last_generation["reused_tokens"], 0)
        turn = first + a + [9, 8]
        b = m.generate(turn, max_new_tokens=4, temperature=0.9, seed=2, stop=False, reuse_cache=True)
        self.assertEqual(m.last_generation["reused_tokens"], len(first) + len(a) - 1)
        self.assertEqual(b, m.generate(turn, max_new_tokens=4, temperature=0.9, seed=2, stop=False))  # the same bits
        self.assertEqual(m.last_generation["reused_tokens"], 0)  # off by default
        m.generate(turn, max_new_tokens=1, stop=False, reuse_cache=True)  # after a call without: from scratch
        self.assertEqual(m.last_generation["reused_tokens"], 0)
        m.generate(turn, max_new_tokens=1, stop=False, reuse_cache=True)  # all but the last token, run again
        self.assertEqual(m.last_generation["reused_tokens"], len(turn) - 1)

    def test_batch_generation_is_each_prompt_generated_alone(self):
        m = self.model
        prompts = ["ab", [256, 1, 2, 3], "hello there", [256]]
        out = m.generate_batch(prompts, max_new_tokens=7, temperature=0.9, top_p=0.95, seed=3)
        self.assertEqual(len(out), 4)
        records = m.last_generation
        for i, p in enumerate(prompts):
            alone = m.generate(p, max_new_tokens=7, temperature=0.9, top_p=0.95, seed=3 + i)
            self.assertEqual(out[i], alone, i)
            self.assertEqual(records[i]["tokens"], m.last_generation["tokens"], i)
            self.assertEqual(records[i]["reason"], m.last_generation["reason"], i)
        self.assertIsInstance(out[0], str)
        self.assertIsInstance(out[1], list)
        self.assertEqual(m.max_batch, 65535)  # the CPU backend's limit
        with self.assertRaisesRegex(twell.TwellError, "list of prompts"):
            m.generate_batch("ab")
        with self.assertRaisesRegex(twell.TwellError, "0 prompts"):
            m.generate_batch([])
        with self.assertRaisesRegex(twell.TwellError, "prompt 1 is empty"):
            m.generate_batch([[256], []])
        with self.assertRaisesRegex(twell.TwellError, "max_new_tokens"):
            m.generate_batch([[256]], max_new_tokens=-2)
        with self.assertRaisesRegex(twell.TwellError, "max_batch"):
            twell.Model(self.dir, device="cpu", max_batch=0)
        for bad in (0, 2, True, 3.0, "8"):
            with self.assertRaisesRegex(twell.TwellError, r"max_batch_tokens must be a number of tokens of at least "
                                                          r"max_batch \(3"):
                twell.Model(self.dir, device="cpu", max_batch=3, max_batch_tokens=bad)
        twell.Model(self.dir, device="cpu", max_batch=3, max_batch_tokens=3).close()  # the least it takes

    def test_text_generation_streams_what_it_returns(self):
        m = self.model
        pieces = []
        text = m.generate("ab", max_new_tokens=12, temperature=1.0, seed=5, stream=pieces.append)
        self.assertEqual("".join(pieces), text)
        new = m.last_generation["tokens"]
        body = new[:-1] if m.last_generation["reason"] == "stop_token" else new
        self.assertEqual(text, m.tokenizer.decode(body))

    def test_repetition_penalty_is_applied_to_every_id_the_sequence_holds(self):
        m = self.model
        prompt, penalty = [256, 5, 6, 7, 5], 1.7
        out = m.generate(prompt, max_new_tokens=8, stop=False, repetition_penalty=penalty)
        chain = list(prompt)
        f32 = ctypes.c_float
        for _ in range(8):  # the argmax of the last row with the held ids' logits penalized (f32, as transformers)
            row = rows(m.logits(chain), 260)[-1][:258]
            for i in set(chain):
                v = f32(row[i]).value
                row[i] = f32(v * f32(penalty).value).value if v < 0 else f32(v / f32(penalty).value).value
            chain.append(argmax(row))
        self.assertEqual(out, chain[len(prompt):])
        self.assertEqual(m.generate(prompt, max_new_tokens=8, stop=False, repetition_penalty=1.0),
                         m.generate(prompt, max_new_tokens=8, stop=False))
        self.assertEqual(m.generate_batch([prompt], max_new_tokens=8, stop=False, repetition_penalty=penalty), [out])
        for bad in (0, -1.0, float("nan"), float("inf")):
            with self.assertRaisesRegex(twell.TwellError, "repetition_penalty must be finite and > 0"):
                m.generate(prompt, max_new_tokens=1, repetition_penalty=bad)

    def test_min_p_one_is_greedy(self):
        m = self.model
        greedy = m.generate("ab", max_new_tokens=10, stop=False)
        self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False, temperature=1.5, seed=4, min_p=1.0), greedy)
        self.assertEqual(m.generate_batch(["ab"], max_new_tokens=10, stop=False, temperature=1.5, min_p=1.0), [greedy])
        for bad, why in ((1.5, r"min_p must be in \[0, 1\]"), (-0.1, "min_p"), ("0.5", "min_p must be a number")):
            with self.assertRaisesRegex(twell.TwellError, why):
                m.generate("ab", max_new_tokens=2, temperature=1.0, min_p=bad)
        with self.assertWarnsRegex(UserWarning, "min_p"):
            m.generate("ab", max_new_tokens=1, min_p=0.5)

    def test_generation_config_sets_the_sampling_arguments_left_none(self):
        base = self.model
        greedy = base.generate("ab", max_new_tokens=10, stop=False)
        sampled = base.generate("ab", max_new_tokens=10, stop=False, temperature=1.5, top_k=50, top_p=0.9, seed=2)
        penalized = base.generate("ab", max_new_tokens=10, stop=False, repetition_penalty=1.5)
        self.assertEqual(base.generation_defaults, {"temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0,
                                                    "repetition_penalty": 1})
        folder = tempfile.mkdtemp(prefix="twell_py_gen_")
        self.addCleanup(shutil.rmtree, folder)
        for name in ("config.json", "model.safetensors"):
            os.symlink(os.path.join(self.dir, name), os.path.join(folder, name))
        gen = os.path.join(folder, "generation_config.json")

        def model_with(generation_config):
            with open(gen, "w") as f:
                json.dump(generation_config, f)
            m = twell.Model(folder, device="cpu", tokenizer="bytes")
            self.addCleanup(m.close)
            return m

        m = model_with({"do_sample": True, "temperature": 1.5, "top_p": 0.9})  # transformers' top_k 50 with it
        self.assertEqual(m.generation_defaults, {"temperature": 1.5, "top_k": 50, "top_p": 0.9, "min_p": 0.0,
                                                 "repetition_penalty": 1.0})
        self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False, seed=2), sampled)
        self.assertEqual(m.generate_batch(["ab"], max_new_tokens=10, stop=False, seed=2), [sampled])
        self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False, temperature=0), greedy)  # given: wins
        m = model_with({"do_sample": False, "temperature": 0.6, "repetition_penalty": 1.5})  # greedy, penalized
        self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False), penalized)
        self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False, repetition_penalty=1), greedy)
        m = model_with({"top_p": 0.9})  # greedy; its top_p shapes a run given a temperature
        self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False, temperature=1.5, top_k=50, seed=2), sampled)
        seen = []  # read from a stream callback (the config does not change: no call into the model)
        m.generate("ab", max_new_tokens=2, stream=lambda t: seen.append(m.generation_defaults["top_p"]))
        self.assertEqual(seen[:1], [1.0])
        for bad, why in (({"do_sample": True, "top_p": 0}, r"generation_config.json: top_p must be in"),
                         ({"do_sample": True, "temperature": "hot"},
                          "generation_config.json: key 'temperature' must be a number")):
            m = model_with(bad)  # loads (logits, perplexity); generate() says why it cannot take the file
            self.assertEqual(len(m.logits([256, 5])), 2)
            with self.assertRaisesRegex(twell.TwellError, why + r".*\(pass the argument\)"):
                m.generate("ab", max_new_tokens=2)
            with self.assertRaisesRegex(twell.TwellError, why):
                m.generation_defaults
            self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False, temperature=0), greedy)  # not taken
        with open(gen, "w") as f:  # not JSON: the model loads; generate() says why it cannot take the file
            f.write("garbage")
        m = twell.Model(folder, device="cpu", tokenizer="bytes")
        self.addCleanup(m.close)
        self.assertEqual(len(m.logits([256, 5])), 2)
        with self.assertRaisesRegex(twell.TwellError, r"generation_config.json: generation config is not valid JSON"):
            m.generate("ab", max_new_tokens=2)
        with twell.Model(folder, device="cpu", tokenizer="bytes", generation_config="ignore") as ignored:
            self.assertEqual(ignored.generate("ab", max_new_tokens=10, stop=False), greedy)
        m = model_with({"temperature": "hot"})  # greedy: its temperature is never taken (as in transformers)
        self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False), greedy)
        m = model_with({"num_beams": 3})
        with self.assertWarnsRegex(UserWarning, "sets num_beams 3, which twell does not apply"):
            self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False), greedy)
        with open(gen, "w") as f:  # the file left out, bad values and all: twell's defaults
            json.dump({"do_sample": True, "top_p": 0, "num_beams": 3}, f)
        with twell.Model(folder, device="cpu", tokenizer="bytes", generation_config="ignore") as m:
            self.assertEqual(m.generation_defaults["temperature"], 0)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                self.assertEqual(m.generate("ab", max_new_tokens=10, stop=False), greedy)
        with self.assertRaisesRegex(twell.TwellError, "generation_config must be 'auto' or 'ignore'"):
            twell.Model(folder, device="cpu", generation_config=None)

    def test_stop_strings_end_the_text_before_them(self):
        m = self.model
        kw = dict(max_new_tokens=16, temperature=1.0, seed=7, stop=False)
        free = m.generate("ab", **kw)
        free_tokens = m.last_generation["tokens"]
        letters = [c for c in free[1:] if c.isalnum()]
        if not letters:
            self.skipTest(f"no letter in this continuation: {free!r}")
        stop = letters[0]
        cut = free.index(stop)
        pieces = []
        text = m.generate("ab", stream=pieces.append, stop_strings=[stop, "never met"], **kw)
        self.assertEqual(text, free[:cut])
        self.assertEqual("".join(pieces), text)
        record = m.last_generation
        self.assertEqual(record["reason"], "stop_string")
        self.assertEqual(record["stop_string"], stop)
        # The generation ended at the token that completed it (one a byte: the byte tokenizer).
        self.assertEqual(record["tokens"], free_tokens[:len(record["tokens"])])
        self.assertLess(len(record["tokens"]), len(free_tokens))
        self.assertEqual(m.generate("ab", stop_strings=stop, **kw), text)  # one str; no stream
        # A batch: each str prompt on its own, as generate() gives it with seed + i.
        batch = m.generate_batch(["ab", "hello there"], stop_strings=[stop], **kw)
        self.assertEqual(batch[0], text)
        self.assertEqual(batch[1], m.generate("hello there", stop_strings=[stop], **dict(kw, seed=8)))
        got = [[], []]  # streamed, each prompt's pieces add up to its text (a held tail included)
        streamed = m.generate_batch(["ab", "hello there"], stop_strings=[stop, free[-1] + "\x00"],
                                    stream=lambda i, piece: got[i].append(piece), **kw)
        self.assertEqual(["".join(g) for g in got], streamed)
        self.assertEqual(streamed, batch)
        # Never met: the text as it was.
        self.assertEqual(m.generate("ab", stop_strings=["\x00never"], **kw), free)
        self.assertEqual(m.last_generation["reason"], "max_tokens")
        self.assertNotIn("stop_string", m.last_generation)
        for bad, why in ((["" ], "must not be empty"), ([3], "list of str"), (b"x", "str or a list of str"),
                         (["\ud800"], "not valid UTF-8")):
            with self.assertRaisesRegex(twell.TwellError, why):
                m.generate("ab", stop_strings=bad, **kw)
        with self.assertRaisesRegex(twell.TwellError, "stop_strings are matched in the text"):
            m.generate([256, 1], stop_strings=["x"], **kw)
        with self.assertRaisesRegex(twell.TwellError, "stop_strings are matched in the text"):
            m.generate_batch(["ab", [256, 1]], stop_strings=["x"], **kw)

    def test_an_exception_in_the_stream_callback_reaches_the_caller(self):
        def boom(_):
            raise KeyError("from the callback")
        with self.assertRaisesRegex(KeyError, "from the callback"):
            self.model.generate([256, 3], max_new_tokens=4, stream=boom)

    def test_batch_generation_streams_each_prompt(self):
        m = self.model
        prompts = ["ab", [256, 1, 2, 3], "hello there", [256]]
        kw = dict(max_new_tokens=9, temperature=1.0, seed=5)
        want = m.generate_batch(prompts, **kw)
        got = [[] for _ in prompts]
        out = m.generate_batch(prompts, stream=lambda i, piece: got[i].append(piece), **kw)
        self.assertEqual(out, want)
        for i, p in enumerate(prompts):
            self.assertEqual("".join(got[i]) if isinstance(p, str) else got[i], want[i], i)
        # True stops that prompt after the piece it was given; the others run on.
        count = [0] * len(prompts)

        def stop_third(i, _):
            count[i] += 1
            return i == 1 and count[i] == 3
        stopped = m.generate_batch(prompts, stream=stop_third, stop=False, max_new_tokens=9, temperature=1.0, seed=5)
        records = m.last_generation
        self.assertEqual(stopped[1], m.generate_batch(prompts, stop=False, max_new_tokens=9, temperature=1.0,
                                                     seed=5)[1][:3])
        self.assertEqual(records[1]["reason"], "callback")
        self.assertEqual([r["reason"] for r in records[2:]], ["max_tokens", "max_tokens"])

        def boom(i, _):
            if i == 2:
                raise KeyError("from the batch callback")
        with self.assertRaisesRegex(KeyError, "from the batch callback"):
            m.generate_batch(prompts, max_new_tokens=4, stream=boom)
        self.assertEqual(m.generate_batch(prompts, **kw), want)  # the model is still usable

    def test_calls_from_threads_wait_and_the_stream_cannot_reenter(self):
        m = self.model
        want = m.generate([256, 4, 5], max_new_tokens=6, stop=False)
        results, errors = [], []

        def work():
            try:
                results.append(m.generate([256, 4, 5], max_new_tokens=6, stop=False))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(results, [want] * 4)
        with self.assertRaisesRegex(twell.TwellError, "reset: called from the stream callback"):
            m.generate([256, 4], max_new_tokens=3, stream=lambda _: m.reset())
        # A generation from a generation's callback: the same error, and the Ctrl-C bookkeeping left clean.
        with self.assertRaisesRegex(twell.TwellError, "generate: called from the stream callback"):
            m.generate([256, 4], max_new_tokens=3, stream=lambda _: m.generate([256], max_new_tokens=1))
        self.assertEqual(twell.model._interruptible, [])
        self.assertEqual(m.generate([256, 4, 5], max_new_tokens=6, stop=False), want)  # still usable

    def test_perplexity_is_that_of_the_logits(self):
        m = self.model
        ids = [256, 72, 101, 108, 108, 111]
        nll = 0.0
        for row, nxt in zip(rows(m.logits(ids), 260), ids[1:]):
            top = max(row)
            nll += math.log(sum(math.exp(x - top) for x in row)) + top - row[nxt]
        want = math.exp(nll / (len(ids) - 1))
        self.assertAlmostEqual(m.perplexity(ids), want, delta=1e-5 * want)
        self.assertAlmostEqual(m.perplexity("Hello"), m.perplexity([256, 72, 101, 108, 108, 111]), delta=0)
        # In windows: as wide as the text, one forward; sliding by one token over windows of 3, each token's
        # loss from its window (the first two with less context).
        self.assertAlmostEqual(m.perplexity(ids, context=len(ids)), m.perplexity(ids), delta=1e-9 * want)
        slid = [m.token_nll(ids[:3])[0], m.token_nll(ids[:3])[1]] + \
               [m.token_nll(ids[t - 2:t + 1])[-1] for t in range(3, len(ids))]
        self.assertAlmostEqual(m.perplexity(ids, context=3, stride=1), math.exp(sum(slid) / len(slid)),
                               delta=1e-9 * want)
        with self.assertRaisesRegex(twell.TwellError, "stride must lie in"):
            m.perplexity(ids, context=3, stride=4)
        losses = m.token_nll(ids)  # each token's, whose mean is the perplexity's log
        self.assertEqual(len(losses), len(ids) - 1)
        self.assertAlmostEqual(math.exp(sum(losses) / len(losses)), m.perplexity(ids), delta=1e-12 * want)
        self.assertEqual(m.token_nll("Hello"), losses)
        with self.assertRaisesRegex(twell.TwellError, "at least 2 tokens"):
            m.token_nll([256])
        # stride= alone: windows of Model(context=), on the CPU backend too (which holds the whole context)
        short = twell.Model(self.dir, device="cpu", tokenizer="bytes", context=4)
        long_ids = ids * 3
        self.assertEqual(short.perplexity(long_ids, stride=2), short.perplexity(long_ids, context=4, stride=2))
        self.assertNotEqual(short.perplexity(long_ids, stride=2), m.perplexity(long_ids, stride=2))
        short.close()

    def test_ffn_stats_count_the_active_neurons(self):
        m = self.model
        stats = m.ffn_stats([256, 9, 8, 7])
        self.assertEqual(len(stats), 2)
        for s in stats:
            self.assertEqual(s["tokens"], 4)
            self.assertTrue(0 < s["nnz"] <= 4 * 128)
            self.assertAlmostEqual(s["nnz_per_token"], s["nnz"] / 4)
        self.assertEqual([s["tokens"] for s in m.ffn_stats([256])], [1, 1])  # one token: its forward
        # A text longer than the model's context of 64, in windows that do not overlap: every token once,
        # each window's counts those of its own forward.
        ids = [256] + [random.Random(4).randrange(256) for _ in range(150)]
        long = m.ffn_stats(ids)
        parts = [m.ffn_stats(ids[a:a + 64]) for a in range(0, len(ids), 64)]
        for layer, s in enumerate(long):
            self.assertEqual(s["tokens"], len(ids))
            self.assertEqual(s["nnz"], sum(p[layer]["nnz"] for p in parts))
            self.assertEqual(s["max_nnz_per_token"], max(p[layer]["max_nnz_per_token"] for p in parts))
        self.assertEqual(m.ffn_stats("some text", context=8)[0]["tokens"], len(m.encode("some text")))
        self.assertEqual([s["tokens"] for s in m.ffn_stats(ids[:65])], [65, 65])  # 64 + 1: the last token too
        for bad in (0, True, "8", 2**64 + 5):
            with self.assertRaisesRegex(twell.TwellError, "ffn_stats: context must be a number of tokens of at least 1"):
                m.ffn_stats(ids, context=bad)
        for kw in ({"context": 1}, {"context": 2**64 + 5}, {"stride": 0}, {"stride": True}):
            with self.assertRaisesRegex(twell.TwellError, "perplexity: (context|stride) must be a number of tokens"):
                m.perplexity(ids, **kw)

    def test_a_huge_token_count_stops_at_the_full_context(self):
        """The tokens' buffer is sized by what the context can hold, not by max_new_tokens; the CPU's
        whole-sequence calls leave a finished generation's cache as it is (the GPU's empty it)."""
        m = self.model
        context = m.config["context"]
        out = m.generate([256, 1], max_new_tokens=10**12, stop=False)
        self.assertEqual(m.last_generation["reason"], "context_full")
        self.assertLessEqual(len(out), context)
        batch = m.generate_batch([[256, 1], [256, 1, 2, 3]], max_new_tokens=10**12, stop=False)
        self.assertEqual([g["reason"] for g in m.last_generation], ["context_full"] * 2)
        self.assertEqual(len(batch[0]) - len(batch[1]), 2)
        cached = m.cached_tokens
        self.assertGreater(cached, 0)
        m.perplexity([256, 1, 2, 3])
        self.assertEqual(m.cached_tokens, cached)

    def test_bad_input_is_refused_with_the_reason(self):
        m = self.model
        with self.assertRaisesRegex(twell.TwellError, "260"):
            m.logits([1, 260])
        with self.assertRaisesRegex(twell.TwellError, "must be integers"):
            m.logits([1, 2.5])
        with self.assertRaisesRegex(twell.TwellError, "top_p"):
            m.generate([1], temperature=1.0, top_p=0.0)
        with self.assertRaisesRegex(twell.TwellError, "temperature must be a number, got str 'hot'"):
            m.generate([1], temperature="hot")
        with self.assertRaisesRegex(twell.TwellError, "one sequence of ids, 1-D, got a batch of 1: pass ids\\[0\\]"):
            m.logits([[1, 2, 3]])  # HF's input_ids [1, T]
        with self.assertRaisesRegex(twell.TwellError, "max_new_tokens"):
            m.generate([1], max_new_tokens=-1)
        for bad in (dict(seed=-1), dict(seed=2**64), dict(seed=1.5), dict(top_k=2.7), dict(top_k=-1)):
            with self.assertRaisesRegex(twell.TwellError, "seed must be|top_k must be"):
                m.generate([1], max_new_tokens=2, temperature=0.5, **bad)
        # Sampling settings at temperature 0 are said to do nothing (as `twell run` notes), not ignored silently.
        with self.assertWarnsRegex(UserWarning, "at temperature 0 the generation is greedy"):
            m.generate([1], max_new_tokens=1, top_p=0.5)
        with self.assertRaisesRegex(twell.TwellError, "no tokens"):
            m.logits([])
        too_long = [1] * (m.config["context"] + 1)
        with self.assertRaisesRegex(twell.TwellError, "exceed the model's context.*context= \\(and stride=\\)"):
            m.perplexity(too_long)
        with self.assertRaisesRegex(twell.TwellError, "exceed the model's context"):
            m.token_nll(too_long)
        with self.assertRaisesRegex(twell.TwellError, "device must be one of auto, cpu, cuda"):
            twell.Model(self.dir, device="gpu")
        with self.assertRaisesRegex(twell.TwellError, "no such|not found|No such|missing"):
            twell.Model(os.path.join(self.dir, "missing"), device="cpu")
        no_tok = twell.Model(self.dir, device="cpu", tokenizer=None)
        with self.assertRaisesRegex(twell.TwellError, "no tokenizer"):
            no_tok.generate("text")
        no_tok.close()
        with self.assertRaisesRegex(twell.TwellError, "closed"):
            no_tok.logits([1])
        if not twell.cuda_available():
            with self.assertRaisesRegex(twell.TwellError, "^device cuda: "):
                twell.Model(self.dir, device="cuda")
        with self.assertRaisesRegex(twell.TwellError, "'12XB' is not a size"):
            twell.Model(self.dir, gpu_memory="12XB")
        for bad in (-5, 0, "0.4", 2**64 + 5, 1.5):
            with self.assertRaisesRegex(twell.TwellError, "gpu_memory must be at least 1 byte"):
                twell.Model(self.dir, gpu_memory=bad)

    def test_integers_bytes_and_paths_are_taken_as_meant(self):
        m = self.model
        m.prefill([256, 1])
        want = rows(m.decode_step(5), 260)
        for bad in (2**32 + 5, 2.7, True, "5"):  # no truncation, wrap-around or bool as an id
            with self.assertRaisesRegex(twell.TwellError, "decode_step: token"):
                m.decode_step(bad)
        m.prefill([256, 1])
        self.assertEqual(rows(m.decode_step(5), 260), want)
        with self.assertRaisesRegex(twell.TwellError, "stop .*must be a list of integers, got int 5"):
            m.generate([256], max_new_tokens=2, stop=5)
        # stop=None is the model's default, as every argument left None: stop=True
        self.assertTrue(m._stop_ids(True))
        self.assertEqual(m._stop_ids(None), m._stop_ids(True))
        self.assertEqual(m.generate([256, 1], max_new_tokens=6, stop=None), m.generate([256, 1], max_new_tokens=6))
        for bad, why in ((5, "prompt must be a list of integers, got int 5"), (None, "prompt must be a list"),
                         ({"role": "user", "content": "hi"}, "this is one message: pass \\[message\\]")):
            with self.assertRaisesRegex(twell.TwellError, why):
                m.generate(bad, max_new_tokens=2)
        with self.assertRaisesRegex(twell.TwellError, "encode takes a str"):
            m.tokenizer.encode(5)
        for call in (lambda: m.tokenizer.encode("a\ud800b"), lambda: m.generate("a\ud800b", max_new_tokens=1)):
            with self.assertRaisesRegex(twell.TwellError, "not valid Unicode at character 1 \\('\\\\ud800'"):
                call()
        # bytes are the text's UTF-8, in generation as in scoring (not ids)
        self.assertEqual(m.generate(b"ab", max_new_tokens=4, stop=False), m.generate("ab", max_new_tokens=4, stop=False))
        self.assertEqual(m.perplexity(bytearray(b"hello")), m.perplexity("hello"))
        with self.assertRaisesRegex(twell.TwellError, "NUL"):
            twell.Model(self.dir + "\0/elsewhere", device="cpu")
        with self.assertRaisesRegex(twell.TwellError, "context must be a positive number"):
            twell.Model(self.dir, device="cpu", context=2**64 + 16)
        with self.assertRaisesRegex(twell.TwellError, "vocab_size must be"):
            twell.Tokenizer(bytes=True, vocab_size=-5)
        with self.assertRaisesRegex(twell.TwellError, "logits: 500000 tokens exceed the model's context"):
            m.logits([1] * 500_000)  # before 500000 x 260 floats are allocated for them
        try:
            import numpy
        except ImportError:
            return
        m.prefill([256, 1])
        self.assertEqual(rows(m.decode_step(numpy.array(5)), 260), want)  # a 0-d array, as argmax() gives
        ids = numpy.array([256, 7, 8], dtype=numpy.int64)
        self.assertEqual(m.generate(list(ids), max_new_tokens=numpy.int64(3), stop=numpy.array([257])),
                         m.generate([256, 7, 8], max_new_tokens=3, stop=[257]))
        self.assertEqual(twell.Model(self.dir, device="cpu", context=numpy.int32(32)).config["context"], 64)

    def test_copies_are_refused_and_bytes_paths_load(self):
        import copy
        import pickle
        for obj in (self.model, self.model.tokenizer):
            for make in (copy.copy, copy.deepcopy, pickle.dumps):
                with self.assertRaisesRegex(TypeError, "cannot be copied or pickled"):
                    make(obj)
        with twell.Model(os.fsencode(self.dir), device="cpu", tokenizer="bytes") as m:
            self.assertEqual(m.generate([256, 1], max_new_tokens=3, stop=False),
                             self.model.generate([256, 1], max_new_tokens=3, stop=False))

    def test_an_exception_in_a_log_handler_reaches_the_caller_and_frees_the_model(self):
        class Boom(Exception):
            pass

        class Raising(__import__("logging").Handler):
            def emit(self, record):
                raise Boom(record.getMessage())

        handler = Raising()
        handler.handleError = lambda record: (_ for _ in ()).throw(sys.exc_info()[1])  # not printed: raised
        twell.model._log.addHandler(handler)
        twell.model._log.setLevel("INFO")
        try:
            with self.assertRaises(Boom):
                twell.Model(self.dir, device="cpu", tokenizer="bytes")
        finally:
            twell.model._log.removeHandler(handler)

    def test_a_tokenizer_is_not_closed_under_a_running_generation(self):
        m = twell.Model(self.dir, device="cpu", tokenizer="bytes")
        with self.assertRaisesRegex(twell.TwellError, "close it after that returns"):
            m.generate("ab", max_new_tokens=5, stream=lambda _: m.tokenizer.close())
        self.assertEqual(m.generate("ab", max_new_tokens=3), self.model.generate("ab", max_new_tokens=3))
        m.tokenizer.close()
        with self.assertRaisesRegex(twell.TwellError, "Tokenizer: closed"):
            m.encode("a")
        m.close()

    def test_a_ctrl_c_that_ctypes_drops_still_stops_and_reaches_the_caller(self):
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            self.skipTest("SIGINT has a handler of its own here")
        calls, streamed = [0], [0]
        real_single, real_batch = _capi.TOKEN_FN, _capi.BATCH_TOKEN_FN

        def at_third_call(real, interrupt):
            """The C callback type, with interrupt() at the third call's entry: what it returns (not None) is the
            call's, the Python callback unrun."""
            def make(fn=None):
                if fn is None:
                    return real()

                def entry(*args):
                    calls[0] += 1
                    if calls[0] == 3 and (returned := interrupt()) is not None:
                        return returned
                    return fn(*args)
                return real(entry)
            return make

        def dropped():
            """A Ctrl-C that ctypes drops before the Python callback runs (it reports the KeyboardInterrupt; what
            the C side then reads is not defined: here 0, go on)."""
            try:
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            except KeyboardInterrupt:
                return 0

        def dropping(real):
            return at_third_call(real, dropped)

        def stream(*_):
            streamed[0] += 1
        try:
            _capi.TOKEN_FN, _capi.BATCH_TOKEN_FN = dropping(real_single), dropping(real_batch)
            for run in (lambda: self.model.generate([256, 3], max_new_tokens=20, stop=False, stream=stream),
                        lambda: self.model.generate_batch([[256, 3], "ab"], max_new_tokens=20, stop=False,
                                                          stream=stream)):
                calls[0] = streamed[0] = 0
                with self.assertRaises(KeyboardInterrupt):
                    run()
                self.assertEqual(streamed[0], 2)  # the calls after the dropped one stopped it, not streaming
                self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
        finally:
            _capi.TOKEN_FN, _capi.BATCH_TOKEN_FN = real_single, real_batch

        # A real Ctrl-C (the signal itself) at a token of a generation without a stream: it stops there, and
        # the KeyboardInterrupt ctypes cannot pass out of the callback is not printed as an ignored exception.
        def signalling(real):  # Python's handler runs at the next instruction
            return at_third_call(real, lambda: os.kill(os.getpid(), signal.SIGINT))
        try:
            _capi.TOKEN_FN, _capi.BATCH_TOKEN_FN = signalling(real_single), signalling(real_batch)
            for run in (lambda: self.model.generate([256, 3], max_new_tokens=20, stop=False),
                        lambda: self.model.generate_batch([[256, 3], [256]], max_new_tokens=20, stop=False)):
                calls[0] = 0
                err = io.StringIO()
                with contextlib.redirect_stderr(err), self.assertRaises(KeyboardInterrupt):
                    run()
                # Stopped at the calls after the signal's: the interrupted call's return value is not defined,
                # so its sequence may take one more step (2 prompts: at most 5 calls).
                self.assertLessEqual(calls[0], 5)
                self.assertEqual(err.getvalue(), "")
                self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
                self.assertIsNot(sys.unraisablehook, twell.model._quiet_interrupts)
        finally:
            _capi.TOKEN_FN, _capi.BATCH_TOKEN_FN = real_single, real_batch

        def handled(_):  # a callback that catches Ctrl-C itself and stops quietly: no KeyboardInterrupt after
            calls[0] += 1
            if calls[0] == 2:
                try:
                    signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
                except KeyboardInterrupt:
                    return True
        calls[0] = 0
        self.assertEqual(len(self.model.generate([256, 3], max_new_tokens=20, stop=False, stream=handled)), 2)
        self.assertEqual(self.model.last_generation["reason"], "callback")

    def test_a_gpu_memory_cap_below_the_models_needs_runs_it_on_the_cpu(self):
        with twell.Model(self.dir, gpu_memory="1KB", tokenizer="bytes") as m:
            self.assertEqual(m.device, "cpu")
            self.assertEqual(len(m.generate([256, 1], max_new_tokens=3, stop=False)), 3)
        if twell.cuda_available():
            with self.assertRaisesRegex(twell.TwellError, "of which 1.0 KB may be used \\(gpu_memory\\)"):
                twell.Model(self.dir, device="cuda", gpu_memory=1000)

    def test_weights_with_nan_are_refused_unless_asked(self):
        folder = tempfile.mkdtemp(prefix="twell_py_nan_")
        try:
            write_model(folder, nan_at="model.layers.1.mlp.down_proj.weight")
            with self.assertRaisesRegex(twell.TwellError, "model.layers.1.mlp.down_proj.weight"):
                twell.Model(folder, device="cpu")
            unchecked = twell.Model(folder, device="cpu", check_finite=False, tokenizer="bytes")
            logits = unchecked.logits([256, 1, 2])
            if any(math.isnan(x) for row in rows(logits, 260) for x in row):
                # a perplexity of NaN is refused as eval refuses it, in one forward too
                with self.assertRaisesRegex(twell.TwellError, "not finite"):
                    unchecked.perplexity([256, 1, 2])
            unchecked.close()
        finally:
            shutil.rmtree(folder)


@unittest.skipUnless(twell.cuda_available(), "no Hopper GPU: " + twell.cuda_unavailable_reason())
class ModelOnTheGpu(unittest.TestCase):
    def test_gpu_logits_and_generation_match_the_cpu(self):
        folder = tempfile.mkdtemp(prefix="twell_py_gpu_")
        try:
            write_model(folder)
            cpu = twell.Model(folder, device="cpu", tokenizer="bytes")
            for ffn in ("twell", "dense"):
                gpu = twell.Model(folder, device="cuda", ffn=ffn, context=64, tokenizer="bytes")
                self.assertEqual(gpu.device, "cuda")
                ids = [256] + [random.Random(ffn).randrange(258) for _ in range(40)]
                self.assertLess(relative_error(gpu.logits(ids), cpu.logits(ids)), 1e-2, ffn)  # bf16 weights on the GPU
                out = gpu.generate([256, 40, 41], max_new_tokens=6, stop=False)
                self.assertEqual(len(out), 6)
                self.assertEqual(gpu.cached_tokens, 3 + 6 - 1)
                # A finished generation does not stand in the way of whole-sequence calls (they run in the
                # KV cache's memory on the GPU): the cache is emptied first; one in progress is refused.
                self.assertGreater(gpu.perplexity(ids), 1.0)
                self.assertEqual(gpu.cached_tokens, 0)
                gpu.prefill([256, 40])
                with self.assertRaisesRegex(twell.TwellError, "generation in progress"):
                    gpu.perplexity(ids)
                self.assertEqual(gpu.cached_tokens, 2)
                gpu.close()
            # A batch of prompts of different lengths, sampled on the GPU: as many tokens as asked, the same
            # tokens again from the same seed, and no more prompts than max_batch.
            gpu = twell.Model(folder, device="cuda", context=64, tokenizer="bytes", max_batch=3)
            self.assertEqual(gpu.max_batch, 3)
            prompts = [[256, 40, 41], "a longer prompt", [256]]
            first = gpu.generate_batch(prompts, max_new_tokens=6, temperature=0.8, seed=2, stop=False)
            self.assertEqual([len(g["tokens"]) for g in gpu.last_generation], [6, 6, 6])
            self.assertEqual(first[0], gpu.last_generation[0]["tokens"])
            self.assertEqual(gpu.generate_batch(prompts, max_new_tokens=6, temperature=0.8, seed=2, stop=False), first)
            with self.assertRaisesRegex(twell.TwellError, "1 to 3"):
                gpu.generate_batch(prompts + [[256]])
            gpu.close()
            # Activations for 16 tokens a forward: 41 tokens' logits in chunks, as the CPU's.
            with twell.Model(folder, device="cuda", context=64, tokenizer="bytes", max_batch_tokens=16) as small:
                ids = [256] + [random.Random(7).randrange(258) for _ in range(40)]
                self.assertLess(relative_error(small.logits(ids), cpu.logits(ids)), 1e-2)
                # The FFN statistics on the GPU too: every token counted, the non-zeros near the CPU's.
                for got, want in zip(small.ffn_stats(ids), cpu.ffn_stats(ids)):
                    self.assertEqual(got["tokens"], len(ids))
                    self.assertLessEqual(abs(got["nnz"] - want["nnz"]), 0.02 * want["nnz"] + 1)
            # Without a KV cache: whole-sequence calls, and a generation of one token; more is refused before
            # the prompt's forward, with no token passed to the stream.
            with twell.Model(folder, device="cuda", context=64, tokenizer="bytes", kv_cache=False) as bare:
                self.assertLess(relative_error(bare.logits(ids), cpu.logits(ids)), 1e-2)
                self.assertEqual(len(bare.generate([256, 40], max_new_tokens=1, stop=False)), 1)
                seen = []
                with self.assertRaisesRegex(twell.TwellError, "without a KV cache.*at most one token"):
                    bare.generate([256, 40], max_new_tokens=2, stop=False, stream=seen.append)
                self.assertEqual(seen, [])
            cpu.close()
        finally:
            shutil.rmtree(folder)


class _ListHandler(__import__("logging").Handler):
    def __init__(self, lines):
        super().__init__()
        self.lines = lines

    def emit(self, record):
        self.lines.append(record.getMessage())


class MetaspaceTokenizer(unittest.TestCase):
    """A Llama 2-style tokenizer (Metaspace, whose decoder strips a leading space): what generate() returns is
    what it streams and what `twell run` prints after the prompt, not the new ids decoded alone."""

    def test_generate_returns_the_streamed_text(self):
        fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "model", "data",
                               "bpe_llama2.json")
        with open(fixture) as f:
            tok = json.load(f)
        vocab = 1 + max(list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])])
        folder = tempfile.mkdtemp(prefix="twell_py_llama2_")
        try:
            write_model(folder, dict(CONFIG, vocab_size=vocab, bos_token_id=1, eos_token_id=2))
            shutil.copy(fixture, os.path.join(folder, "tokenizer.json"))
            with twell.Model(folder, device="cpu") as m:
                for seed in (37, 75, 104, 0, 1):  # the first three draw a word-initial token ("▁H", "▁c") first
                    pieces = []
                    out = m.generate("日本", max_new_tokens=6, temperature=1.0, seed=seed, stream=pieces.append)
                    self.assertEqual(out, "".join(pieces), seed)
                    self.assertEqual(m.generate("日本", max_new_tokens=6, temperature=1.0, seed=seed), out, seed)
                    self.assertEqual(m.generate_batch(["日本"], max_new_tokens=6, temperature=1.0, seed=seed), [out])
                    if seed == 37:
                        self.assertTrue(out.startswith(" H"), out)  # decoded alone, the space was lost
        finally:
            shutil.rmtree(folder)


class SpecialTokens(unittest.TestCase):
    """skip_special_tokens, as HF's decode(skip_special_tokens=True): the byte-level BPE fixture's special added
    tokens (<|endoftext|> 0, <mask> 305, <sep> 306) leave the text, the rest stays as it was."""

    def test_skip_special_tokens_leaves_them_out(self):
        fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "model", "data",
                               "bpe_gpt2.json")
        folder = tempfile.mkdtemp(prefix="twell_py_special_")
        self.addCleanup(shutil.rmtree, folder)
        write_model(folder, dict(CONFIG, vocab_size=310))
        shutil.copy(fixture, os.path.join(folder, "tokenizer.json"))
        with twell.Model(folder, device="cpu") as m:
            tok = m.tokenizer
            self.assertEqual(tok.special_ids, [0, 305, 306])
            ids = tok.encode("a<sep>b<mask> c<word>")
            self.assertIn(306, ids)
            self.assertEqual(tok.decode(ids), "a<sep>b<mask> c<word>")
            self.assertEqual(tok.decode(ids, skip_special_tokens=True), "ab c<word>")
            kw = dict(max_new_tokens=60, temperature=50.0, seed=5, stop=False)
            kept = m.generate_batch(["a<sep>b"] * 16, **kw)
            skipped = m.generate_batch(["a<sep>b"] * 16, skip_special_tokens=True, **kw)
            specials = sum(t.count(s) for t in kept for s in ("<|endoftext|>", "<mask>", "<sep>"))
            self.assertGreater(specials, 0, "the test needs special tokens in the new text")
            for a, b in zip(kept, skipped):
                for s in ("<|endoftext|>", "<mask>", "<sep>"):
                    a = a.replace(s, "")
                self.assertEqual(a, b)
            pieces = []
            one = m.generate("a<sep>b", skip_special_tokens=True, stream=pieces.append, **kw)
            self.assertEqual(one, skipped[0])
            self.assertEqual("".join(pieces), one)



class ChatTemplates(unittest.TestCase):
    """Chat templates from Python: twell.ChatTemplate renders the C++ tests' fixture cases (jinja2's texts) as
    they stand, the same as transformers' apply_chat_template where transformers is installed; a model's
    tokenizer finds its template and special tokens; generate() takes a conversation, continuing the text the
    template makes (no BOS added) and returning the reply."""

    DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "model", "data")

    def test_fixture_cases_render_as_jinja2(self):
        with open(os.path.join(self.DATA, "chat_templates.json"), encoding="utf-8") as f:
            fixture = json.load(f)
        def render(case):
            t = twell.ChatTemplate(fixture["templates"][case["template"]], fixture["special_tokens"])
            try:
                return t.apply(case["messages"], case["add_generation_prompt"], **case["variables"])
            finally:
                t.close()
        for case in fixture["cases"][::3]:  # a third of them: the C++ test runs them all
            if "error" in case:  # where the template is parsed, or rendered
                with self.assertRaises(twell.TwellError, msg=case["name"]):
                    render(case)
            else:
                self.assertEqual(render(case), case["text"], case["name"])
        with self.assertRaisesRegex(twell.TwellError, "ChatTemplate.load: name must be a str, got bytes"):
            twell.ChatTemplate.load(self.DATA, name=b"tool_use")

    def test_same_as_transformers(self):
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template
        except ImportError:
            self.skipTest("transformers is not installed")
        template = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}<<{{ m.content|trim }}>>"
                    "{% else %}[{{ m.role|upper }}] {{ m.content }}{% if not loop.last %}\n{% endif %}{% endif %}"
                    "{% endfor %}{% if add_generation_prompt %} [ASSISTANT]{% endif %}"
                    "{% if tools %}{{ tools|tojson }}{% endif %}")
        special = {"bos_token": "<s>", "eos_token": "</s>"}
        rng = random.Random(5)
        words = ["hi", " é ", "ünï", "\n", "\"q\"", "<b>", "😀", "  ", "x" * 20]
        for trial in range(60):
            messages = [{"role": rng.choice(["system", "user", "assistant"]),
                         "content": "".join(rng.choice(words) for _ in range(rng.randrange(4)))}
                        for _ in range(rng.randrange(1, 5))]
            agp = bool(trial % 2)
            tools = [{"name": "f", "n": rng.random()}] if trial % 3 == 0 else None
            want = _compile_jinja_template(template).render(messages=messages, add_generation_prompt=agp,
                                                            tools=tools, documents=None, **special)
            got = twell.ChatTemplate(template, special).apply(messages, agp, **({"tools": tools} if tools else {}))
            self.assertEqual(got, want, messages)

    def test_model_conversation(self):
        folder = tempfile.mkdtemp(prefix="twell_py_chat_")
        self.addCleanup(shutil.rmtree, folder)
        write_model(folder, dict(CONFIG, vocab_size=310))
        shutil.copy(os.path.join(self.DATA, "bpe_gpt2.json"), os.path.join(folder, "tokenizer.json"))
        with twell.Model(folder, device="cpu") as m:
            self.assertIsNone(m.tokenizer.chat_template)
            with self.assertRaisesRegex(twell.TwellError, "no chat template"):
                m.generate([{"role": "user", "content": "hi"}])
            self.assertEqual(m.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                             chat_template="<sep>{{ messages[0].content }}"), "<sep>hi")
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": "<|endoftext|>", "chat_template":
                       "{% for m in messages %}<sep>{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
                       "{% if add_generation_prompt %}<mask>{% endif %}"}, f)
        with twell.Model(folder, device="cpu", max_batch=2) as m:
            tok = m.tokenizer
            self.assertEqual(tok.special_tokens_map, {"eos_token": "<|endoftext|>"})
            conversation = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
            text = "<sep>system: be brief<|endoftext|><sep>user: hi<|endoftext|><mask>"
            self.assertEqual(tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False), text)
            self.assertEqual(tok.apply_chat_template(conversation, add_generation_prompt=True), tok.encode(text))
            self.assertEqual(tok.apply_chat_template([conversation, conversation[1:]], add_generation_prompt=True,
                                                     tokenize=False), [text, text[text.index("<sep>user"):]])
            for bad, why in (({"continue_final_message": True}, "continue_final_message= is transformers'"),
                             ({"return_tensors": "pt"}, "return_tensors="), ({}, "the conversation is empty")):
                with self.assertRaisesRegex(twell.TwellError, why):
                    tok.apply_chat_template(conversation if bad else [], **bad)
            with twell.ChatTemplate("{{ messages|length }}", {"bos_token": None}) as t:  # None: no such token
                self.assertEqual(t.apply(conversation), "2")
                self.assertEqual((t.source, t.text), ("chat template", "{{ messages|length }}"))
            self.assertIn("tokenizer_config.json (chat_template)", tok.chat_template.source)
            self.assertIn("<mask>{% endif %}", tok.chat_template.text)
            with self.assertRaisesRegex(twell.TwellError, "NUL"):
                twell.ChatTemplate("a\0b")
            with self.assertRaisesRegex(twell.TwellError, "must be a JSON object"):
                m.generate([{"role": "user", "content": "hi"}, "oops"])
            kw = dict(max_new_tokens=8, temperature=1.5, seed=4, stop=False)
            reply = m.generate(conversation, **kw)
            self.assertEqual(m.generate(text, **kw), reply)  # this tokenizer adds no BOS to a text either
            pieces = []
            self.assertEqual(m.generate(conversation, stream=pieces.append, **kw), reply)
            self.assertEqual("".join(pieces), reply)
            self.assertEqual(m.generate_batch([conversation, text], **kw)[0], reply)
            with self.assertRaisesRegex(twell.TwellError, "a conversation .* is one prompt"):
                m.generate_batch(conversation)
            with self.assertRaisesRegex(twell.TwellError, "JSON data"):
                tok.apply_chat_template([{"role": "user", "content": object()}])
        # python/examples/chat.py: two turns on stdin, the second taking the first from the cache.
        example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "chat.py")
        run = subprocess.run([sys.executable, example, folder, "--device", "cpu", "--max-new-tokens", "4"],
                             input="hi\nyo\n", capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        cached = [int(n) for n in re.findall(r"; (\d+) of the prompt's cached", run.stderr)]
        self.assertEqual(len(cached), 2, run.stderr)
        self.assertEqual(cached[0], 0)
        self.assertGreater(cached[1], 5, run.stderr)
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump({"chat_template": "{% for m in messages %}"}, f)
        with twell.Model(folder, device="cpu") as m:  # a template that does not parse: said where it is used
            with self.assertRaisesRegex(twell.TwellError, "tokenizer_config.json.*endfor"):
                m.generate([{"role": "user", "content": "hi"}])

if __name__ == "__main__":
    unittest.main()
