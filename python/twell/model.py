"""Whole models from Python: a HuggingFace Llama-style checkpoint on twell's GPU runtime (the sparse
TwELL FFN where it pays) or on its CPU reference backend, with its tokenizer.

    import twell
    model = twell.Model("models/smol")              # config.json, safetensors, tokenizer.json
    model.generate("The capital of France is", max_new_tokens=20)
    model.generate("Once upon", temperature=0.8, top_p=0.95, seed=1, stream=lambda t: print(t, end=""))
    model.perplexity(open("wiki.txt", "rb").read())  # the file's bytes, as `twell eval` reads it
    chat = twell.Model("models/smol-instruct")      # a chat model: its chat template makes the prompt
    chat.generate([{"role": "user", "content": "Hi!"}], max_new_tokens=40)
    logits = model.logits(model.encode("Hello"))    # torch.Tensor [T, vocab], float32

What each call computes is that of the C++ API (include/twell/model/llama.h, load.h) through the C
interface (include/twell/c_api.h). Needs no PyTorch: without it, logits come back as a numpy array, or
without numpy either as a memoryview of floats with shape (T, vocab) (.tolist() gives its rows).
"""
import contextlib
import ctypes
import json
import logging
import math
import numbers
import os
import signal
import sys
import threading
import warnings

from . import _capi
from ._capi import TwellError, _int, _integer

__all__ = ["ChatTemplate", "Model", "Tokenizer"]

# twell_model_generation_sampling's bits: the sampling arguments a caller gave (_sampling unpacks them in this order).
_SAMPLE_BITS = {"temperature": 1, "top_k": 2, "top_p": 4, "min_p": 8, "repetition_penalty": 16}
_SAMPLE_ALL = 31

_log = logging.getLogger("twell")


def _id_list(values, what="ids"):
    """A sequence of ints (or a 1-D integer tensor or array) as a list of token ids, each checked."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, numbers.Integral) or not hasattr(values, "__iter__"):
        raise TwellError(f"{what} must be a list of integers, got {type(values).__name__} {values!r}")
    values = list(values)
    if values and all(isinstance(v, (list, tuple)) for v in values):  # a batch, as HF's input_ids [1, T]
        raise TwellError(f"{what} must be one sequence of ids, 1-D, got a batch of {len(values)}"
                         + ("" if what != "ids" else ": pass ids[0]" if len(values) == 1
                            else " (generate_batch takes several prompts)"))
    for i, v in enumerate(values):
        values[i] = _integer(v, what, "integers")
        if not -2**31 <= values[i] < 2**31:
            raise TwellError(f"{what}: {v} is not a token id")
    return values


def _ids(values, what="ids"):
    """_id_list's ids as a ctypes int32 array, and their count."""
    values = _id_list(values, what)
    return (ctypes.c_int32 * len(values))(*values), len(values)


def _path(path):
    """A path's bytes for the C API, refused where a NUL would cut it short (as open() refuses it)."""
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        raise TwellError(f"path contains a NUL character: {path!r}")
    return encoded


# What a prompt or a scored text may be: a str, or its UTF-8 bytes (a list of ints is ids).
_TEXT = (str, bytes, bytearray)


def _floats(n):
    """A zeroed buffer of n floats and a pointer the library writes them through (allocated once: no
    transient copy, which for a long text's logits would double the host's peak)."""
    buf = bytearray(4 * n)
    return buf, ctypes.cast((ctypes.c_char * len(buf)).from_buffer(buf), ctypes.POINTER(ctypes.c_float))


def _as_output(buf, shape):
    """torch.Tensor of the floats where PyTorch is installed, else a numpy array where numpy is, else a
    memoryview of that shape (.tolist() gives its rows)."""
    try:
        import torch
        return torch.frombuffer(buf, dtype=torch.float32).reshape(shape)
    except ImportError:
        pass
    try:
        import numpy
        return numpy.frombuffer(buf, dtype=numpy.float32).reshape(shape)
    except ImportError:
        return memoryview(buf).cast("B").cast("f", shape)


class _OwnsAHandle:
    """Refuses copies and pickling: a copy would share the C handle, and closing either would free the
    other's. Collection closes it (the subclass's close()) where the caller did not."""

    def __del__(self):
        try:
            self.close()
        except Exception:  # at interpreter exit the library may be gone already
            pass

    def _refuse(self):
        name = type(self).__name__
        raise TypeError(f"twell.{name} cannot be copied or pickled: it owns memory outside Python (pass the "
                        f"object itself around, or load another twell.{name})")

    def __copy__(self):
        self._refuse()

    def __deepcopy__(self, memo):
        self._refuse()

    def __reduce__(self):
        self._refuse()


class _FreedByDestroy(_OwnsAHandle):
    """A handle that one C call frees (the class's _DESTROY, a name in _capi.lib): close() frees it now, and
    collection does where close() was not called."""

    _DESTROY = None

    def close(self):
        if getattr(self, "_handle", None) is not None and self._handle.value:
            getattr(_capi.lib, self._DESTROY)(self._handle)
        self._handle = None


def _is_chat(prompt):
    """Whether prompt is a conversation: a list (or tuple) of message dicts, as transformers' chat pipelines take
    (one that holds a dict is taken as one, so that a bad message is named as such)."""
    return isinstance(prompt, (list, tuple)) and any(isinstance(m, dict) for m in prompt)


def _text_prompt(prompt):
    """Whether prompt gives text back (a str, its bytes, or a conversation), not ids."""
    return isinstance(prompt, _TEXT) or _is_chat(prompt)


def _chat_special_tokens(path):
    """The special tokens a model directory's chat template sees (twell_chat_template_special_tokens): a dict."""
    length = ctypes.c_size_t()
    _capi.check(_capi.lib.twell_chat_template_special_tokens(_path(path), None, 0, ctypes.byref(length)))
    buf = ctypes.create_string_buffer(max(length.value, 1))
    _capi.check(_capi.lib.twell_chat_template_special_tokens(_path(path), buf, length.value, ctypes.byref(length)))
    return json.loads(buf.raw[:length.value].decode("utf-8"))


