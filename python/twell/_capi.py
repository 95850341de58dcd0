"""ctypes bindings of libtwell_c.so, twell's C interface (include/twell/c_api.h).

No dependency beyond the standard library: the torch layer (twell/__init__.py) builds on this, and
the tests of the C interface run with it alone.

The library is found, in order, at $TWELL_LIBRARY, in the build folders of the repository this
package lives in (build/, build-*/), beside this package, then by the dynamic loader.
"""
import ctypes
import glob
import operator
import os

API_VERSION = 10
MAX_DIMS = 4
OK, ERROR = 0, 1
BF16, F16, F32, F64 = 0, 1, 2, 3
CPU, CUDA = 0, 1
PRECISION = {"bf16": 0, "h_fp32": 1, "f64": 2}
DISPATCH = {"observe": 0, "previous": 1, "always_sparse": 2, "always_dense": 3}
PATH_NAMES = {0: "sparse", 1: "gather", 2: "dense", 3: "none"}


class TwellError(RuntimeError):
    """A call twell refused or that failed; the message says which argument and why."""


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("device", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("shape", ctypes.c_int64 * MAX_DIMS)]


class ActivationStats(ctypes.Structure):
    _fields_ = [("tokens", ctypes.c_int64), ("nnz", ctypes.c_int64), ("max_nnz_per_token", ctypes.c_int64),
                ("l1_sum", ctypes.c_double)]


class FfnStats(ctypes.Structure):
    _fields_ = [("path", ctypes.c_int32), ("tokens", ctypes.c_int64), ("nnz", ctypes.c_int64),
                ("spilled_tiles", ctypes.c_int64), ("sampled_density", ctypes.c_double)]


class CudaFfnConfig(ctypes.Structure):
    _fields_ = [("max_tokens", ctypes.c_int64), ("hidden", ctypes.c_int64), ("ffn", ctypes.c_int64),
                ("gated", ctypes.c_int32), ("training", ctypes.c_int32), ("dispatch", ctypes.c_int32),
                ("precision", ctypes.c_int32), ("cublaslt_workspace", ctypes.c_void_p),
                ("cublaslt_workspace_bytes", ctypes.c_int64), ("reserved", ctypes.c_int64 * 2)]


CHOOSE = {"auto": 0, "cpu": 1, "cuda": 2}
STOP_REASONS = {0: "stop_token", 1: "max_tokens", 2: "context_full", 3: "callback"}
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_void_p)
TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_void_p)
BATCH_TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p)


class ModelOptions(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int32), ("dense_ffn", ctypes.c_int32), ("bf16_ffn", ctypes.c_int32),
                ("check_finite", ctypes.c_int32), ("context", ctypes.c_int64), ("kv_cache", ctypes.c_int32),
                ("reserved0", ctypes.c_int32), ("log", LOG_FN), ("log_user", ctypes.c_void_p),
                ("gpu_memory", ctypes.c_int64), ("max_batch", ctypes.c_int64), ("max_tokens", ctypes.c_int64),
                ("reserved", ctypes.c_int64 * 1)]


class ModelInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                                                     "num_heads", "num_kv_heads", "head_dim", "context")] + \
               [("device", ctypes.c_int32), ("relu", ctypes.c_int32), ("max_batch", ctypes.c_int64)]


class Sampling(ctypes.Structure):
    _fields_ = [("temperature", ctypes.c_double), ("top_k", ctypes.c_int64), ("top_p", ctypes.c_double),
                ("seed", ctypes.c_uint64), ("vocab_limit", ctypes.c_int64), ("min_p", ctypes.c_double),
                ("repetition_penalty", ctypes.c_double), ("reserved", ctypes.c_int64 * 1)]


class Generation(ctypes.Structure):
    _fields_ = [("n_tokens", ctypes.c_int64), ("reason", ctypes.c_int32), ("reused", ctypes.c_int32),
                ("prefill_seconds", ctypes.c_double), ("decode_seconds", ctypes.c_double)]


class TokenizerInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in ("vocab_size", "bos_id", "eos_id", "bos_to_add", "eos_to_add")]


