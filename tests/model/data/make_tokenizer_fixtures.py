#!/usr/bin/env python3
"""Writes the tokenizer fixtures for tests/model/test_tokenizer.cpp and the ids that the
HuggingFace `tokenizers` library gives for them (the test suite itself needs no Python).

    pip install tokenizers && python3 make_tokenizer_fixtures.py          # from this folder
    python3 make_tokenizer_fixtures.py --print-tables   # Unicode tables of src/model/tokenizer.cpp (~15 s)

Three small byte-level BPE tokenizer.json files share one vocabulary (the 256 byte tokens plus
a few dozen merges) and differ in what the C++ side must handle:
  bpe_gpt2.json    "a b" merges, ByteLevel pre-tokenizer, added tokens with lstrip/rstrip/single_word
                   (and two that start with whitespace)
  bpe_smollm.json  ["a", "b"] merges, Sequence[Digits(individual), ByteLevel], ignore_merges,
                   chat special tokens (as SmolLM ships)
  bpe_prefix.json  Sequence[Digits(contiguous), ByteLevel(add_prefix_space)]
  bpe_llama3.json  Sequence[Split(the Llama-3 regex, Isolated), ByteLevel(use_regex=false)],
                   ignore_merges (as Llama 3 ships)
and one SentencePiece-style BPE with a vocabulary of its own:
  bpe_llama2.json  normalizer Prepend("▁") + Replace(" " -> "▁"), no pre-tokenizer, characters as
                   symbols, byte_fallback to <0xHH>, the decoder Llama 2 ships, and two added
                   tokens with normalized = true (as `add_tokens` makes them)
  bpe_llama2_metaspace.json  the same in the newer layout: no normalizer, Metaspace pre-tokenizer
                   (prepend_scheme "first", not split), as Mistral's and legacy=False conversions ship
"""
import json
import random
import sys


def bytes_to_unicode():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    mapping, n = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + n)
            n += 1
    return mapping


B2U = bytes_to_unicode()


def bl(text):
    return "".join(B2U[b] for b in text.encode("utf-8"))


# Merges as pairs of plain text pieces; both halves must already be tokens.
MERGE_TEXT = [
    (" ", "t"), ("h", "e"), (" t", "he"), ("i", "n"), ("e", "r"), (" ", "a"), ("o", "n"),
    ("r", "e"), (" ", "w"), ("o", "r"), ("l", "l"), (" ", "s"), ("e", "n"), ("'", "s"),
    ("in", "g"), (" ", "c"), ("a", "t"), (" c", "at"), (" s", "at"), (" ", "o"), (" o", "n"),
    (" ", "m"), (" m", "at"), ("H", "e"), ("He", "ll"), ("Hell", "o"), (" w", "or"),
    ("l", "d"), (" wor", "ld"), ("1", "2"), ("12", "3"), (" ", " "),
    ("  ", "  "), ("\n", "\n"), ("a", "a"), ("aa", "aa"), ("c", "a"), ("ca", "f"),
]
# build() adds merges inside multi-byte characters (é, 你, 好) at byte boundaries.


def build():
    vocab = {"<|endoftext|>": 0}
    for b in range(256):
        vocab[B2U[b]] = len(vocab)
    merges = []

    def add(a, b):
        assert a in vocab and b in vocab, (a, b)
        merges.append((a, b))
        if a + b not in vocab:
            vocab[a + b] = len(vocab)

    for a, b in MERGE_TEXT:
        add(bl(a), bl(b))
    e_acute = bl("é")          # two byte-level characters
    add(e_acute[0], e_acute[1])
    add(bl("caf"), e_acute)
    ni, hao = bl("你"), bl("好")  # three byte-level characters each
    add(ni[0], ni[1]); add(ni[:2], ni[2])
    add(hao[0], hao[1]); add(hao[:2], hao[2])
    add(ni, hao)
    add(bl("'"), bl("t"))
    add(bl(" "), bl("1"))
    vocab[bl(" hello")] = len(vocab)  # reachable only whole, through ignore_merges
    return vocab, merges


LLAMA2_MERGES = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("i", "n"), ("e", "r"), ("▁", "a"), ("o", "n"),
                 ("r", "e"), ("▁", "w"), ("o", "r"), ("l", "l"), ("▁", "s"), ("e", "n"), ("in", "g"),
                 ("▁", "c"), ("a", "t"), ("▁c", "at"), ("▁", "H"), ("▁H", "e"), ("▁He", "ll"), ("▁Hell", "o"),
                 ("▁w", "or"), ("l", "d"), ("▁wor", "ld"), ("1", "2"), ("▁", "▁"), ("▁▁", "▁▁"), ("c", "a"),
                 ("ca", "f"), ("caf", "é"), ("'", "s"), ("▁", "1")]