class ChatTemplate(_FreedByDestroy):
    """A chat model's Jinja template, which turns a conversation into the text the model was tuned on, as
    transformers' apply_chat_template(messages, tokenize=False) renders it (twell evaluates the subset of
    Jinja chat templates use; what it does not evaluate is an error naming it, never another text).

    text: the template's source; special_tokens: a dict of the variables bos_token, eos_token, ... (a
    model's come from its tokenizer files: ChatTemplate.load, or Tokenizer.chat_template). A with block closes
    it."""

    _DESTROY = "twell_chat_template_destroy"

    def __init__(self, text, special_tokens=None, _handle=None):
        self._lock = threading.Lock()
        if _handle is not None:
            self._handle = _handle
            return
        if not isinstance(text, str):
            raise TwellError(f"ChatTemplate takes the template's text (a str), got {type(text).__name__}")
        if "\0" in text:
            raise TwellError("ChatTemplate: the template's text holds a NUL character")
        try:
            special = None if special_tokens is None else \
                json.dumps({k: v for k, v in dict(special_tokens).items() if v is not None}).encode()
        except (TypeError, ValueError) as e:
            raise TwellError(f"ChatTemplate: special_tokens must be a dict of names and str: {e}") from None
        handle = ctypes.c_void_p()
        _capi.check(_capi.lib.twell_chat_template_create(text.encode("utf-8", errors="surrogatepass"), special,
                                                         ctypes.byref(handle)))
        self._handle = handle

    @classmethod
    def load(cls, path=None, template_file=None, name=None, tools=False):
        """The template of the model directory path, where transformers looks (chat_template.jinja, else
        tokenizer_config.json's chat_template, and additional_chat_templates/NAME.jinja): the one named
        "default", or with tools the one named "tool_use" where there is one, or the one of name; with the
        directory's special tokens. template_file: a Jinja file to use instead (with path's special tokens,
        where path is given). None where the model has none (or none of that name)."""
        if path is None and template_file is None:
            raise TwellError("ChatTemplate.load: give the model directory, a template file, or both")
        if name is not None and not isinstance(name, str):
            raise TwellError(f"ChatTemplate.load: name must be a str, got {type(name).__name__} {name!r}"[:200])
        handle = ctypes.c_void_p()
        _capi.check(_capi.lib.twell_chat_template_load(None if path is None else _path(path),
                                                       None if template_file is None else _path(template_file),
                                                       None if name is None else name.encode(), int(bool(tools)),
                                                       ctypes.byref(handle)))
        return cls(None, _handle=handle) if handle.value else None

    def close(self):
        with self._lock:  # not while an apply() of another thread reads it
            super().close()

    def _describe(self):
        source, text = ctypes.c_void_p(), ctypes.c_void_p()
        source_len, text_len = ctypes.c_size_t(), ctypes.c_size_t()
        with self._lock:
            if getattr(self, "_handle", None) is None:
                raise TwellError("twell.ChatTemplate: closed")
            _capi.check(_capi.lib.twell_chat_template_describe(self._handle, ctypes.byref(source),
                                                               ctypes.byref(source_len), ctypes.byref(text),
                                                               ctypes.byref(text_len)))
            return (ctypes.string_at(source, source_len.value).decode("utf-8", errors="replace"),
                    ctypes.string_at(text, text_len.value).decode("utf-8", errors="replace"))

    @property
    def source(self):
        """Where the template comes from: its file, or "<file> (chat_template)" for tokenizer_config.json's."""
        return self._describe()[0]

    @property
    def text(self):
        """The template's Jinja source."""
        return self._describe()[1]

    def __repr__(self):
        return f"twell.ChatTemplate(from {self.source!r})" if getattr(self, "_handle", None) is not None \
            else "twell.ChatTemplate(closed)"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def apply(self, messages, add_generation_prompt=False, **variables):
        """The prompt text of messages (a list of {"role": ..., "content": ...} dicts; contents may be any JSON
        the template reads), with the assistant's header after it where add_generation_prompt; variables:
        further ones the template reads (tools=, documents=, a template's own flags), as transformers'
        apply_chat_template(**kwargs). Encode it without BOS: the template writes its special tokens."""
        if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
            raise TwellError("apply: messages must be a list of {'role': ..., 'content': ...} dicts, got "
                             f"{type(messages).__name__}")
        try:
            encoded = json.dumps(list(messages), ensure_ascii=False).encode("utf-8", errors="surrogatepass")
            extra = json.dumps(variables, ensure_ascii=False).encode("utf-8", errors="surrogatepass")
        except (TypeError, ValueError) as e:
            raise TwellError(f"apply: the messages and variables must be JSON data (dicts, lists, str, numbers, "
                             f"bools, None): {e}") from None
        text, length = ctypes.c_void_p(), ctypes.c_size_t()
        with self._lock:
            if getattr(self, "_handle", None) is None:
                raise TwellError("twell.ChatTemplate: closed")
            _capi.check(_capi.lib.twell_chat_template_apply(self._handle, encoded, int(bool(add_generation_prompt)),
                                                            extra, ctypes.byref(text), ctypes.byref(length)))
            return ctypes.string_at(text, length.value).decode("utf-8", errors="replace")


class Tokenizer(_OwnsAHandle):
    """A model's tokenizer (byte-level BPE from tokenizer.json), or the byte tokenizer of our own
    small models (ids 0..255 bytes, BOS 256, EOS 257)."""

    def __init__(self, path=None, vocab_size=0, bytes=False):
        if path is None and not bytes:
            raise TwellError("Tokenizer: give the model directory, or bytes=True for the byte tokenizer")
        vocab_size = _int(vocab_size, "Tokenizer: vocab_size", 0, 2**31, "the model's vocabulary size (0: none to fit)")
        self._lock, self._streams = threading.RLock(), 0  # close() waits for a call, refuses while streams read it
        handle = ctypes.c_void_p()
        _capi.check(_capi.lib.twell_tokenizer_load(None if path is None else _path(path), vocab_size,
                                                   int(bool(bytes)), ctypes.byref(handle)))
        self._handle = handle
        info = _capi.TokenizerInfo()
        _capi.check(_capi.lib.twell_tokenizer_get_info(self._handle, ctypes.byref(info)))
        optional = lambda v: None if v < 0 else v  # noqa: E731
        self.vocab_size = info.vocab_size
        self.bos_id, self.eos_id = optional(info.bos_id), optional(info.eos_id)
        # What HuggingFace's tokenizer(text) puts before and after a text (add_special_tokens=True).
        self.bos_to_add, self.eos_to_add = optional(info.bos_to_add), optional(info.eos_to_add)
        # What HF's decode(skip_special_tokens=True) leaves out: the added tokens marked special, BOS, EOS.
        n = ctypes.c_int64()
        _capi.check(_capi.lib.twell_tokenizer_special_ids(self._handle, None, 0, ctypes.byref(n)))
        special = (ctypes.c_int32 * max(n.value, 1))()
        _capi.check(_capi.lib.twell_tokenizer_special_ids(self._handle, special, n.value, ctypes.byref(n)))
        self.special_ids = list(special[:n.value])
        # The directory's chat templates (read at their first use: a template that does not parse is said where
        # it is used) and the special tokens they see (transformers' special_tokens_map).
        self._path = None if bytes else path
        self._templates = {}  # (name, tools) -> ChatTemplate or None
        self.special_tokens_map = _chat_special_tokens(path) if self._path is not None else {}

    def _template(self, name=None, tools=False):
        """The directory's chat template of that choice (ChatTemplate.load's), loaded once; None where none."""
        if self._path is None:
            return None
        key = (name, bool(tools))
        if key not in self._templates:
            self._templates[key] = ChatTemplate.load(self._path, name=name, tools=tools)
        return self._templates[key]

    @property
    def chat_template(self):
        """The model's default ChatTemplate (None where it has none); raises where its template does not parse."""
        return self._template()

    # transformers' arguments that change what it returns or does to the text; twell refuses them, rather than
    # pass them to the template as variables.
    _UNSUPPORTED_CHAT_ARGUMENTS = ("continue_final_message", "padding", "truncation", "max_length", "return_tensors",
                                   "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
                                   "sanitize_control_tokens")

    def apply_chat_template(self, conversation, tools=None, documents=None, chat_template=None,
                            add_generation_prompt=False, tokenize=True, **kwargs):
        """transformers' apply_chat_template: the ids (tokenize, the default; encoded as the text stands: the
        template writes BOS where the model wants it) or the text of a conversation (a list of {"role": ...,
        "content": ...} dicts; or a list of conversations: a list back) through the model's chat template: the
        one named "tool_use" where tools are given and the model has one, else its default; chat_template: the
        name of one of the model's templates, or a template's text (with this tokenizer's special tokens).
        tools, documents and kwargs are the template's variables."""
        for name in self._UNSUPPORTED_CHAT_ARGUMENTS:
            if name in kwargs:
                raise TwellError(f"apply_chat_template: {name}= is transformers', not supported by twell")
        if isinstance(conversation, (list, tuple)) and conversation and isinstance(conversation[0], (list, tuple)):
            return [self.apply_chat_template(c, tools, documents, chat_template, add_generation_prompt, tokenize,
                                             **kwargs) for c in conversation]
        if isinstance(conversation, (list, tuple)) and len(conversation) == 0:
            raise TwellError("apply_chat_template: the conversation is empty (give at least one message)")
        with self._using():  # refused once closed
            pass
        template = None
        if chat_template is not None:
            if not isinstance(chat_template, str):
                raise TwellError(f"apply_chat_template: chat_template must be a str, got {type(chat_template).__name__}")
            if "{" not in chat_template:
                template = self._template(name=chat_template)
            if template is None:
                template = ChatTemplate(chat_template, self.special_tokens_map)
        else:
            template = self._template(tools=tools is not None)
            if template is None:
                raise TwellError("apply_chat_template: this tokenizer has no chat template (no chat_template.jinja, no "
                                 "chat_template in tokenizer_config.json); pass chat_template=")
        variables = dict(kwargs)
        if tools is not None:
            variables["tools"] = tools
        if documents is not None:
            variables["documents"] = documents
        text = template.apply(conversation, add_generation_prompt, **variables)
        return self.encode(text) if tokenize else text

    @contextlib.contextmanager
    def _using(self):
        """The tokenizer's handle for one call (close() waits for it)."""
        with self._lock:
            if getattr(self, "_handle", None) is None:
                raise TwellError("twell.Tokenizer: closed")
            yield self._handle

    def encode(self, text, add_special_tokens=False):
        """The ids of text (str, or bytes as they are); with add_special_tokens, HF's BOS / EOS around it."""
        if not isinstance(text, _TEXT):
            raise TwellError(f"encode takes a str (or its bytes), got {type(text).__name__} {text!r}"[:200])
        try:
            data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 for it, as HF's tokenizers refuse it too
            raise TwellError(f"encode: the text is not valid Unicode at character {e.start} "
                             f"({text[e.start:e.end]!r}: {e.reason})") from None
        n = ctypes.c_int64()
        capacity = len(data) + 16
        while True:
            ids = (ctypes.c_int32 * capacity)()
            with self._using() as h:
                _capi.check(_capi.lib.twell_tokenizer_encode(h, data, len(data), ids, capacity, ctypes.byref(n)))
            if n.value <= capacity:
                break
            capacity = n.value
        out = list(ids[:n.value])
        if add_special_tokens:
            out = ([self.bos_to_add] if self.bos_to_add is not None else []) + out + \
                  ([self.eos_to_add] if self.eos_to_add is not None else [])
        return out

    def decode_bytes(self, ids, skip_special_tokens=False):
        """The bytes the ids stand for (a token may end inside a UTF-8 character); skip_special_tokens leaves
        special_ids out, as HF's decode(skip_special_tokens=True)."""
        if skip_special_tokens:
            special = set(self.special_ids)
            ids = [i for i in _id_list(ids) if i not in special]
        c_ids, n = _ids(ids)
        length = ctypes.c_size_t()
        capacity = 16 * n + 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            with self._using() as h:
                _capi.check(_capi.lib.twell_tokenizer_decode(h, c_ids, n, buf, capacity, ctypes.byref(length)))
            if length.value <= capacity:
                return buf.raw[:length.value]
            capacity = length.value

    def decode(self, ids, skip_special_tokens=False):
        """The text the ids stand for; bytes that are not UTF-8 become U+FFFD. skip_special_tokens: as HF's."""
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def close(self):
        """Frees the tokenizer now; refused while a generation's text stream reads it."""
        if getattr(self, "_handle", None) is None:
            return
        with self._lock:
            if self._streams:
                raise TwellError("twell.Tokenizer.close: a generate() running now reads this tokenizer; close it "
                                 "after that returns")
            if self._handle is not None and self._handle.value:
                _capi.lib.twell_tokenizer_destroy(self._handle)
            self._handle = None