def _integer(value, what, expected):
    """An int of what has one (int, numpy's integers, a one-element integer tensor): not a bool, float or str."""
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):  # numpy's and torch's bools too
        raise TwellError(f"{what} must be {expected}, got {type(value).__name__} {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TwellError(f"{what} must be {expected}, got {type(value).__name__} {value!r}") from None


def _int(value, what, least, below=2**63, expected=None):
    """`value` as an int in [least, below) (numpy's integers too: not bools, floats or strings), or TwellError
    "{what} must be {expected}, got {value!r}"."""
    expected = expected or f"an integer in [{least}, {below})"
    v = _integer(value, what, expected)
    if not least <= v < below:
        raise TwellError(f"{what} must be {expected}, got {value!r}")
    return v


def tensor(data, dtype, device, shape):
    """A twell_tensor: data an address (int) or None, shape a sequence of 1 to 4 sizes."""
    if not 1 <= len(shape) <= MAX_DIMS:
        raise TwellError(f"a tensor has 1 to {MAX_DIMS} dimensions, got shape {tuple(shape)}")
    t = Tensor(data, dtype, device, len(shape))
    for i, n in enumerate(shape):
        t.shape[i] = n
    return t


def _candidates():
    env = os.environ.get("TWELL_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    found = []
    for folder in [os.path.join(repo, "build")] + sorted(glob.glob(os.path.join(repo, "build-*"))):
        found.append(os.path.join(folder, "libtwell_c.so"))
    found.append(os.path.join(here, "libtwell_c.so"))
    found.append("libtwell_c.so")  # the loader's search path (an installed twell)
    return found


def _load():
    """The first candidate that loads and has this package's C API version (a stale build folder is passed over)."""
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path)
            continue
        try:
            found = ctypes.CDLL(path)
            version = found.twell_c_api_version
        except (OSError, AttributeError) as e:
            tried.append(f"{path} ({e})")
            continue
        version.restype, version.argtypes = ctypes.c_int32, []
        if version() == API_VERSION:
            return found
        tried.append(f"{path} (C API version {version()}, this package's {API_VERSION}: rebuild it from the same "
                     "checkout)")
    raise ImportError(f"twell: no libtwell_c.so of C API version {API_VERSION} found (build it: cmake --build build "
                      "--target twell_c; a package installed with pip install -e python finds it in the repository's "
                      "build folders, one installed otherwise needs TWELL_LIBRARY set to its path); tried "
                      + ", ".join(tried))


lib = _load()

_P = ctypes.POINTER
_T = _P(Tensor)
_sig = {
    "twell_c_api_version": (ctypes.c_int32, []),
    "twell_version": (ctypes.c_char_p, []),
    "twell_last_error": (ctypes.c_char_p, []),
    "twell_path_name": (ctypes.c_char_p, [ctypes.c_int32]),
    "twell_cpu_set_num_threads": (ctypes.c_int, [ctypes.c_int32, _P(ctypes.c_int32)]),
    "twell_cpu_ffn_forward": (ctypes.c_int, [_T, _T, _T, _T, _T, ctypes.c_int32, _P(ActivationStats), _T]),
    "twell_cpu_ffn_backward": (ctypes.c_int, [_T, _T, _T, _T, _T, ctypes.c_double, _T, _T, _T, _T, ctypes.c_int32]),
    "twell_cuda_available": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]),
    "twell_cuda_ffn_config_init": (None, [_P(CudaFfnConfig), ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]),
    "twell_cuda_ffn_workspace_bytes": (ctypes.c_int, [_P(CudaFfnConfig), _P(ctypes.c_size_t)]),
    "twell_cuda_ffn_create": (ctypes.c_int, [_P(CudaFfnConfig), ctypes.c_void_p, ctypes.c_size_t,
                                             _P(ctypes.c_void_p)]),
    "twell_cuda_ffn_destroy": (None, [ctypes.c_void_p]),
    "twell_cuda_ffn_use_workspace": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "twell_cuda_ffn_forward": (ctypes.c_int, [ctypes.c_void_p, _T, _T, _T, _T, _T, ctypes.c_void_p]),
    "twell_cuda_ffn_backward": (ctypes.c_int, [ctypes.c_void_p, _T, _T, _T, _T, _T, ctypes.c_double, _T, _T, _T, _T,
                                               ctypes.c_void_p]),
    "twell_cuda_ffn_last_stats": (ctypes.c_int, [ctypes.c_void_p, _P(FfnStats)]),
    "twell_cuda_release_scratch": (ctypes.c_int, []),
    "twell_parse_bytes": (ctypes.c_int, [ctypes.c_char_p, _P(ctypes.c_int64)]),
    "twell_model_options_init": (None, [_P(ModelOptions)]),
    "twell_model_load": (ctypes.c_int, [ctypes.c_char_p, _P(ModelOptions), _P(ctypes.c_void_p)]),
    "twell_model_destroy": (None, [ctypes.c_void_p]),
    "twell_model_get_info": (ctypes.c_int, [ctypes.c_void_p, _P(ModelInfo)]),
    "twell_model_logits": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64, _P(ctypes.c_float),
                                          _P(ActivationStats)]),
    "twell_model_prefill": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64, _P(ctypes.c_float)]),
    "twell_model_decode_step": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int32, _P(ctypes.c_float)]),
    "twell_model_reset": (ctypes.c_int, [ctypes.c_void_p]),
    "twell_model_set_prefix_reuse": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int32]),
    "twell_model_cached_tokens": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int64)]),
    "twell_model_eos_ids": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64, _P(ctypes.c_int64)]),
    "twell_model_perplexity_windows": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64,
                                                      ctypes.c_int64, ctypes.c_int64, _P(ctypes.c_double),
                                                      _P(ctypes.c_double), _P(ctypes.c_int64)]),
    "twell_model_token_nll": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64,
                                             _P(ctypes.c_double)]),
    "twell_model_ffn_stats": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64, ctypes.c_int64,
                                             _P(ActivationStats)]),
    "twell_model_perplexity": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64,
                                              _P(ctypes.c_double), _P(ctypes.c_double)]),
    "twell_sampling_init": (None, [_P(Sampling)]),
    "twell_model_generation_sampling": (ctypes.c_int, [ctypes.c_void_p, _P(Sampling), ctypes.c_uint32,
                                                       _P(ctypes.c_uint32), _P(ctypes.c_char_p)]),
    "twell_model_generate": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64, ctypes.c_int64,
                                            _P(Sampling), _P(ctypes.c_int32), ctypes.c_int64, TOKEN_FN,
                                            ctypes.c_void_p, _P(ctypes.c_int32), _P(Generation)]),
    "twell_model_generate_batch": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), _P(ctypes.c_int64),
                                                  ctypes.c_int64, ctypes.c_int64, _P(Sampling), _P(ctypes.c_int32),
                                                  ctypes.c_int64, BATCH_TOKEN_FN, ctypes.c_void_p, _P(ctypes.c_int32),
                                                  _P(Generation)]),
    "twell_tokenizer_load": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int32, _P(ctypes.c_void_p)]),
    "twell_tokenizer_destroy": (None, [ctypes.c_void_p]),
    "twell_tokenizer_get_info": (ctypes.c_int, [ctypes.c_void_p, _P(TokenizerInfo)]),
    "twell_tokenizer_encode": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, _P(ctypes.c_int32),
                                              ctypes.c_int64, _P(ctypes.c_int64)]),
    "twell_tokenizer_special_ids": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64,
                                                   _P(ctypes.c_int64)]),
    "twell_tokenizer_decode": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64, ctypes.c_char_p,
                                              ctypes.c_size_t, _P(ctypes.c_size_t)]),
    "twell_text_stream_create": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int32), ctypes.c_int64,
                                                _P(ctypes.c_int32), ctypes.c_int64, _P(ctypes.c_void_p)]),
    "twell_text_stream_destroy": (None, [ctypes.c_void_p]),
    "twell_text_stream_put": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int32, _P(ctypes.c_void_p), _P(ctypes.c_size_t)]),
    "twell_text_stream_finish": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_void_p), _P(ctypes.c_size_t)]),
    "twell_text_stream_stop_at": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_char_p), _P(ctypes.c_size_t),
                                                 ctypes.c_int64]),
    "twell_text_stream_skip_special_tokens": (ctypes.c_int, [ctypes.c_void_p]),
    "twell_text_stream_stopped": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_int), _P(ctypes.c_int64)]),
    "twell_chat_template_load": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                                _P(ctypes.c_void_p)]),
    "twell_chat_template_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, _P(ctypes.c_void_p)]),
    "twell_chat_template_destroy": (None, [ctypes.c_void_p]),
    "twell_chat_template_describe": (ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_void_p), _P(ctypes.c_size_t),
                                                    _P(ctypes.c_void_p), _P(ctypes.c_size_t)]),
    "twell_chat_template_special_tokens": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                                          _P(ctypes.c_size_t)]),
    "twell_chat_template_apply": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                                 _P(ctypes.c_void_p), _P(ctypes.c_size_t)]),
}
for _name, (_res, _args) in _sig.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args