def llama2_metaspace_tokenizer():
    """The same vocabulary in the layout of newer conversions (Mistral's, Llama 2's with legacy=False):
    no normalizer, a Metaspace pre-tokenizer that puts "▁" in front of the text's first piece only."""
    spec = llama2_tokenizer()
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    # an added token the model's vocabulary lacks: where it is not matched (single_word, between letters)
    # the model makes the character's bytes, not the token
    spec["added_tokens"].append(added_token(len(spec["model"]["vocab"]) + 2, "\n", special=False, single_word=True))
    return spec


def llama2_tokenizer():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    chars = ["▁"] + list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'\"-_()[]:;") + ["é", "ñ"]
    for c in chars:
        vocab[c] = len(vocab)
    for a, b in LLAMA2_MERGES:
        assert a in vocab and b in vocab, (a, b)
        vocab.setdefault(a + b, len(vocab))
    n = len(vocab)
    # Added tokens with normalized = true are matched in the normalized text, their content normalized
    # too ("▁<word>", "▁o▁w"): not after a letter, and not at the start of a piece after another token.
    special = [added_token(0, "<unk>"), added_token(1, "<s>"), added_token(2, "</s>"),
               added_token(n, "<word>", special=False, normalized=True),
               added_token(n + 1, "o w", special=False, normalized=True)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": None,
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": [[a, b] for a, b in LLAMA2_MERGES]}}


def tokenizer_json(vocab, merges, *, merges_as_arrays, pre_tokenizer, added, ignore_merges):
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "vocab": vocab,
             "merges": [[a, b] for a, b in merges] if merges_as_arrays else [f"{a} {b}" for a, b in merges]}
    if ignore_merges is not None:
        model["ignore_merges"] = ignore_merges
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": pre_tokenizer,
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                               "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": model}


def added_token(id_, content, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": normalized, "special": special}


def byte_level(add_prefix_space, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": use_regex}


# The pre-tokenizer regex of Llama 3's tokenizer.json (tiktoken's cl100k pattern).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


TEXTS = [
    "", " ", "Hello world", "the cat sat on the mat", "hello Hello HELLO hello",
    "I'm can't we'll they've he'd it's you're I'M 'S", "don't's x'sy 're' '''' '",
    "café naïve résumé", "cafe\u0301 e\u0301", "你好世界 日本語 你好你好", "👋🏽 🎉 emoji👍 👨‍👩‍👧",
    "a   b\t\tc  \n\n  d   ", "   leading", "trailing   ", "\n", "\n\n\n", "line1\nline2\r\nline3",
    "12345 3.14 1,000,000 abc123def 123123", "٣٤٥ ½ Ⅻ ²", "!!!...??? ---", "aaaaaaa aaaa",
    "nbsp\u00a0here\u3000ideographic\u2003em", "tab\tsep", "\u200dzwj\ufeffbom",
    "<|endoftext|>Hello<|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n", "x <mask> y",
    "a<sep>  b", "<word> in a<word>b <word>_", "<|endoftext|><|endoftext|>", "<|endoftext", "Ελληνικά Кириллица עברית العربية",
    # for the Llama-3 pattern: case-insensitive contractions, digit triples, newline runs,
    # punctuation that takes trailing newlines, a non-letter glued to the next word
    "I'M YOU'RE THEY'VE IT'S 'Ll 'D", "1 12 123 1234 12345678 ٣٤٥٦", "a\n\n\nb\r\n\r\nc",
    "end.\n\nNext!!\n x", "  \n  \n  y", "$hello #tag @user _under", "\tword\t\tword", "hi \n",
    "x  \t\n", "...\r\n", "'hello' \"quoted\"", "a1b2c3 1a 12ab",
    # word characters beside a single_word token as HF's matcher has them (marks, joiners, connector
    # punctuation and other alphabetics are; superscripts and fractions are not)
    "<word>\u0301 <word>\u200d \u203f<word> <word>\u24b6 <word>\u0939\u093f", "<word>\u00b2 \u00bd<word> <word>\u2460",
    # a token starting inside the whitespace an rstrip token takes is a token too, and the text after it
    # text again
    "<sep> spacey", "<sep>   spacey x<sep>\n spacey", "<sep>  spacey!", "<sep> spacey  x", "a\nb a \n b", "<sep>\n\n\n  x",
]

ALPHABET = list("abcHe lo'stm\n\t1239 .,!?_-") + ["  ", "é", "e\u0301", "你", "好", "👍", "٣", "½",
            "\u00a0", "\u3000", "<|endoftext|>", "<|im_start|>", "<mask>", "<sep>", "<word>", "'s", "'re", " hello"]


def random_texts(count, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 24))) for _ in range(count)]