class Model(_OwnsAHandle):
    """A Llama-style model loaded from a HuggingFace directory.

    device: "auto" (the GPU where a Hopper GPU is present, its runtime takes the model and it has the
    memory, else the CPU reference backend), "cuda" (an error saying why where it cannot) or "cpu".
    ffn: the GPU's FFN of ReLU models, "twell" (sparse TwELL where it pays) or "dense".
    context: GPU buffers for sequences of at most this many positions (None: the config's
    max_position_embeddings; a long context takes much memory), and on either backend the default window
    of perplexity(stride=) and ffn_stats(). check_finite: refuse weights holding NaN or Inf (one scan at load).
    bf16_ffn: on the CPU, round the ReLU FFN's g, u and h to bf16 as the GPU's bf16 FFN does (SiLU
    models: no effect). gpu_memory: the most GPU memory the
    model may take, in bytes or as "40GB" (None: all that is free); where it needs more, "auto" runs
    it on the CPU and "cuda" refuses it. kv_cache=False: on the GPU, no KV cache (logits(), perplexity(),
    token_nll(), ffn_stats() and generations of one token); the CPU backend ignores it. max_batch: the most prompts one generate_batch() takes on the GPU (each with a
    context's KV cache; the CPU backend takes up to 65535), and how many windows of perplexity(stride=) and
    ffn_stats() one GPU forward runs (short windows fill the GPU that way). max_batch_tokens: the most tokens one GPU
    forward computes, which its activations are sized for (at least max_batch; with the KV cache a
    longer prompt runs in chunks; None: with the KV cache up to 16384, fewer where the GPU's memory
    holds the weights and cache but not that many; without it, max_batch contexts). tokenizer: "auto" (the directory's
    tokenizer.json where there is one), "bytes" (our byte tokenizer) or None. verbose: loading's lines
    on stderr (else to the "twell" logger). generation_config: "auto" (generate()'s sampling arguments
    left None take the model's generation_config.json, as `twell run --generation-config auto`) or
    "ignore" (twell's defaults: greedy, no repetition penalty).

    A model runs one call at a time: calls from other threads wait for the one in progress; a call
    from generate()'s own stream callback is refused.
    """

    def __init__(self, path, device="auto", ffn="twell", context=None, kv_cache=True, check_finite=True,
                 bf16_ffn=False, tokenizer="auto", verbose=False, gpu_memory=None, max_batch=1,
                 max_batch_tokens=None, generation_config="auto"):
        if device not in _capi.CHOOSE:
            raise TwellError(f"device must be one of {', '.join(_capi.CHOOSE)}, got {device!r}")
        if ffn not in ("twell", "dense"):
            raise TwellError(f"ffn must be 'twell' or 'dense', got {ffn!r}")
        if tokenizer not in ("auto", "bytes", None):
            raise TwellError(f"tokenizer must be 'auto', 'bytes' or None, got {tokenizer!r}")
        if generation_config not in ("auto", "ignore"):
            raise TwellError(f"generation_config must be 'auto' or 'ignore', got {generation_config!r}")
        if context is not None:
            context = _int(context, "context", 1, expected="a positive number of positions or None")
        max_batch = _int(max_batch, "max_batch", 1, 65536, "a number of sequences in [1, 65535]")
        if max_batch_tokens is not None:
            max_batch_tokens = _int(max_batch_tokens, "max_batch_tokens", max_batch,
                                    expected=f"a number of tokens of at least max_batch ({max_batch}: a decode step "
                                    "takes one token a sequence) or None")
        path = os.fspath(path)
        self.path = path
        self._lock, self._owner = threading.Lock(), None
        o = _capi.ModelOptions()
        _capi.lib.twell_model_options_init(ctypes.byref(o))
        o.device, o.dense_ffn, o.bf16_ffn = _capi.CHOOSE[device], int(ffn == "dense"), int(bool(bf16_ffn))
        o.check_finite, o.context, o.kv_cache = int(bool(check_finite)), context or 0, int(bool(kv_cache))
        o.max_batch, o.max_tokens = max_batch, max_batch_tokens or 0
        if gpu_memory is not None:
            cap = _capi.parse_bytes(gpu_memory) if isinstance(gpu_memory, str) else gpu_memory
            integral = isinstance(cap, numbers.Integral) or (isinstance(cap, float) and cap.is_integer())
            if isinstance(cap, bool) or not integral or not 1 <= cap < 2**63:
                raise TwellError(f"gpu_memory must be at least 1 byte (a number of bytes or a size such as '40GB'; "
                                 f"None: no cap), got {gpu_memory!r}")
            o.gpu_memory = int(cap)

        raised = []  # an exception in a log handler (Ctrl-C too): ctypes cannot pass it through C

        def log(line, _user):
            try:
                text = line.decode(errors="replace")
                if verbose:
                    print(text, file=sys.stderr, flush=True)
                else:
                    _log.log(logging.WARNING if text.startswith("warning:") else logging.INFO, text)
            except BaseException as e:  # noqa: B036 - re-raised once the load returns
                raised.append(e)

        o.log = _capi.LOG_FN(log)  # referenced by o until the call returns
        handle = ctypes.c_void_p()
        try:
            status = _capi.lib.twell_model_load(_path(path), ctypes.byref(o), ctypes.byref(handle))
            if raised:  # the load's own failure, if any, kept as the handler's exception's cause
                error = _capi.lib.twell_last_error().decode(errors="replace")
                raise raised[0] from (None if status == _capi.OK else TwellError(error))
        except BaseException:  # that, or a Ctrl-C CPython raises as the call returns: the model is nobody's
            if handle.value:  # set only by a load that succeeded
                _capi.lib.twell_model_destroy(handle)
            raise
        _capi.check(status)
        self._handle = handle
        try:
            self._describe(path, context, tokenizer, generation_config)
        except BaseException:
            self.close()  # not held by a traceback that outlives the failure
            raise

    def _describe(self, path, context, tokenizer, generation_config):
        """The loaded model's sizes, stop ids and tokenizer (after __init__'s load)."""
        info = _capi.ModelInfo()
        _capi.check(_capi.lib.twell_model_get_info(self._handle, ctypes.byref(info)))
        self.config = {name: getattr(info, name) for name in ("vocab_size", "hidden_size", "intermediate_size",
                                                              "num_layers", "num_heads", "num_kv_heads", "head_dim",
                                                              "context")}
        self.config["hidden_act"] = "relu" if info.relu else "silu"
        self.device = "cuda" if info.device == _capi.CUDA else "cpu"
        self.max_batch = info.max_batch  # prompts generate_batch() takes at most
        # Windows of perplexity(stride=) and ffn_stats() without context=: the context asked for (the CPU
        # backend holds the config's whole context whatever it is), else the model's, up to 8192 as `twell eval`.
        self._default_window = min(context or self.config["context"], self.config["context"], 8192)
        n = ctypes.c_int64()
        _capi.check(_capi.lib.twell_model_eos_ids(self._handle, None, 0, ctypes.byref(n)))
        eos = (ctypes.c_int32 * max(n.value, 1))()
        _capi.check(_capi.lib.twell_model_eos_ids(self._handle, eos, n.value, ctypes.byref(n)))
        self.eos_ids = list(eos[:n.value])  # config.json's and generation_config.json's
        # What a call with every sampling argument None takes (the config does not change: read once; an
        # error is said where it is used), and the keys the file sets that twell does not apply.
        self._generation_config = generation_config == "auto"
        s, unapplied = _capi.Sampling(), ctypes.c_char_p()
        _capi.lib.twell_sampling_init(ctypes.byref(s))
        rc = _capi.lib.twell_model_generation_sampling(self._handle, ctypes.byref(s),
                                                       0 if self._generation_config else _SAMPLE_ALL, None,
                                                       ctypes.byref(unapplied))
        self._unapplied = (unapplied.value or b"").decode(errors="replace") if self._generation_config else ""
        self._generation_defaults = {name: getattr(s, name) for name in _SAMPLE_BITS} if rc == _capi.OK else \
            _capi.lib.twell_last_error().decode(errors="replace") + " (pass the argument)"
        self.tokenizer = None
        # lexists: a link to nothing is the loader's to report, as `twell run` does, not a model without one
        if tokenizer == "bytes" or (tokenizer == "auto" and
                                    os.path.lexists(os.path.join(os.fsdecode(path), "tokenizer.json"))):
            self.tokenizer = Tokenizer(path, self.config["vocab_size"], bytes=tokenizer == "bytes")
        self.last_generation = None

    def __repr__(self):
        c = self.config
        return (f"twell.Model({self.path!r}, device={self.device!r}: {c['num_layers']} layers, hidden "
                f"{c['hidden_size']}, FFN {c['intermediate_size']} ({c['hidden_act']}), vocab {c['vocab_size']})")

    @contextlib.contextmanager
    def _busy(self, what):
        """The model's handle, held by this thread for one call."""
        if self._owner == threading.get_ident():
            raise TwellError(f"twell.Model.{what}: called from the stream callback of this model's generate(), "
                             "which holds the model until it returns")
        with self._lock:
            if getattr(self, "_handle", None) is None:
                raise TwellError("twell.Model: closed")
            self._owner = threading.get_ident()
            try:
                yield self._handle
            finally:
                self._owner = None

    def _tokenizer(self, what):
        if self.tokenizer is None:
            raise TwellError(f"{what}: this model has no tokenizer (no tokenizer.json in {self.path}; a model of our "
                             "own trained on bytes takes tokenizer='bytes'); pass token ids instead")
        return self.tokenizer

    def encode(self, text, add_special_tokens=True):
        """The ids of text as HuggingFace's tokenizer(text) gives them: with its BOS (and EOS) added."""
        return self._tokenizer("encode").encode(text, add_special_tokens)

    def _scored_ids(self, text_or_ids):
        """The ids perplexity(), token_nll() and ffn_stats() run: a text's as encode() gives them, ids as given."""
        return self.encode(text_or_ids) if isinstance(text_or_ids, _TEXT) else text_or_ids

    def decode(self, ids, skip_special_tokens=False):
        return self._tokenizer("decode").decode(ids, skip_special_tokens)

    def logits(self, ids):
        """Logits of every position of one sequence from position 0: [T, vocab] float32 (on the host).

        On the GPU it refuses while a generation is cached (after prefill or decode_step): reset() first.
        """
        c_ids, n = _ids(ids)
        self._check_one_forward(n, "logits", "")  # before n x vocab floats are allocated for them
        vocab = self.config["vocab_size"]
        buf, out = _floats(n * vocab)
        with self._busy("logits") as h:
            _capi.check(_capi.lib.twell_model_logits(h, c_ids, n, out, None))
        return _as_output(buf, (n, vocab))

    def ffn_stats(self, text_or_ids, context=None):
        """Each layer's FFN activation statistics over a text (tokenized as perplexity() does) or ids (ReLU
        models; zeros for SiLU ones): a list of dicts with tokens, nnz, max_nnz_per_token, l1_sum and
        nnz_per_token. In forwards of `context` tokens (default Model(context=), else the model's context, up
        to 8192, as `twell eval`)
        that do not overlap, every token once (BOS and EOS of a text too), no logits copied out."""
        ids = self._scored_ids(text_or_ids)
        window = self._default_window if context is None else _tokens_arg(context, "ffn_stats: context", 1)
        c_ids, n = _ids(ids)
        stats = (_capi.ActivationStats * self.config["num_layers"])()
        with self._busy("ffn_stats") as h:
            _capi.check(_capi.lib.twell_model_ffn_stats(h, c_ids, n, window, stats))
        return [{"tokens": s.tokens, "nnz": s.nnz, "max_nnz_per_token": s.max_nnz_per_token, "l1_sum": s.l1_sum,
                 "nnz_per_token": s.nnz / s.tokens if s.tokens else 0.0} for s in stats]

    def prefill(self, ids):
        """Clears the KV cache, runs ids, and returns the last token's logits [vocab]."""
        c_ids, n = _ids(ids)
        buf, out = _floats(self.config["vocab_size"])
        with self._busy("prefill") as h:
            _capi.check(_capi.lib.twell_model_prefill(h, c_ids, n, out))
        return _as_output(buf, (self.config["vocab_size"],))

    def decode_step(self, token):
        """Appends one token to the KV cache and returns its logits [vocab]."""
        token = _id_list([token], "decode_step: token")[0]
        buf, out = _floats(self.config["vocab_size"])
        with self._busy("decode_step") as h:
            _capi.check(_capi.lib.twell_model_decode_step(h, token, out))
        return _as_output(buf, (self.config["vocab_size"],))

    def reset(self):
        """Empties the KV cache."""
        with self._busy("reset") as h:
            _capi.check(_capi.lib.twell_model_reset(h))

    @property
    def cached_tokens(self):
        n = ctypes.c_int64()
        with self._busy("cached_tokens") as h:
            _capi.check(_capi.lib.twell_model_cached_tokens(h, ctypes.byref(n)))
        return n.value

    def perplexity(self, text_or_ids, context=None, stride=None):
        """exp(mean negative log-likelihood) of a text (tokenized with BOS and EOS as HF does) or of ids: in one
        forward, or with context= (a window's tokens; stride= alone: Model(context=), else the model's context,
        up to 8192, as `twell eval`) in windows as
        `twell eval` scores a text longer than the model takes: every `stride` tokens (default the window: no
        overlap, each window's first token context only; less: HuggingFace's sliding window), each token
        counted once. On the GPU, windows of one length run up to Model(max_batch=) of them a forward, as
        `twell eval --batch` does: short windows then fill the GPU and a sparse model takes its sparse FFN.
        A mean NLL past ~709.8 nats gives inf, as torch.exp does (token_nll() gives the losses themselves)."""
        ids = self._scored_ids(text_or_ids)
        c_ids, n = _ids(ids)
        ppl = ctypes.c_double()
        if context is None and stride is None:
            self._check_one_forward(n, "perplexity", "; context= (and stride=) scores it in windows, as `twell eval` does")
            with self._busy("perplexity") as h:
                _capi.check(_capi.lib.twell_model_perplexity(h, c_ids, n, None, ctypes.byref(ppl)))
            return ppl.value
        window = self._default_window if context is None else _tokens_arg(context, "perplexity: context", 2)
        step = window if stride is None else _tokens_arg(stride, "perplexity: stride", 1)
        with self._busy("perplexity") as h:
            _capi.check(_capi.lib.twell_model_perplexity_windows(h, c_ids, n, window, step, None, ctypes.byref(ppl),
                                                                 None))
        return ppl.value

    def token_nll(self, text_or_ids):
        """Each token's loss, -log p(token t+1 | tokens 0..t), as a list of len(ids) - 1 floats (natural log),
        from the forward perplexity() takes (a text is tokenized as there); their mean is log(perplexity)."""
        ids = self._scored_ids(text_or_ids)
        c_ids, n = _ids(ids)
        if n < 2:
            raise TwellError(f"token_nll: need at least 2 tokens, got {n}")
        self._check_one_forward(n, "token_nll", "; perplexity(context=, stride=) scores a longer text in windows")
        out = (ctypes.c_double * (n - 1))()
        with self._busy("token_nll") as h:
            _capi.check(_capi.lib.twell_model_token_nll(h, c_ids, n, out))
        return list(out)

    def _prompt_ids(self, prompt, what="generate"):
        """The ids a generation continues from (the tokenizer's BOS, then the text's ids, for a str; a
        conversation's text through the chat template, as it stands), and the text's own ids (None for ids)."""
        if _is_chat(prompt):
            tok = self._tokenizer(f"{what} from a conversation")
            text_ids = tok.apply_chat_template(prompt, add_generation_prompt=True)
            if not text_ids:
                raise TwellError(f"{what}: the chat template made an empty text of the conversation: there is "
                                 "nothing to continue from")
            return text_ids, text_ids
        if isinstance(prompt, dict):
            raise TwellError(f"{what}: a prompt is a str, a list of ids or a conversation (a list of message dicts); "
                             "this is one message: pass [message]")
        if not isinstance(prompt, _TEXT):
            return _id_list(prompt, "prompt"), None
        tok = self._tokenizer(f"{what} from text")
        text_ids = tok.encode(prompt)
        ids = ([tok.bos_to_add] if tok.bos_to_add is not None else []) + text_ids
        if not ids:
            raise TwellError(f"{what}: the prompt is empty and this tokenizer puts no BOS token in front of a "
                             "text: there is nothing to continue from")
        return ids, text_ids

    def _stop_ids(self, stop):
        if stop is True or stop is None:  # config.json's and generation_config.json's end-of-sequence ids, and the tokenizer's
            stops = list(self.eos_ids)
            if self.tokenizer is not None and self.tokenizer.eos_id is not None:
                stops.append(self.tokenizer.eos_id)
            return stops
        if stop is False:
            return []
        return _id_list(stop, "stop (True, False, or a list of ids)")

    @property
    def generation_defaults(self):
        """The sampling options generate() takes where every sampling argument is None (its default), as
        `twell run` takes them with no option given: transformers' defaults from the model's
        generation_config.json (config.json's keys where there is none): greedy unless its do_sample is true,
        which brings its temperature (1 where unset), top_k (50 where unset), top_p and min_p; its
        repetition_penalty either way; twell's (greedy) where the file gives none, or with
        Model(generation_config="ignore"). A dict of temperature, top_k, top_p, min_p and repetition_penalty.
        (A call that gives some arguments takes the rest from the file field by field: a greedy file's top_k,
        top_p and min_p shape a call given a temperature.) Raises where the file has a value it would take of
        the wrong type or out of range (the model still loads; give the arguments)."""
        if isinstance(self._generation_defaults, str):
            raise TwellError(self._generation_defaults)
        return dict(self._generation_defaults)

    def _completed(self, s, given, what):
        """s (a twell_sampling) with the fields whose bits are not in given taken from the generation config."""
        if not self._generation_config or given == _SAMPLE_ALL:
            return s
        with self._busy(what) as h:
            rc = _capi.lib.twell_model_generation_sampling(h, ctypes.byref(s), given, None, None)
        if rc != _capi.OK:
            raise TwellError(_capi.lib.twell_last_error().decode(errors="replace") + " (pass the argument)")
        return s

    def _sampling(self, temperature, top_k, top_p, seed, min_p, repetition_penalty, what):
        # None: the model's default (generation_config.json), as `twell run` takes it for an option not given;
        # top_k, top_p and min_p only where the temperature the run ends with samples.
        args = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
                "repetition_penalty": repetition_penalty}
        given = sum(bit for name, bit in _SAMPLE_BITS.items() if args[name] is not None)
        if self._unapplied and given != _SAMPLE_ALL:
            warnings.warn(f"twell.Model: the model's generation config sets {self._unapplied}, which twell does "
                          "not apply (one sequence a prompt, by temperature, top_k, top_p, min_p and "
                          "repetition_penalty)", stacklevel=3)
        s = _capi.Sampling()
        _capi.lib.twell_sampling_init(ctypes.byref(s))  # twell's defaults, for the arguments left None
        temperature, top_k, top_p, min_p, repetition_penalty = (
            getattr(s, name) if args[name] is None else args[name] for name in _SAMPLE_BITS)
        # Integers as `twell run` takes them: no silent truncation of 2.7 or wrap-around of -1 or 2**64.
        top_k = _int(top_k, "top_k", 0, expected="an integer of at least 0 (0: all)")
        seed = _int(seed, "seed", 0, 2**64, "an integer in [0, 2**64)")
        numbers_ = []
        for name, value in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p),
                            ("repetition_penalty", repetition_penalty)):
            try:
                if isinstance(value, (str, bytes, bool)) or "bool" in str(getattr(value, "dtype", "")):
                    raise TypeError
                numbers_.append(float(value))
            except (TypeError, ValueError, OverflowError):
                raise TwellError(f"{name} must be a number, got {type(value).__name__} {value!r}") from None
        s.temperature, s.top_p, s.min_p, s.repetition_penalty = numbers_
        if not (s.repetition_penalty > 0 and math.isfinite(s.repetition_penalty)):  # 0 would read as off in C
            raise TwellError(f"repetition_penalty must be finite and > 0, got {s.repetition_penalty!r}")
        s.top_k, s.seed = int(top_k), int(seed)
        s = self._completed(s, given, what)
        # As `twell run` notes it:
        if s.temperature == 0 and (s.top_k != 0 or s.top_p != 1 or s.min_p != 0 or s.seed != 0):
            warnings.warn("twell.Model: top_k, top_p, min_p and seed only shape sampling; at temperature 0 the "
                          "generation is greedy (argmax)", stacklevel=3)
        if self.tokenizer is not None:  # never draw an id the tokenizer cannot print
            s.vocab_limit = self.tokenizer.vocab_size
        return s

    def generate(self, prompt, max_new_tokens=64, temperature=None, top_k=None, top_p=None, seed=0, stop=True,
                 stream=None, stop_strings=None, min_p=None, repetition_penalty=None, skip_special_tokens=False,
                 reuse_cache=False):
        """Continues prompt (a str or its UTF-8 bytes; a conversation, a list of {"role": ..., "content": ...}
        dicts, which the model's chat template turns into its text with the assistant's header after it, as
        transformers' apply_chat_template(add_generation_prompt=True) and `twell run --chat`; or a list of
        ids) with up to max_new_tokens tokens (64 by default; generation_config.json's max_new_tokens and
        max_length are not read, as `twell run -n`): greedy at temperature 0, else sampled (top_k, top_p, then min_p, in transformers' order; seed: the
        same seed draws the same tokens as `twell run --seed` on the same backend; the CPU's and the GPU's
        logits round differently). repetition_penalty (1: off; above 1 discourages repeats, below 1
        encourages them) divides the logit of each id the sequence holds (the prompt's, BOS and special
        tokens included, and the new ones) where positive and multiplies it where negative, before the
        rest, greedy included, as transformers' repetition_penalty does. A sampling argument left None takes
        the model's generation_config.json's value, as transformers' generate() and `twell run` take it
        (top_k, top_p and min_p only where the call samples; without a file: greedy, top_k 0, top_p 1,
        min_p 0, repetition_penalty 1); `generation_defaults` shows what a call with none given takes.

        stop: True (or None, as every argument left None takes the model's default) ends at the model's
        end-of-sequence ids and the tokenizer's EOS, False runs on, a list gives the ids. stop_strings: a str or a list of them (text prompts): the text ends just before
        the first place one appears in the new text (where one token completes two, the one that starts
        earlier), and the generation at the token that completes it (`twell run --stop`; the prompt's
        text is not searched). skip_special_tokens: the text leaves the tokenizer's special_ids out, as HF's
        decode(skip_special_tokens=True) and `twell run --skip-special-tokens`. stream: a callable that
        receives the text as it comes (text prompts) or each id (id prompts); returning True from it stops the generation
        (True itself: print's None and sys.stdout.write's count go on). Returns the new text (without the
        prompt, the stop token, or a stop string and what follows it) for a text prompt, as the stream
        gives it, else the new ids. `last_generation` then holds the ids, why it stopped ("stop_string"
        with the string met as "stop_string", "stop_token", "max_tokens", "context_full", or "callback":
        the stream asked) and its timings: prefill_seconds up to the first new token (the prompt's
        forward and the first draw), decode_seconds for the tokens after it, tokens_per_second their rate.

        reuse_cache: prefill only the part of the prompt after the longest prefix it shares with what the KV
        cache holds from this model's last generate() (its prompt and new tokens but the last; nothing where
        anything else ran on the model since), as a chat loop's next turn wants: last_generation's
        reused_tokens says how many positions it took. The logits are a whole prefill's up to the order of
        the sums (the CPU's: the same bits), so on the GPU a repeated call may draw another token where two
        are nearly tied; False (the default) prefills the whole prompt every time.
        """
        text_prompt = _text_prompt(prompt)
        stop_strings = _stop_strings(stop_strings)
        if stop_strings and not text_prompt:
            raise TwellError("generate: stop_strings are matched in the text of a str prompt; this prompt is ids "
                             "(give stop ids as stop=[...])")
        ids, text_ids = self._prompt_ids(prompt)
        max_new_tokens = _check_count(max_new_tokens)
        stops = self._stop_ids(stop)
        s = self._sampling(temperature, top_k, top_p, seed, min_p, repetition_penalty, "generate")

        streamer = _TextStream(self.tokenizer, text_ids, stops, stop_strings, skip_special_tokens) \
            if text_prompt and (stream is not None or stop_strings) else None
        state = {"error": None, "interrupted": False}

        def on_token(token, _user):
            if streamer is None and stream is None:  # only to see a Ctrl-C
                return _stream_call(state, lambda: 0)
            return _stream_call(state, lambda: _streamed(streamer, stream, token))

        c_prompt, n_prompt = _ids(ids, "prompt")
        c_stops, n_stops = _ids(stops, "stop")
        room = self._room(max_new_tokens, [len(ids)])
        tokens = (ctypes.c_int32 * max(room, 1))()
        g = _capi.Generation()
        # A call a token where there is a stream, or a Ctrl-C to see (else NULL: none).
        callback = _capi.TOKEN_FN(on_token) if streamer is not None or stream is not None or _notes_interrupts() \
            else _capi.TOKEN_FN()
        with _streams_open([streamer]), _interrupt_noted(state), self._busy("generate") as h, \
                _callback_error_first(state):
            _capi.check(_capi.lib.twell_model_set_prefix_reuse(h, 1 if reuse_cache else 0))
            _capi.check(_capi.lib.twell_model_generate(h, c_prompt, n_prompt, room, ctypes.byref(s),
                                                       c_stops, n_stops, callback, None, tokens, ctypes.byref(g)))
            tail = streamer.rest() if streamer is not None else ""
            met = streamer.stopped_by(stop_strings) if streamer is not None else None
            new = list(tokens[:g.n_tokens])
            # Under the model's lock: where threads share the model, the record is the generation that ran last.
            self.last_generation = _generation_record(new, g, met)
        if tail and stream is not None:
            stream(tail)
        if streamer is not None:  # the text streamed (decoded once)
            return "".join(streamer.pieces)
        return self._text_of(text_ids, new, stops, stop_strings, skip_special_tokens) if text_prompt else new

    def _check_one_forward(self, n, what, hint):
        if n > self.config["context"]:
            raise TwellError(f"{what}: {n} tokens exceed the model's context of {self.config['context']} positions"
                             f"{hint}")

    def _room(self, max_new_tokens, prompt_lengths):
        """The most tokens a generation can draw: max_new_tokens, or fewer where the context fills first (the
        buffer for them is allocated up front; room for one more, so that a full context says so)."""
        return max(0, min(max_new_tokens, self.config["context"] - min(prompt_lengths) + 2))

    def _text_of(self, text_ids, new, stops, stop_strings, skip_special_tokens):
        """The text the new ids add to a text prompt's, as the stream gives it and `twell run` prints it (a
        tokenizer may decode ids alone otherwise: Llama 2's drops a leading space), without a stop token,
        and cut before a stop string."""
        streamer = _TextStream(self.tokenizer, text_ids, stops, stop_strings, skip_special_tokens)
        with _streams_open([streamer]):
            for t in new:
                streamer.add(t)
            streamer.rest()
        return "".join(streamer.pieces)

    def generate_batch(self, prompts, max_new_tokens=64, temperature=None, top_k=None, top_p=None, seed=0, stop=True,
                       stream=None, stop_strings=None, min_p=None, repetition_penalty=None,
                       skip_special_tokens=False):
        """generate() for several prompts at once (each a str, a conversation or a list of ids, of any lengths; at most
        max_batch of them, which Model(max_batch=...) sets on the GPU): one batched forward a step, each
        prompt stopping on its own. Prompt i draws with seed + i, so that where the logits have the same
        bits (the CPU backend) its tokens are generate()'s with that seed. stream: a callable that
        receives (i, the text prompt i adds) as it comes (str prompts) or (i, each id) (id prompts);
        returning True (itself) from it stops prompt i, the others go on. stop_strings: as generate()'s, for
        each prompt on its own (every prompt must then be text: str or bytes). Returns a list, in the
        prompts' order: the new text for a str prompt, the new ids for ids. Sampling arguments left None take
        the generation config's values, as in generate(); skip_special_tokens as there (text prompts).
        `last_generation` then holds a
        list of generate()'s dicts, one a prompt, each with the batch's prefill_seconds and its own
        decode_seconds.
        """
        if isinstance(prompts, _TEXT) or not hasattr(prompts, "__len__"):
            raise TwellError("generate_batch: prompts must be a list of prompts (for one, generate())")
        if not 1 <= len(prompts) <= self.max_batch:
            raise TwellError(f"generate_batch: {len(prompts)} prompts; this model takes 1 to {self.max_batch} "
                             "(Model(max_batch=...))")
        stop_strings = _stop_strings(stop_strings)
        if stop_strings and not all(_text_prompt(p) for p in prompts):
            raise TwellError("generate_batch: stop_strings are matched in the text of str prompts; some prompts "
                             "are ids (give stop ids as stop=[...])")
        max_new_tokens = _check_count(max_new_tokens)
        if any(isinstance(p, dict) for p in prompts):
            raise TwellError("generate_batch: prompts must be a list of prompts; a conversation (a list of message "
                             "dicts) is one prompt: generate_batch([conversation, ...]), or generate(conversation)")
        encoded = [self._prompt_ids(p, "generate_batch") for p in prompts]
        ids = [e[0] for e in encoded]
        flat, offsets = [], [0]
        for i, p in enumerate(ids):
            if not p:
                raise TwellError(f"generate_batch: prompt {i} is empty")
            flat += p
            offsets.append(len(flat))
        c_prompts, _ = _ids(flat, "prompt")
        c_offsets = (ctypes.c_int64 * len(offsets))(*offsets)
        stops = self._stop_ids(stop)
        c_stops, n_stops = _ids(stops, "stop")
        s = self._sampling(temperature, top_k, top_p, seed, min_p, repetition_penalty, "generate_batch")
        B = len(prompts)
        streamers = [_TextStream(self.tokenizer, text_ids, stops, stop_strings, skip_special_tokens)
                     if _text_prompt(p) and (stream is not None or stop_strings) else None
                     for p, (_, text_ids) in zip(prompts, encoded)]
        state = {"error": None, "interrupted": False}

        def on_token(i, token, _user):
            if streamers[i] is None and stream is None:  # only to see a Ctrl-C
                return _stream_call(state, lambda: 0)
            emit = (lambda piece: stream(i, piece)) if stream is not None else None
            return _stream_call(state, lambda: _streamed(streamers[i], emit, token))

        room = self._room(max_new_tokens, [len(p) for p in ids])
        tokens = (ctypes.c_int32 * max(B * room, 1))()
        g = (_capi.Generation * B)()
        callback = _capi.BATCH_TOKEN_FN(on_token) if stream is not None or stop_strings or _notes_interrupts() \
            else _capi.BATCH_TOKEN_FN()
        with _streams_open(streamers), _interrupt_noted(state), self._busy("generate_batch") as h, \
                _callback_error_first(state):
            _capi.check(_capi.lib.twell_model_generate_batch(h, c_prompts, c_offsets, B, room,
                                                             ctypes.byref(s), c_stops, n_stops,
                                                             callback, None, tokens, g))
            tails = [st.rest() if st is not None else "" for st in streamers]
            met = [st.stopped_by(stop_strings) if st is not None else None for st in streamers]
            news = [list(tokens[i * room:i * room + g[i].n_tokens]) for i in range(B)]
            # Whole, once (a reader never sees a list being filled), under the model's lock (as generate()).
            self.last_generation = [_generation_record(news[i], g[i], met[i]) for i in range(B)]
        for i, tail in enumerate(tails):
            if tail and stream is not None:
                stream(i, tail)
        out = []
        for i, new in enumerate(news):
            if streamers[i] is not None:  # the text streamed (decoded once)
                out.append("".join(streamers[i].pieces))
            else:
                out.append(self._text_of(encoded[i][1], new, stops, stop_strings, skip_special_tokens)
                           if _text_prompt(prompts[i]) else new)
        return out

    def close(self):
        """Frees the model's memory now (GPU memory included) rather than when it is collected."""
        if getattr(self, "_handle", None) is None:
            return
        with self._busy("close") as h:
            if h.value:
                _capi.lib.twell_model_destroy(h)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _check_count(max_new_tokens):
    return _int(max_new_tokens, "max_new_tokens", 0, 2**1000, "an integer of at least 0")