def check(rc):
    """Raises TwellError with the library's message unless rc is OK."""
    if rc != OK:
        raise TwellError(lib.twell_last_error().decode(errors="replace"))


def ref(t):
    """A pointer to a twell_tensor, or NULL for None."""
    return None if t is None else ctypes.byref(t)


def parse_bytes(text):
    """Bytes of "40GB", "512M", "1000" (decimal units, as twell prints them)."""
    n = ctypes.c_int64()
    check(lib.twell_parse_bytes(str(text).encode(), ctypes.byref(n)))
    return n.value


def version():
    return lib.twell_version().decode()


def set_num_threads(n):
    """Threads of the CPU backend (its FFN and models; results do not depend on the count): n >= 1, or 0
    for the default (TWELL_NUM_THREADS, else every hardware thread). Returns the setting it replaces."""
    n = _int(n, "set_num_threads: n", 0, 4097, expected="an integer in [0, 4096] (0: the default)")
    previous = ctypes.c_int32()
    check(lib.twell_cpu_set_num_threads(n, ctypes.byref(previous)))
    return previous.value


def cuda_available():
    """(True, "") where a Hopper GPU is present and the library has the CUDA backend, else (False, why)."""
    why = ctypes.create_string_buffer(512)
    ok = lib.twell_cuda_available(why, len(why)) == 1
    return ok, why.value.decode(errors="replace")