def print_tables():
    """The non-ASCII code points that HF's ByteLevel regex takes as \\p{L} and \\p{N} (its Unicode
    version, newer than Python's unicodedata), found by asking the pre-tokenizer whether "a" + c
    (or "0" + c) stays one piece; and those its added-token matcher takes as word characters around a
    single_word token (Rust's \\w: letters and other alphabetics, marks, decimal digits, connector
    punctuation, joiners), found by asking whether "<w>" + c still holds the token; printed as the
    C++ range tables."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    single_word = Tokenizer(models.BPE())
    single_word.add_tokens([AddedToken("<w>", single_word=True, normalized=False)])
    w = single_word.token_to_id("<w>")
    letters, numbers, words = [], [], []
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if len(byte_level.pre_tokenize_str("a" + chr(cp))) == 1:
            letters.append(cp)
        if len(byte_level.pre_tokenize_str("0" + chr(cp))) == 1:
            numbers.append(cp)
        if w not in single_word.encode("<w>" + chr(cp), add_special_tokens=False).ids:
            words.append(cp)

    def ranges(cps):
        out = []
        for cp in cps:
            if out and out[-1][1] == cp - 1:
                out[-1][1] = cp
            else:
                out.append([cp, cp])
        return out

    for name, cps in (("kLetterRanges", letters), ("kNumberRanges", numbers), ("kWordRanges", words)):
        print(f"constexpr CodeRange {name}[] = {{")
        line = "   "
        for a, b in ranges(cps):
            item = f"{{0x{a:X}, 0x{b:X}}},"
            if len(line) + 1 + len(item) > 99:
                print(line)
                line = "   "
            line += " " + item
        print(line)
        print("};")


def main():
    if "--print-tables" in sys.argv:
        print_tables()
        return
    from tokenizers import Tokenizer

    vocab, merges = build()
    n = len(vocab)
    gpt2_added = [added_token(0, "<|endoftext|>"), added_token(n, "<mask>", lstrip=True),
                  added_token(n + 1, "<sep>", rstrip=True),
                  added_token(n + 2, "<word>", special=False, normalized=True, single_word=True),
                  added_token(n + 3, " spacey", special=False), added_token(n + 4, "\n\n", special=False)]
    chat_added = [added_token(0, "<|endoftext|>"), added_token(n, "<|im_start|>"), added_token(n + 1, "<|im_end|>")]
    digits = lambda individual: {"type": "Digits", "individual_digits": individual}
    fixtures = {
        "bpe_gpt2.json": tokenizer_json(vocab, merges, merges_as_arrays=False, pre_tokenizer=byte_level(False),
                                        added=gpt2_added, ignore_merges=None),
        "bpe_smollm.json": tokenizer_json(vocab, merges, merges_as_arrays=True,
                                          pre_tokenizer={"type": "Sequence",
                                                         "pretokenizers": [digits(True), byte_level(False)]},
                                          added=chat_added, ignore_merges=True),
        "bpe_prefix.json": tokenizer_json(vocab, merges, merges_as_arrays=False,
                                          pre_tokenizer={"type": "Sequence",
                                                         "pretokenizers": [digits(False), byte_level(True)]},
                                          added=chat_added, ignore_merges=False),
        "bpe_llama3.json": tokenizer_json(
            vocab, merges, merges_as_arrays=True,
            pre_tokenizer={"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
                byte_level(False, use_regex=False)]},
            added=chat_added, ignore_merges=True),
        "bpe_llama2.json": llama2_tokenizer(),
        "bpe_llama2_metaspace.json": llama2_metaspace_tokenizer(),
    }
    texts = TEXTS + random_texts(60, seed=5)
    expected = {"tokenizers_version": __import__("tokenizers").__version__, "cases": {}}
    for name, spec in fixtures.items():
        text = json.dumps(spec, ensure_ascii=False, indent=1)
        with open(name, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        tok = Tokenizer.from_str(text)
        cases = []
        for t in texts:
            ids = tok.encode(t, add_special_tokens=False).ids
            cases.append({"text": t, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
        expected["cases"][name] = cases
    # One case a line, so that a diff shows which expectation changed.
    with open("bpe_expected.json", "w", encoding="utf-8") as f:
        f.write('{"tokenizers_version": %s, "cases": {\n' % json.dumps(expected["tokenizers_version"]))
        for i, (name, cases) in enumerate(expected["cases"].items()):
            f.write(' %s: [\n' % json.dumps(name))
            f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
            f.write("\n ]%s\n" % ("," if i + 1 < len(expected["cases"]) else ""))
        f.write("}}\n")


if __name__ == "__main__":
    main()