def _tokens_arg(value, what, least):
    """`value` as an int of at least `least` tokens that a C int64 holds (numpy's integers too), or TwellError."""
    return _int(value, what, least, expected=f"a number of tokens of at least {least}")


def _generation_record(new, g, stop_string=None):
    """last_generation's dict of one sequence's new ids and its twell_generation; stop_string: the one that
    ended it (its callback's stop), if any."""
    record = {"tokens": new, "reason": _capi.STOP_REASONS.get(g.reason, "?"), "prefill_seconds": g.prefill_seconds,
              "decode_seconds": g.decode_seconds, "reused_tokens": g.reused,
              "tokens_per_second": (len(new) - 1) / g.decode_seconds if len(new) >= 2 and g.decode_seconds > 0
              else 0.0}
    if stop_string is not None:
        record["reason"], record["stop_string"] = "stop_string", stop_string
    return record


def _stop_strings(value):
    """stop_strings as a list of str (None: none; one str: that one), each non-empty (the library checks
    the rest when a stream takes them)."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not hasattr(value, "__iter__") or isinstance(value, (bytes, bytearray)):
        raise TwellError(f"stop_strings must be a str or a list of str, got {type(value).__name__} {value!r}")
    value = list(value)
    for v in value:
        if not isinstance(v, str):
            raise TwellError(f"stop_strings must be a str or a list of str; one is {type(v).__name__} {v!r}")
        if not v:
            raise TwellError("stop_strings: a stop string must not be empty")
    return value


def _stream_call(state, call):
    """A C token callback's body: call() (what _streamed returns: 1 to stop), or 1 without it once a
    callback raised or a Ctrl-C came (every sequence stops). An exception cannot cross the C frames: it is
    kept in state["error"] for _callback_error_first to raise once the C call returns."""
    if state["error"] is not None or state["interrupted"]:  # a Ctrl-C that ctypes dropped at a callback's entry too
        return 1
    try:
        stop_now = call()
        state["interrupted"] = False  # one the callback caught itself is its own to handle
        return stop_now
    except BaseException as e:
        state["error"] = e
        return 1


def _streamed(streamer, emit, token):
    """Passes emit (None: nobody) what token adds: the token itself (no streamer: an id prompt), or the text
    it adds (nothing where that is empty). 1 where emit returned True or a stop string was met (stop), else 0."""
    if streamer is None:
        return 1 if emit(token) is True else 0
    text = streamer.add(token)
    asked = text and emit is not None and emit(text) is True
    return 1 if asked or streamer.stopped else 0


class _callback_error_first:
    """Raises the exception a stream callback raised (kept in state["error"]: it cannot cross the C
    frames) once the C call returns, before any error of the call itself, which becomes its cause.
    (A class, not a generator: a callback's StopIteration must reach the caller as it is.)"""

    def __init__(self, state):
        self.state = state

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        error = self.state["error"]
        if error is not None and (kind is None or issubclass(kind, TwellError)):
            raise error from value if value is not None else None
        if kind is None and self.state.get("interrupted"):
            raise KeyboardInterrupt
        return False


_interruptible = []  # the states of the generations in progress on the main thread


def _sigint(signum, frame):
    """Python's Ctrl-C (KeyboardInterrupt), noted first in every generation in progress. Left installed by
    a Ctrl-C at the wrong moment, it does no harm: with none in progress it is Python's own."""
    for state in _interruptible:
        state["interrupted"] = True
    signal.default_int_handler(signum, frame)


def _notes_interrupts():
    """Whether a Ctrl-C can be noted here (_interrupt_noted): on the main thread, over Python's own handler."""
    return threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _sigint)