class CudaFfn:
    """An FfnForward (twell/cuda/ffn.h) behind a handle; destroyed with this object."""

    def __init__(self, config, workspace=None, workspace_bytes=0):
        """An FfnForward of `config` (make_config), on `workspace` (a device pointer) or its own memory."""
        self.config = config
        handle = ctypes.c_void_p()
        check(lib.twell_cuda_ffn_create(ctypes.byref(self.config), workspace, workspace_bytes, ctypes.byref(handle)))
        self.handle = handle

    @staticmethod
    def make_config(max_tokens, hidden, ffn, gated=True, training=False, dispatch="previous", precision="bf16",
                    cublaslt_workspace=None, cublaslt_workspace_bytes=0):
        if dispatch not in DISPATCH:
            raise TwellError(f"dispatch must be one of {', '.join(DISPATCH)}, got {dispatch!r}")
        if precision not in ("bf16", "h_fp32"):
            raise TwellError(f"precision on the GPU must be bf16 or h_fp32, got {precision!r}")
        c = CudaFfnConfig()
        lib.twell_cuda_ffn_config_init(ctypes.byref(c), max_tokens, hidden, ffn)
        c.gated, c.training = int(gated), int(training)
        c.dispatch, c.precision = DISPATCH[dispatch], PRECISION[precision]
        c.cublaslt_workspace, c.cublaslt_workspace_bytes = cublaslt_workspace, cublaslt_workspace_bytes
        return c

    @staticmethod
    def workspace_bytes(config):
        n = ctypes.c_size_t()
        check(lib.twell_cuda_ffn_workspace_bytes(ctypes.byref(config), ctypes.byref(n)))
        return n.value

    def use_workspace(self, workspace, workspace_bytes):
        check(lib.twell_cuda_ffn_use_workspace(self.handle, workspace, workspace_bytes))

    def forward(self, x, wg, wu, wd, y, stream):
        check(lib.twell_cuda_ffn_forward(self.handle, ref(x), ref(wg), ref(wu), ref(wd), ref(y), stream))

    def backward(self, x, wg, wu, wd, dy, l1_coeff, dx, dwg, dwu, dwd, stream):
        check(lib.twell_cuda_ffn_backward(self.handle, ref(x), ref(wg), ref(wu), ref(wd), ref(dy), l1_coeff, ref(dx),
                                          ref(dwg), ref(dwu), ref(dwd), stream))

    def last_stats(self):
        s = FfnStats()
        check(lib.twell_cuda_ffn_last_stats(self.handle, ctypes.byref(s)))
        return {"path": PATH_NAMES.get(s.path, "?"), "tokens": s.tokens, "nnz": s.nnz,
                "spilled_tiles": s.spilled_tiles, "sampled_density": s.sampled_density, "max_nnz_per_token": -1,
                "l1_sum": -1}

    def close(self):
        if getattr(self, "handle", None) is not None and self.handle.value:
            lib.twell_cuda_ffn_destroy(self.handle)
        self.handle = None

    def __del__(self):
        # Not destroyed here: the collector may run on any thread at any time, e.g. while another thread
        # captures a CUDA graph (the destructor frees device memory). reap() does it at twell's next call.
        if getattr(self, "handle", None) is not None and self.handle.value:
            _graveyard.append(self.handle)
        self.handle = None


_graveyard = []  # handles of CudaFfn objects collected without close(): destroyed by reap()


def reap():
    """Destroys the handles whose objects were collected (called by twell's GPU calls, under a device's lock)."""
    while _graveyard:
        try:
            handle = _graveyard.pop()
        except IndexError:  # another thread took the last
            return
        lib.twell_cuda_ffn_destroy(handle)