def _quiet_interrupts(unraisable):
    """sys.unraisablehook while generations are noted: the KeyboardInterrupt ctypes cannot pass out of a
    token callback is noted already (_sigint), not printed as an ignored exception; the rest as before."""
    if not issubclass(unraisable.exc_type, KeyboardInterrupt):
        _quiet_interrupts.previous(unraisable)


class _interrupt_noted:
    """Notes a Ctrl-C in state["interrupted"] while a C call that runs token callbacks is in progress.
    Python raises KeyboardInterrupt as a callback is entered, where ctypes can only drop it and go on:
    so the callbacks after it stop the generation and _callback_error_first raises it once C returns.
    (Only where _notes_interrupts(); generations without a stream get a callback for this alone.)"""

    def __init__(self, state):
        self.state, self.active = state, False

    def __enter__(self):
        if _notes_interrupts():
            self.active = True
            if not _interruptible:
                _quiet_interrupts.previous = sys.unraisablehook
                sys.unraisablehook = _quiet_interrupts
            _interruptible.append(self.state)
            try:
                signal.signal(signal.SIGINT, _sigint)
            except BaseException:
                self.__exit__(None, None, None)
                raise
        return self

    def __exit__(self, kind, value, tb):
        if self.active:
            self.active = False
            # By identity: states are dicts, and list.remove's equality could take another call's.
            _interruptible[:] = [state for state in _interruptible if state is not self.state]
            if not _interruptible:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                if sys.unraisablehook is _quiet_interrupts:
                    sys.unraisablehook = _quiet_interrupts.previous
        return False


class _streams_open:
    """Keeps text streams' tokenizers from being closed while they are read, and frees the streams after."""

    def __init__(self, streamers):
        self.streamers, self.counted = [s for s in streamers if s is not None], []

    def __enter__(self):
        try:
            for s in self.streamers:
                with s.tokenizer._lock:
                    s.tokenizer._streams += 1
                    self.counted.append(s)
        except BaseException:  # a Ctrl-C half way: the ones counted are uncounted, or the tokenizer never closes
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind, value, tb):
        for s in self.counted:
            with s.tokenizer._lock:
                s.tokenizer._streams -= 1
        self.counted = []
        for s in self.streamers:
            s.close()
        return False


class _TextStream(_FreedByDestroy):
    """The text a str prompt's new ids add, as they come (twell_text_stream: the stream `twell run` prints):
    decode(prompt + new ids) past decode(prompt), a window of recent ids at a time, so a token's cost does not
    grow with the text; whole characters a piece (a character split across tokens waits for its end), nothing
    for a stop id, and nothing from a stop string on (stopped is then True); rest() gives what is held: the
    start of a stop string that never went on and the bytes of a character that never ended."""

    _DESTROY = "twell_text_stream_destroy"

    def __init__(self, tokenizer, prompt_ids, stops, stop_strings=(), skip_special_tokens=False):
        self.tokenizer = tokenizer  # the stream reads it: it must outlive the stream
        c_prompt, n_prompt = _ids(prompt_ids, "prompt")
        c_stops, n_stops = _ids(stops, "stop")
        handle = ctypes.c_void_p()
        with tokenizer._using() as t:
            _capi.check(_capi.lib.twell_text_stream_create(t, c_prompt, n_prompt, c_stops, n_stops,
                                                           ctypes.byref(handle)))
        self._handle = handle
        self.pieces = []  # every piece given: the text so far
        self.stopped, self._which, self._stops = False, -1, bool(stop_strings)
        try:
            if stop_strings:
                encoded = [v.encode("utf-8", errors="surrogatepass") for v in stop_strings]
                strings = (ctypes.c_char_p * len(encoded))(*encoded)
                lengths = (ctypes.c_size_t * len(encoded))(*(len(v) for v in encoded))
                _capi.check(_capi.lib.twell_text_stream_stop_at(self._handle, strings, lengths, len(encoded)))
            if skip_special_tokens:  # the special ids add no text, in the prompt as in the new ids
                _capi.check(_capi.lib.twell_text_stream_skip_special_tokens(self._handle))
        except BaseException:
            self.close()
            raise

    def _piece(self, call, *args):
        text, length = ctypes.c_void_p(), ctypes.c_size_t()
        with self.tokenizer._using():  # the stream decodes with it
            _capi.check(call(self._handle, *args, ctypes.byref(text), ctypes.byref(length)))
        return ctypes.string_at(text, length.value).decode("utf-8", errors="replace") if length.value else ""

    def add(self, token):
        """The text token adds ("" for a stop token, or where a character has not ended); sets stopped once
        a stop string is met."""
        text = self._piece(_capi.lib.twell_text_stream_put, token)
        self.pieces.append(text)
        if self._stops and not self.stopped:
            flag, which = ctypes.c_int(), ctypes.c_int64()
            _capi.check(_capi.lib.twell_text_stream_stopped(self._handle, ctypes.byref(flag), ctypes.byref(which)))
            self.stopped, self._which = bool(flag.value), which.value
        return text

    def stopped_by(self, stop_strings):
        """The stop string (of those given) that ended the text, or None."""
        return stop_strings[self._which] if self.stopped else None

    def rest(self):
        """What is held, as text ("" where nothing is): the start of a stop string that never went on, and the
        bytes of a character that never ended."""
        text = self._piece(_capi.lib.twell_text_stream_finish)
        self.pieces.append(text)
        return text
