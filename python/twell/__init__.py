"""twell from PyTorch: the sparse (TwELL) ReLU-gated FFN, forward and backward, on torch tensors.

    import torch, twell
    ffn = twell.FFN.from_hf_mlp(model.model.layers[0].mlp)  # a ReLU-gated HF Llama MLP's weights, in bf16
    y = ffn(x)                                  # x [..., H] bf16; exact at any density
    ffn.last_stats()                            # of a sparse model: {'path': 'sparse', 'nnz': ..., ...}
    loss = criterion(y) ; loss.backward()       # twell's backward, over the active set only

    twell.replace_hf_mlps(model)                # every ReLU-gated MLP of a model swapped for a twell.FFN
    model.save_pretrained(d, state_dict=twell.hf_state_dict(model))  # saved as the HF checkpoint it was
    ffn = twell.FFN(2048, 5632, device="cuda")  # new bf16 weights: gate and up [I, H], down neuron-major [I, H]
    y = twell.ffn_forward(x, wg, wu, wd)        # functional, no autograd

    model = twell.Model("models/smol")          # a whole HF checkpoint on the GPU (or the CPU): twell/model.py
    model.generate("Once upon a time", max_new_tokens=32, stream=lambda text: print(text, end=""))

The GPU path needs a Hopper GPU and bf16 tensors; on the CPU the reference backend runs (bf16, f32
or f64 tensors; slow, for checking). What each call computes and where it rounds: FFN's docstring and
include/twell/cuda/ffn.h. The library is libtwell_c.so (twell/_capi.py says where it is looked for).
"""
import inspect
import itertools
import math
import numbers
import random
import re
import threading
import warnings
import weakref
from typing import List, Optional, Tuple

try:  # PyTorch first where it is installed: its CUDA libraries (cuBLASLt) are then the ones libtwell_c.so finds
    import torch
except ImportError:
    torch = None

from ._capi import TwellError, set_num_threads, version
from . import _capi
from .model import ChatTemplate, Model, Tokenizer

__all__ = ["FFN", "ffn_forward", "replace_hf_mlps", "hf_state_dict", "ChatTemplate", "Model", "Tokenizer", "TwellError",
           "cuda_available", "cuda_unavailable_reason", "version", "set_num_threads", "l1_coefficient", "clear_cache"]
__version__ = version()


def cuda_available():
    """True where a Hopper GPU is present and the library has the CUDA backend."""
    return _capi.cuda_available()[0]


def cuda_unavailable_reason():
    """Why cuda_available() is False ("" where it is True)."""
    return _capi.cuda_available()[1]


def l1_coefficient(l1, tokens, layers=1):
    """The coefficient of Σ|h| in L = CE + λ · mean over layers of (1/M) Σ|h| (DESIGN.md §2)."""
    if tokens < 0 or layers < 1:
        raise ValueError(f"l1_coefficient: expected tokens >= 0 and layers >= 1, got tokens {tokens}, layers {layers}")
    if not (isinstance(l1, numbers.Real) and math.isfinite(l1) and l1 >= 0):
        raise ValueError(f"l1_coefficient: l1 must be a finite number of at least 0 (as twell.FFN's l1), got {l1!r}")
    return l1 / (float(tokens) * float(layers)) if tokens > 0 else 0.0


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("twell's FFN on tensors needs PyTorch (pip install torch); twell._capi works without it") \
            from e
    return torch


def _dtype_code(t):
    torch = _torch()
    codes = {torch.bfloat16: _capi.BF16, torch.float32: _capi.F32, torch.float64: _capi.F64}
    if t.dtype not in codes:
        raise TwellError(f"twell takes bfloat16, float32 or float64 tensors, got {t.dtype}" +
                         (" (it has no float16 kernels: convert the model with .to(torch.bfloat16))"
                          if t.dtype == torch.float16 else ""))
    return codes[t.dtype]


def _aligned(t):
    """t, or a copy where it is a CUDA tensor not 16-byte aligned: the GPU kernels read 16-byte vectors, and
    refuse a contiguous view at an odd offset (buf[3:], a slice of torch.cat's result) that PyTorch passes."""
    if t is None or not t.is_cuda:
        return t
    try:
        address = t.data_ptr()
    except RuntimeError:  # no storage (torch.vmap's batched tensors, fake ones): the op sees the real ones
        return t
    return t if address % 16 == 0 else t.clone()


def _c(t, name):
    """The twell_tensor of a contiguous torch tensor, or None for None."""
    if t is None:
        return None
    if not t.is_contiguous():
        raise TwellError(f"{name}: twell takes contiguous tensors (call .contiguous())")
    device = _capi.CUDA if t.is_cuda else _capi.CPU
    if not t.is_cuda and t.device.type != "cpu":
        raise TwellError(f"{name}: twell takes CPU or CUDA tensors, got one on {t.device}")
    return _capi.tensor(t.data_ptr(), _dtype_code(t), device, tuple(t.shape))


class _CpuRunner:
    """The CPU reference backend."""

    def __init__(self, precision):
        self.precision = _capi.PRECISION[precision]
        self.stats = None
        self.generation = next(_generations)  # what a backward finds it by

    def forward(self, x, wg, wu, wd):
        torch = _torch()
        y = torch.empty_like(x)
        s = _capi.ActivationStats()
        _capi.check(_capi.lib.twell_cpu_ffn_forward(_capi.ref(_c(x, "x")), _capi.ref(_c(wg, "wg")),
                                                    _capi.ref(_c(wu, "wu")), _capi.ref(_c(wd, "wd")),
                                                    _capi.ref(_c(y, "y")), self.precision, _capi.ctypes.byref(s),
                                                    None))
        self.stats = {"path": "cpu", "tokens": s.tokens, "nnz": s.nnz, "spilled_tiles": -1, "sampled_density": -1,
                      "max_nnz_per_token": s.max_nnz_per_token, "l1_sum": s.l1_sum}
        return y, self.generation

    def release(self):
        pass

    def backward(self, x, wg, wu, wd, dy, l1_coeff, needed, generation):
        torch = _torch()
        acc = torch.float64 if self.precision == _capi.PRECISION["f64"] else torch.float32
        grads = [torch.empty(t.shape, dtype=acc) if (t is not None and need) else None
                 for t, need in zip((x, wg, wu, wd), needed)]
        _capi.check(_capi.lib.twell_cpu_ffn_backward(
            *(_capi.ref(_c(t, n)) for t, n in zip((x, wg, wu, wd, dy), ("x", "wg", "wu", "wd", "dy"))), l1_coeff,
            *(_capi.ref(_c(g, n)) for g, n in zip(grads, ("dx", "dwg", "dwu", "dwd"))), self.precision))
        return grads


class _Device:
    """What the FfnForward objects of one GPU share, from PyTorch's allocator, and so the order of their calls:
    one host thread at a time (`lock`), each call's stream after the stream of the call before (`order`).

    - cuBLASLt's workspace: 64 MiB for all of them (as a cuBLAS handle's is shared), not 64 MiB each.
    - The inference runners' forward workspace: a call writes each buffer it reads there first and copies
      what it keeps (counts, density samples) to its object's own host memory (FfnForward's constructor
      with a workspace says so), so a model's layers hold one, sized for the largest, not one each. A
      training runner gives each forward its own (FfnForward::use_workspace): its backward reads what the
      forward left there.
    The runners hold the memory (the device only refers to it); when the shared forward workspace grows,
    the others let the old memory go at once and are rebuilt on the new at their next call.
    """

    LT_BYTES = 64 << 20  # LtGemm::kWorkspaceBytes

    def __init__(self, device):
        self.device, self.lock = device, threading.Lock()
        self.lt, self.forward, self.last_stream = None, None, None  # lt, forward: weak references
        self.used = False  # a handle was built here (so twell's scratch pool may hold memory)
        self.runners = weakref.WeakSet()  # the inference runners that took the forward workspace

    def new(self, nbytes):
        """Device memory on the current stream (the call's; order() makes other streams wait)."""
        return _torch().empty(max(nbytes, 1), dtype=_torch().uint8, device=self.device)

    def take_lt(self):
        """cuBLASLt's workspace (called with the lock held)."""
        lt = self.lt() if self.lt is not None else None
        if lt is None:
            lt = self.new(self.LT_BYTES)
            self.lt = weakref.ref(lt)
        return lt

    def take_forward(self, nbytes, runner):
        """The shared forward workspace, at least `nbytes` bytes, for `runner`, about to build on it (called
        with the lock held)."""
        memory = self.forward() if self.forward is not None else None
        if memory is None or memory.numel() < nbytes:
            for other in list(self.runners):
                if other is not runner:
                    other.let_go()
            memory = None  # PyTorch frees it after the work queued on it
            memory = self.new(nbytes)
            self.forward = weakref.ref(memory)
        self.runners.add(runner)
        return memory

    def order(self, stream, memories):
        """Makes `stream` wait for the stream of the call before (they share memory), and the call's memory
        wait for `stream` before PyTorch reuses it."""
        if self.last_stream is not None and stream != self.last_stream:
            stream.wait_stream(self.last_stream)
        for memory in memories:  # at every call: another runner's call may have made the switch
            memory.record_stream(stream)  # not freed before this stream's work on it is done
        self.last_stream = stream


_devices = {}  # torch.device -> _Device
_devices_lock = threading.Lock()


def _device(device):
    with _devices_lock:
        return _devices.setdefault(device, _Device(device))


class _GpuRunner:
    """What the GPU runners share: their FFN's shape and options, their _Device, and the locks. Calls may come
    from any stream and thread: the device's lock and order serialise them. `lock` guards the runner's own
    objects (statistics wait for the GPU under it, not under the device's); it is taken after the device's."""

    def __init__(self, device, hidden, ffn, gated, dispatch, precision):
        self.device, self.hidden, self.ffn, self.gated = device, hidden, ffn, gated
        self.dispatch, self.precision = dispatch, precision
        self.shared = _device(device)
        self.lock = threading.Lock()

    def _config(self, tokens, training, lt):
        return _capi.CudaFfn.make_config(tokens, self.hidden, self.ffn, self.gated, training, self.dispatch,
                                         self.precision, lt.data_ptr(), lt.numel())

    def reserve(self, tokens):
        """Sizes the runner for calls of up to `tokens` tokens now, not at the first larger call."""
        torch = _torch()
        with self.shared.lock, self.lock, torch.cuda.device(self.device):
            self._reserve(tokens)

    def release(self):
        torch = _torch()
        with self.lock, torch.cuda.device(self.device):
            self._release()


class _CudaRunner(_GpuRunner):
    """An inference FfnForward on one GPU, on its _Device's shared forward workspace, grown with the token count."""

    def __init__(self, *args):
        super().__init__(*args)
        self.handle, self.memory, self.lt, self.max_tokens, self.kept_stats = None, None, None, 0, None
        self.generation = next(_generations)  # what the op returns (inference has no backward)

    def _reserve(self, tokens):
        """With the device's lock and ours held, on the call's device and stream."""
        if self.handle is not None and tokens <= self.max_tokens:
            return
        tokens = max(-(-tokens // 4096) * 4096, self.max_tokens)  # multiples of 4096 tokens: fewer rebuilds
        self._release()
        lt = self.shared.take_lt()
        config = self._config(tokens, False, lt)
        nbytes = _capi.CudaFfn.workspace_bytes(config)
        memory = self.shared.take_forward(nbytes, self)
        self.handle = _capi.CudaFfn(config, memory.data_ptr(), nbytes)
        self.shared.used = True
        self.memory, self.lt, self.max_tokens, self.kept_stats = memory, lt, tokens, None

    def _release(self):
        """With our lock held."""
        if self.handle is not None:
            self.handle.close()
        self.handle, self.memory, self.lt, self.max_tokens, self.kept_stats = None, None, None, 0, None

    def let_go(self):
        """Another runner grows the shared forward workspace: this one lets the old memory go now (with the
        device's lock held) and is rebuilt at its size at its next call; its last statistics are kept till then."""
        with self.lock:
            if self.handle is not None:
                stats, size = self.handle.last_stats(), self.max_tokens
                self._release()
                self.kept_stats, self.max_tokens = stats, size

    def forward(self, x, wg, wu, wd):
        torch = _torch()
        with self.shared.lock, self.lock, torch.cuda.device(self.device):
            _capi.reap()
            self._reserve(x.shape[0])
            stream = torch.cuda.current_stream(self.device)
            self.shared.order(stream, (self.memory, self.lt))
            y = torch.empty_like(x)
            self.handle.forward(_c(x, "x"), _c(wg, "wg"), _c(wu, "wu"), _c(wd, "wd"), _c(y, "y"), stream.cuda_stream)
            return y, self.generation

    @property
    def stats(self):
        with self.lock:
            return self.handle.last_stats() if self.handle is not None else self.kept_stats


class _CudaTrainer(_GpuRunner):
    """Training FfnForward objects on one GPU: each forward takes an idle one (or a new one) and a workspace of
    its own from PyTorch's allocator, moved there (FfnForward::use_workspace), which the object's state and the
    memory keep for the backward for as long as the forward's autograd graph lives (`live`, emptied by the
    finalizer of the generation tensor the graph saves). So nothing is held between steps, activation
    checkpointing holds one layer's at a time, and several forwards may await their backwards (micro-batches
    of a pipeline schedule, two losses): each has its own object, as a graph has its own saved tensors.

    The finalizers run on any thread at any time: they only move an object from `live` to `idle` (or
    `retired`, when the size has changed), which forward() then reuses (or closes).
    """

    def __init__(self, *args):
        super().__init__(*args)
        self.config, self.lt, self.max_tokens, self.nbytes = None, None, 0, 0
        self.idle = []  # (object, max_tokens): no forward state anyone needs
        self.live = {}  # generation -> (object, workspace, cuBLASLt workspace, max_tokens)
        self.retired = []  # objects of an earlier size, closed by the next forward
        self.last, self.kept_stats = None, None  # the object of the last forward (its statistics)

    def _reserve(self, tokens):
        """With the device's lock and ours held, on the call's device."""
        if self.config is not None and tokens <= self.max_tokens:
            return
        tokens = max(-(-tokens // 4096) * 4096, self.max_tokens)  # multiples of 4096 tokens: fewer rebuilds
        self._retire_idle()
        lt = self.shared.take_lt()
        self.config = self._config(tokens, True, lt)
        self.nbytes = _capi.CudaFfn.workspace_bytes(self.config)
        self.lt, self.max_tokens = lt, tokens

    def _retire_idle(self):
        while self.idle:
            self.retired.append(self.idle.pop()[0])

    def _close_retired(self):
        """With our lock held."""
        while self.retired:
            handle = self.retired.pop()
            if handle is self.last:
                self.kept_stats, self.last = handle.last_stats(), None
            handle.close()

    def adopt(self, generation, key):
        """The forward of `generation` is held by the generation tensor `key` (its graph saves it)."""
        _trainer_of[generation] = self
        weakref.finalize(key, self.forget, generation)

    def forget(self, generation):
        """The forward's graph is gone (a finalizer: any thread, no locks; a dict's pop and a list's append are
        atomic): its workspace goes back to PyTorch, its object becomes idle."""
        _trainer_of.pop(generation, None)
        entry = self.live.pop(generation, None)
        if entry is None:
            return
        handle, _, _, size = entry
        if size == self.max_tokens:
            self.idle.append((handle, size))
        else:
            self.retired.append(handle)

    def _release(self):
        """Closes the idle objects (with our lock held); those of forwards whose graphs live stay until the
        graphs go."""
        self._retire_idle()
        self._close_retired()
        self.config, self.lt, self.max_tokens, self.nbytes = None, None, 0, 0

    def forward(self, x, wg, wu, wd):
        torch = _torch()
        with self.shared.lock, self.lock, torch.cuda.device(self.device):
            _capi.reap()
            self._reserve(x.shape[0])
            self._close_retired()
            memory = self.shared.new(self.nbytes)
            handle = None
            while self.idle and handle is None:
                candidate, size = self.idle.pop()
                if size == self.max_tokens:
                    handle = candidate
                else:  # freed by a finalizer while the size changed
                    self.retired.append(candidate)
            if handle is None:
                handle = _capi.CudaFfn(self.config, memory.data_ptr(), self.nbytes)
                self.shared.used = True
            try:
                handle.use_workspace(memory.data_ptr(), self.nbytes)  # (a new object is there already)
                stream = torch.cuda.current_stream(self.device)
                self.shared.order(stream, (memory, self.lt))
                y = torch.empty_like(x)
                handle.forward(_c(x, "x"), _c(wg, "wg"), _c(wu, "wu"), _c(wd, "wd"), _c(y, "y"), stream.cuda_stream)
            except BaseException:  # refused, out of memory, interrupted: the object has no state anyone needs
                self.idle.append((handle, self.max_tokens))
                raise
            generation = next(_generations)
            self.live[generation] = (handle, memory, self.lt, self.max_tokens)
            self.last = handle
            return y, generation

    def backward(self, x, wg, wu, wd, dy, l1_coeff, needed, generation):
        torch = _torch()
        with self.shared.lock, self.lock, torch.cuda.device(self.device):
            entry = self.live.get(generation)
            if entry is None:
                raise TwellError(self.MOVED)
            handle, memory, lt, _ = entry
            stream = torch.cuda.current_stream(self.device)
            self.shared.order(stream, (memory, lt))
            grads = [torch.empty(t.shape, dtype=torch.float32, device=self.device) if (t is not None and need)
                     else None for t, need in zip((x, wg, wu, wd), needed)]
            try:
                handle.backward(_c(x, "x"), _c(wg, "wg"), _c(wu, "wu"), _c(wd, "wd"), _c(dy, "dy"), l1_coeff,
                                *(_c(g, n) for g, n in zip(grads, ("dx", "dwg", "dwu", "dwd"))), stream.cuda_stream)
            except TwellError as e:
                if "must be those of the last forward" in str(e):
                    raise TwellError(self.MOVED) from e
                raise
            return grads

    MOVED = ("twell.FFN backward: x or a weight is not in the memory its forward read, or the state the forward "
             "left for it is gone: a saved-tensor hook (torch.autograd.graph.save_on_cpu, an offloading wrapper) "
             "moved or copied what the graph saved, or a weight's storage was reallocated (FSDP resharding). The "
             "GPU backward reads state tied to the forward's own tensors; such hooks and resharding between "
             "forward and backward are not supported (activation checkpointing is)")

    @property
    def stats(self):
        with self.lock:
            return self.last.last_stats() if self.last is not None else self.kept_stats


def _check_options(dispatch, precision):
    if dispatch not in _capi.DISPATCH:
        raise TwellError(f"dispatch must be one of {', '.join(_capi.DISPATCH)}, got {dispatch!r}")
    if precision != "auto" and precision not in _capi.PRECISION:
        raise TwellError(f"precision must be one of auto, {', '.join(_capi.PRECISION)}, got {precision!r}")


def _resolved_precision(precision, x):
    """precision="auto" for a call on `x` (its dtype and device): on the CPU "f64" for float32 and float64
    (float64 accumulation, nothing rounded to bf16: a float32 model's accuracy), else "bf16" (the GPU's)."""
    if precision != "auto":
        return precision
    torch = _torch()
    return "f64" if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) else "bf16"


def _cpu_autocast_dtype():
    """The dtype of CPU autocast where it is on (bf16 or f32, which the CPU backend takes), else None."""
    torch = _torch()
    try:
        on, dtype = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
    except (TypeError, AttributeError):  # PyTorch before 2.4
        on, dtype = torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return dtype if on and dtype in (torch.bfloat16, torch.float32) else None


def _autocast_on():
    torch = _torch()
    try:
        return torch.is_autocast_enabled("cuda")
    except TypeError:  # PyTorch before 2.4
        return torch.is_autocast_enabled()


def _mlp_linears(m):
    """A Llama-style MLP's gate_proj, up_proj and down_proj, where all three are Linear layers; else None."""
    torch = _torch()
    linears = [getattr(m, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return linears if all(isinstance(lin, torch.nn.Linear) for lin in linears) else None


def _is_relu_mlp(m):
    linears = _mlp_linears(m)
    return (linears is not None and all(lin.bias is None for lin in linears)
            and isinstance(getattr(m, "act_fn", None), _torch().nn.ReLU))


# twell.FFN's weights and a LlamaMLP's: wd is down_proj.weight transposed (neuron-major)
_HF_NAMES = (("wg", "gate_proj.weight"), ("wu", "up_proj.weight"), ("wd", "down_proj.weight"))


def hf_state_dict(model, state_dict=None):
    """model.state_dict() (or `state_dict`, a dict of the model's that the caller has, e.g. FSDP's full
    one) with every twell.FFN's weights under HF's names and layout (gate_proj.weight, up_proj.weight,
    down_proj.weight [hidden, ffn]): what a model converted by replace_hf_mlps saves as the checkpoint it
    came from, `model.save_pretrained(dir, state_dict=twell.hf_state_dict(model))`, which transformers,
    `twell run` and twell.Model load. (state_dict() itself keeps twell's names, which FSDP, distributed
    checkpoints and in-place updates of its tensors rely on; load_state_dict takes either.)"""
    sd = dict(model.state_dict() if state_dict is None else state_dict)
    for name, module in model.named_modules(remove_duplicate=False):  # an FFN at two paths is at both
        if not isinstance(module, FFN):
            continue
        # the names state_dict() gives: without the wrappers' own levels (FSDP, activation checkpointing)
        parts = [p for p in name.split(".") if p and p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")]
        prefix = ".".join(parts) + "." if parts else ""
        found = False
        for ours, theirs in _HF_NAMES:
            if prefix + ours in sd:
                t = sd.pop(prefix + ours)
                sd[prefix + theirs] = t.t().contiguous() if ours == "wd" else t
                found = True
        if not found and prefix + "up_proj.weight" not in sd:  # neither name: not converted (not twice)
            raise TwellError(f"twell.hf_state_dict: the weights of the FFN at '{name}' are not in the state dict "
                             f"under '{prefix}wu' (a wrapper this function does not know?)")
    return sd


def replace_hf_mlps(model, **kwargs):
    """Replaces every ReLU-gated Llama-style MLP in `model` (a submodule with gate_proj, up_proj and
    down_proj Linear layers without bias and act_fn a ReLU, as transformers' LlamaMLP) by a twell.FFN
    holding its weights (FFN.from_hf_mlp: bf16 on the GPU; save it with
    `save_pretrained(dir, state_dict=twell.hf_state_dict(model))` for a checkpoint transformers and
    twell.Model load); other MLPs (with biases, another activation) are left as they are, with a
    warning where none is replaced. An MLP held at several places becomes one FFN held there. `kwargs` go
    to each FFN (l1, dispatch, max_tokens, ...); `layers` defaults to the number of places replaced (a
    shared MLP counts at each: it runs at each). Returns that number."""
    if _is_relu_mlp(model):
        raise TwellError("twell.replace_hf_mlps replaces the MLPs inside a model, and this is an MLP itself: "
                         "twell.FFN.from_hf_mlp(mlp) makes its FFN")
    # every place a module is held (named_children() names a module held twice once), so that a shared MLP
    # becomes one shared FFN
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent._modules.items()
               if child is not None and _is_relu_mlp(child)]
    half = {id(child) for _, _, child in targets if any(p.dtype == torch.float16 for p in child.parameters())}
    if half:
        raise TwellError(f"twell.replace_hf_mlps: {len(half)} of the MLPs hold float16 weights, for which twell has "
                         "no kernels: convert the model first with model.to(torch.bfloat16); nothing replaced")
    if not targets:
        others = sorted({type(getattr(m, "act_fn", None)).__name__ for m in model.modules()
                         if _mlp_linears(m) is not None})
        warnings.warn("twell.replace_hf_mlps: no ReLU-gated MLP without biases in this model, nothing replaced"
                      + (f" (its MLPs' activations: {', '.join(others)})" if others else ""), stacklevel=2)
    elif hasattr(model, "save_pretrained"):  # a transformers model
        warnings.warn("twell.replace_hf_mlps: save the model with save_pretrained(dir, "
                      "state_dict=twell.hf_state_dict(model)); a plain save_pretrained writes twell's names "
                      "(mlp.wg, mlp.wu, mlp.wd), which transformers loads with its MLPs left random (reporting them "
                      "missing) and twell refuses", stacklevel=2)
    kwargs.setdefault("layers", max(len(targets), 1))  # the places: a shared MLP runs at each
    made = {}  # id(MLP) -> its FFN
    for parent, name, child in targets:
        if id(child) not in made:
            made[id(child)] = FFN.from_hf_mlp(child, **kwargs)
        setattr(parent, name, made[id(child)])
    return len(targets)


class _NoTokens:
    """The statistics of a call with no tokens (nothing ran)."""

    @property
    def stats(self):
        return {"path": "none", "tokens": 0, "nnz": 0, "spilled_tiles": -1, "sampled_density": -1,
                "max_nnz_per_token": 0, "l1_sum": 0.0}


def _check_shapes(x, wg, wu, wd):
    if x.dim() < 1 or wu.dim() != 2 or wd.shape != wu.shape or (wg is not None and wg.shape != wu.shape):
        raise TwellError(f"expected x [..., H] and wg, wu, wd [I, H] (wd neuron-major: down_proj.weight.t()), got "
                         f"x {tuple(x.shape)}, wg {None if wg is None else tuple(wg.shape)}, wu {tuple(wu.shape)}, "
                         f"wd {tuple(wd.shape)}")
    if x.shape[-1] != wu.shape[1]:
        raise TwellError(f"x's last dimension {x.shape[-1]} is not the weights' H = {wu.shape[1]}")
    if wu.shape[0] < 1 or wu.shape[1] < 1:
        raise TwellError(f"the weights must have I >= 1 and H >= 1, got [{wu.shape[0]}, {wu.shape[1]}]")
    devices = {t.device for t in (x, wg, wu, wd) if t is not None}
    if len(devices) != 1:
        raise TwellError(f"x and the weights must be on one device, got {sorted(str(d) for d in devices)}")


class _FfnState:
    """What a twell.FFN holds besides its parameters: its runners (on the GPU a _CudaRunner for inference and a
    _CudaTrainer for training per device and options) and the one that ran last. Its ops (twell::ffn, twell::ffn_backward) find it by its key, a
    0-d int64 CPU tensor holding a random number: what torch.compile and torch.export see of a call is
    tensors and a flag, so layers share compiled code (an integer would be compiled in, one graph a
    layer), and a program exported from another process finds no state rather than another's."""

    def __init__(self, module):
        self.module = weakref.ref(module)  # no cycle: the module's memory goes when the module does
        self.runners, self.last = {}, None
        self.l1, self.layers = 0.0, 1  # the module's l1 and layers (its properties), which the backward reads
        self.lock = threading.Lock()
        with _states_lock:
            number = _random.getrandbits(62)
            while number in _states:
                number = _random.getrandbits(62)
            _states[number] = self
        self.key = torch.tensor(number, dtype=torch.int64, device="cpu")  # whatever the default device

    def runner(self, m, x, training):
        """The runner of a call on x (after autocast's cast: under CPU autocast a float32 module runs as bf16)."""
        device, precision = x.device, _resolved_precision(m.precision, x)
        key = ("cpu", precision) if device.type == "cpu" else (device, training, m.dispatch, precision)
        with self.lock:  # two threads' first calls build one runner
            if key not in self.runners:
                self.runners[key] = _CpuRunner(precision) if device.type == "cpu" else (
                    _CudaTrainer if training else _CudaRunner)(device, m.hidden, m.ffn, m.gated, m.dispatch,
                                                               precision)
            return self.runners[key]

    def runner_of(self, generation):
        """The runner that ran the forward of `generation`, or None where it is gone."""
        trainer = _trainer_of.get(generation)  # a GPU forward whose graph lives, even after release()
        if trainer is not None:
            return trainer
        with self.lock:
            return next((r for r in self.runners.values() if getattr(r, "generation", None) == generation), None)

    def release(self):
        with self.lock:
            for runner in self.runners.values():
                runner.release()
            # CPU runners hold no memory, and a pending backward finds its forward's runner by its generation
            self.runners = {key: r for key, r in self.runners.items() if isinstance(r, _CpuRunner)}
            self.last = None


_states = weakref.WeakValueDictionary()  # number -> _FfnState
_states_lock = threading.Lock()
_random = random.SystemRandom()
_generations = itertools.count(1)
_trainer_of = {}  # generation -> the _CudaTrainer holding its forward's state (its finalizer takes it out)


def _state(key, module_needed=True):
    """The _FfnState of `key`, and its module (None where it is gone and not `module_needed`)."""
    if key.device.type != "cpu" or key.dtype != torch.int64 or key.dim() != 0:
        raise TwellError(f"twell.FFN: a state key is a 0-d int64 CPU tensor, got {key.dtype} {tuple(key.shape)} on "
                         f"{key.device}")
    number = int(key)
    state = _states.get(number)
    module = None if state is None else state.module()
    if state is None or (module is None and module_needed):
        raise TwellError(f"twell.FFN: the module of this call (state {number}) does not exist in this process (a "
                         "program exported elsewhere, or a module since deleted)")
    return state, module


if torch is not None and hasattr(torch.library, "custom_op"):  # PyTorch 2.4 and later
    # not inside a CUDA graph: the GPU path reads counts back to the host (the density, the non-zeros it packs);
    # custom_op takes tags from PyTorch 2.7
    _cudagraph_unsafe = getattr(torch.Tag, "cudagraph_unsafe", None)
    _OP_OPTIONS = {"tags": (_cudagraph_unsafe,)} if _cudagraph_unsafe is not None and \
        "tags" in inspect.signature(torch.library.custom_op).parameters else {}

    @torch.library.custom_op("twell::ffn", mutates_args=(), **_OP_OPTIONS)
    def _ffn_op(x: torch.Tensor, wg: Optional[torch.Tensor], wu: torch.Tensor, wd: torch.Tensor, state: torch.Tensor,
                training: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        """y [M, H] = the FFN of x [M, H] (contiguous) for the twell.FFN whose _FfnState has the key `state`,
        and the call's generation: its backward finds the runner and, on the GPU, the forward's state by it
        (which the tensor keeps: the graph that saves it holds that state)."""
        st, m = _state(state)
        runner = st.runner(m, x, training)
        if x.shape[0] == 0:  # no tokens: nothing to run; the weights' gradients are zeros
            st.last = _NoTokens()
            return x.new_empty((0, wd.shape[1])), torch.tensor(0, dtype=torch.int64, device="cpu")
        if x.is_cuda and m.max_tokens > x.shape[0]:
            runner.reserve(m.max_tokens)
        y, generation = runner.forward(x, wg, wu, wd)
        st.last = runner  # after the call: a refused one leaves no stale stats
        if not isinstance(runner, _CudaTrainer):
            return y, torch.tensor(generation, dtype=torch.int64, device="cpu")
        try:
            key = torch.tensor(generation, dtype=torch.int64, device="cpu")
        except BaseException:
            runner.forget(generation)
            raise
        runner.adopt(generation, key)  # the forward's state lives as long as this tensor (its graph saves it)
        return y, key

    @_ffn_op.register_fake
    def _ffn_shapes(x, wg, wu, wd, state, training):
        return x.new_empty((x.shape[0], wd.shape[1])), torch.empty((), dtype=torch.int64, device="cpu")

    @torch.library.custom_op("twell::ffn_backward", mutates_args=(), **_OP_OPTIONS)
    def _ffn_backward_op(x: torch.Tensor, wg: Optional[torch.Tensor], wu: torch.Tensor, wd: torch.Tensor,
                         dy: torch.Tensor, generation: torch.Tensor, state: torch.Tensor,
                         needed: List[bool]) -> List[torch.Tensor]:
        """dx, dwg, dwu, dwd of twell::ffn (each in its input's dtype; an empty tensor where not `needed`),
        with the L1 penalty of the module's l1 and layers, by the runner that ran the forward."""
        st, _ = _state(state, module_needed=False)  # an eager graph keeps the state, not the module
        inputs = (x, wg, wu, wd)
        needed = [need and t is not None for t, need in zip(inputs, needed)]
        if x.shape[0] == 0:
            grads = [torch.zeros_like(t) if need else None for t, need in zip(inputs, needed)]
        else:
            runner = st.runner_of(int(generation))
            if runner is None:  # its forward's graph held it: the generation tensor it saved was copied
                raise TwellError(_CudaTrainer.MOVED if x.is_cuda else "twell.FFN backward: the state of its forward "
                                 "is gone")
            grads = runner.backward(x, wg, wu, wd, _aligned(dy.to(x.dtype).contiguous()),
                                    l1_coefficient(st.l1, x.shape[0], st.layers), needed, int(generation))
        return [g.to(t.dtype) if need else x.new_empty(0) for g, t, need in zip(grads, inputs, needed)]

    @_ffn_backward_op.register_fake
    def _ffn_backward_shapes(x, wg, wu, wd, dy, generation, state, needed):
        return [torch.empty_like(t) if (need and t is not None) else x.new_empty(0)
                for t, need in zip((x, wg, wu, wd), needed)]

    def _ffn_save(ctx, inputs, output):
        x, wg, wu, wd, state, _ = inputs
        ctx.save_for_backward(x, wg, wu, wd, output[1], state)
        if type(state) is torch.Tensor and not torch.compiler.is_compiling():
            ctx.keep = _states.get(int(state))  # eager: the graph keeps the state (runners, l1) for the backward

    def _ffn_gradients(ctx, dy, _):
        x, wg, wu, wd, generation, state = ctx.saved_tensors
        needed = list(ctx.needs_input_grad[:4])
        grads = torch.ops.twell.ffn_backward(x, wg, wu, wd, dy, generation, state, needed)
        return tuple(g if need else None for g, need in zip(grads, needed)) + (None, None)

    def _no_double_backward(ctx, *grads):
        # with create_graph=True the gradients come out of twell::ffn_backward, tied to x, the weights and dy:
        # a derivative through one, by backward() or grad(inputs=...), reaches this and raises (it would
        # otherwise be silently cut); first-order uses of the graph (other layers' gradients) never do
        raise TwellError("twell.FFN's backward is not differentiable (no double backward): differentiate a "
                         "plain PyTorch FFN there")

    _ffn_op.register_autograd(_ffn_gradients, setup_context=_ffn_save)
    _ffn_backward_op.register_autograd(_no_double_backward)

_functional_runners = {}
_functional_lock = threading.Lock()


def ffn_forward(x, wg, wu, wd, precision="auto", dispatch="observe"):
    """y = (relu(x wgᵀ) ⊙ x wuᵀ) wd (wg None: relu(x wuᵀ) wd), for inference: no autograd (twell.FFN trains).

    x [..., H]; wg, wu [I, H]; wd [I, H] neuron-major (HF's down_proj.weight.t().contiguous()). On the GPU
    (bf16) one FfnForward per device, shape and options serves every call, dispatched on each call's
    density ("observe": one stream synchronisation a call; with "previous" every call of a shape would
    be dispatched on the density of the call before it, whatever layer that was); clear_cache() frees
    their memory. precision (FFN's): "auto" rounds where a bf16 model does for bf16 tensors and computes
    float32 and float64 ones in float64 on the CPU ("f64", the oracle); "bf16" rounds whatever the dtype.
    """
    torch = _torch()
    _check_options(dispatch, precision)
    _check_shapes(x, wg, wu, wd)
    precision = _resolved_precision(precision, x)
    dtypes = {name: t.dtype for name, t in (("x", x), ("wg", wg), ("wu", wu), ("wd", wd)) if t is not None}
    if len(set(dtypes.values())) > 1:
        raise TwellError("twell.ffn_forward: x and the weights must have one dtype, got "
                         + ", ".join(f"{name} {str(d).replace('torch.', '')}" for name, d in dtypes.items()))
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, wg, wu, wd)):
        raise TwellError("twell.ffn_forward has no backward: call it under torch.no_grad(), or train a twell.FFN")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    weights = (None if t is None else t.contiguous() for t in (wg, wu, wd))
    if hasattr(torch.library, "custom_op"):  # one node of a compiled graph (PyTorch 2.4 and later)
        y = torch.ops.twell.ffn_forward(x2, *weights, precision, dispatch)
    else:
        y = _functional_ffn(x2, *weights, precision, dispatch)
    return y.reshape(shape[:-1] + (wd.shape[1],))


def _functional_ffn(x, wg, wu, wd, precision, dispatch):
    """ffn_forward of x [M, H] and weights, all contiguous, checked: the body of twell::ffn_forward."""
    torch = _torch()
    _check_options(dispatch, precision)  # the op may be called directly
    precision = _resolved_precision(precision, x)
    if x.shape[0] == 0:
        return x.new_empty((0, wd.shape[1]))
    x, wg, wu, wd = (_aligned(t) for t in (x, wg, wu, wd))
    if x.is_cuda:
        key = (x.device, wu.shape[1], wu.shape[0], wg is not None, precision, dispatch)
        with _functional_lock:
            runner = _functional_runners.get(key)
            if runner is None:
                runner = _functional_runners[key] = _CudaRunner(x.device, wu.shape[1], wu.shape[0], wg is not None,
                                                                dispatch, precision)
    else:
        runner = _CpuRunner(precision)
    with torch.no_grad():
        y, _ = runner.forward(x, wg, wu, wd)
    return y


if torch is not None and hasattr(torch.library, "custom_op"):
    @torch.library.custom_op("twell::ffn_forward", mutates_args=(), **_OP_OPTIONS)
    def _ffn_forward_op(x: torch.Tensor, wg: Optional[torch.Tensor], wu: torch.Tensor, wd: torch.Tensor,
                        precision: str, dispatch: str) -> torch.Tensor:
        """twell.ffn_forward of x [M, H] (no autograd)."""
        return _functional_ffn(x, wg, wu, wd, precision, dispatch)

    @_ffn_forward_op.register_fake
    def _ffn_forward_shapes(x, wg, wu, wd, precision, dispatch):
        return x.new_empty((x.shape[0], wd.shape[1]))

    if hasattr(torch.library, "register_vmap"):
        @torch.library.register_vmap("twell::ffn_forward")
        def _ffn_forward_vmap(info, in_dims, x, wg, wu, wd, precision, dispatch):
            """torch.vmap: a batch of x alone is more tokens of one call; batched weights, a call a slice."""
            x_dim, weight_dims = in_dims[0], in_dims[1:4]
            if all(d is None for d in weight_dims):
                x = x.movedim(x_dim, 0)
                y = torch.ops.twell.ffn_forward(x.reshape(-1, x.shape[-1]).contiguous(), wg, wu, wd, precision,
                                                dispatch)
                return y.reshape(x.shape[0], x.shape[1], -1), 0
            ys = []
            for i in range(info.batch_size):
                pick = [None if t is None else (t if d is None else t.select(d, i))
                        for t, d in zip((x, wg, wu, wd), in_dims[:4])]
                ys.append(torch.ops.twell.ffn_forward(*(None if t is None else t.contiguous() for t in pick),
                                                      precision, dispatch))
            return torch.stack(ys), 0


def clear_cache():
    """Frees the GPU memory that ffn_forward's cached FfnForward objects hold, the backward's scratch that
    twell keeps (as release_workspace() does), and what the objects of deleted modules held: those are
    destroyed at twell's next GPU call, or here (not by the garbage collector, which may run on any thread
    at any time)."""
    with _functional_lock:
        for runner in _functional_runners.values():
            runner.release()
        _functional_runners.clear()
    _release_scratch()


def _release_scratch():
    """Gives the backward's scratch, which a pool of each GPU twell ran on keeps for the next backward
    (any module's), and the memory of collected FfnForward objects back to the driver (synchronising those
    GPUs)."""
    with _devices_lock:
        devices = [(device, shared) for device, shared in _devices.items() if shared.used]
    for device, shared in devices:
        with shared.lock, _torch().cuda.device(device):
            _capi.reap()  # the collected objects' memory too
            _capi.check(_capi.lib.twell_cuda_release_scratch())


if torch is not None:  # defined at the module's level, so that modules pickle (torch.save) and copy

    class FFN(torch.nn.Module):
        """A ReLU-gated (or plain ReLU) FFN whose forward and backward run twell's kernels.

        Parameters: wg and wu [ffn, hidden] (HF's gate_proj.weight and up_proj.weight), wd [ffn, hidden]
        neuron-major (HF's down_proj.weight transposed); bf16 on the GPU, bf16, float32 or float64 on the
        CPU. load_state_dict takes these names or HF's (gate_proj.weight, up_proj.weight, down_proj.weight
        [hidden, ffn]); twell.hf_state_dict(model) gives a model's state_dict in HF's.

        precision: where values are rounded. "bf16": g = relu(x Wgᵀ), u = x Wuᵀ and h = g ⊙ u each
        rounded to bf16, as a bf16 PyTorch model does (fp32 accumulation); "h_fp32": g and u rounded,
        h kept in fp32; "f64" (CPU only): nothing rounded, float64 accumulation, the oracle, which gives a
        float32 model float32's accuracy. "auto" (the default), decided at each call: "f64" where x is float32
        or float64 on the CPU, else "bf16" (on the GPU, for bf16 tensors, and under CPU autocast, which
        makes x bf16).

        `l1` is λ of the L1 penalty on h, λ · mean over layers of (1/M) Σ|h|: its gradient
        λ/(M·layers)·sign(h) is added in backward (with the module's l1 and layers at that time), over
        the active set; its value is not computed. It is added once per backward, not scaled with the
        loss: with a loss divided over accumulation steps or scaled by a GradScaler, scale λ alike.

        On the GPU each module runs FfnForward objects, dispatched on the density of their previous call:
        one for inference, and in training one for each forward awaiting its backward (reused once the
        forward's graph is gone). Their workspaces come from PyTorch's allocator, sized by `max_tokens` up
        front or else by the largest call so far (in multiples of 4096 tokens): in training ~3.4 · tokens ·
        I · 2 bytes a forward, which its backward reads and which lives as long as its autograd graph (as
        saved activations do: no workspace held between steps, one layer's at a time under activation
        checkpointing, one a micro-batch where several forwards await their backwards; an idle object keeps
        its sparse backward's transpose, ~24 bytes a non-zero, outside PyTorch's allocator), for inference as
        much, shared by all the device's FFNs (and ffn_forward's), sized for the largest, with one 64 MiB
        cuBLASLt workspace for all; the backward's scratch comes from a pool all share, its transpose of
        the active set is each object's own. release_workspace() lets them go (shared memory goes with
        the last module using it; a forward's goes with its graph). There is no double backward:
        differentiating through the FFN's gradients (create_graph=True) raises. The module runs as the
        custom operators twell::ffn and twell::ffn_backward, which torch.compile (fullgraph) and
        torch.export take whole.
        """

        def __init__(self, hidden, ffn, gated=True, *, l1=0.0, layers=1, max_tokens=0, dispatch="previous",
                     precision="auto", device=None, dtype=None):
            super().__init__()
            if not hasattr(torch.library, "custom_op"):
                raise TwellError(f"twell.FFN needs PyTorch 2.4 or later, this is {torch.__version__}")
            _check_options(dispatch, precision)
            hidden, ffn, max_tokens = (
                _capi._int(value, f"twell.FFN: {name}", least, expected=f"an integer of at least {least}")
                for name, value, least in (("hidden", hidden, 1), ("ffn", ffn, 1), ("max_tokens", max_tokens, 0)))
            if not isinstance(gated, bool):
                raise TwellError(f"twell.FFN: gated must be True or False, got {gated!r}")
            dtype = dtype or torch.bfloat16
            if dtype not in (torch.bfloat16, torch.float32, torch.float64):
                raise TwellError(f"twell.FFN: dtype must be torch.bfloat16, float32 or float64, got {dtype}")
            self._state = _FfnState(self)
            self.l1, self.layers = l1, layers  # checked by their setters, kept in the state
            self.hidden, self.ffn, self.gated, self.max_tokens = hidden, ffn, gated, max_tokens
            self.dispatch, self.precision = dispatch, precision
            make = lambda: torch.nn.Parameter(torch.empty(ffn, hidden, device=device, dtype=dtype))  # noqa: E731
            self.register_parameter("wg", make() if gated else None)
            self.wu, self.wd = make(), make()
            self.reset_parameters()

        @property
        def l1(self):
            """λ of the L1 penalty; the backward reads it when it runs."""
            return self._state.l1

        @l1.setter
        def l1(self, value):
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                number = math.nan
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(number) or number < 0:
                raise TwellError(f"twell.FFN: l1 must be a finite number of at least 0, got {value!r}")
            self._state.l1 = value

        @property
        def layers(self):
            """The number of FFN layers the penalty's mean is over."""
            return self._state.layers

        @layers.setter
        def layers(self, value):
            self._state.layers = _capi._int(value, "twell.FFN: layers", 1, expected="an integer of at least 1")

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                  error_msgs):
            # HF's names and layout (a LlamaMLP's, or twell.hf_state_dict's) load too; contiguous, as assign=True
            # puts the tensor itself in place
            hf_layout = False
            for ours, theirs in _HF_NAMES:
                if prefix + theirs in state_dict and prefix + ours not in state_dict:
                    t = state_dict.pop(prefix + theirs)
                    state_dict[prefix + ours] = t.t().contiguous() if ours == "wd" else t
                    hf_layout = True
            start, first_error = len(missing_keys), len(error_msgs)
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)
            if hf_layout:  # a partial or mis-sized HF dict: said in its names
                hf = {prefix + ours: prefix + theirs for ours, theirs in _HF_NAMES}
                missing_keys[start:] = [hf.get(k, k) for k in missing_keys[start:]]
                for i in range(first_error, len(error_msgs)):
                    for ours, theirs in _HF_NAMES:
                        layout = ", transposed" if ours == "wd" else ""
                        msg = error_msgs[i]
                        if ours == "wd" and f"for {prefix}{ours}:" in msg:  # the shapes in down_proj's layout too
                            msg = re.sub(r"\[(\d+), (\d+)\]", r"[\2, \1]", msg)
                        error_msgs[i] = msg.replace(f"for {prefix}{ours}:",
                                                    f"for {prefix}{theirs} (as twell's {ours}{layout}):")

        def __getstate__(self):  # copies and pickles carry the parameters and l1, not the GPU objects
            state = self.__dict__.copy()
            st = state.pop("_state")
            state["l1"], state["layers"] = st.l1, st.layers
            return state

        def __setstate__(self, state):
            l1, layers = state.pop("l1", 0.0), state.pop("layers", 1)
            for old in ("_runners", "_last"):  # in pickles of twell before its ops
                state.pop(old, None)
            super().__setstate__(state)
            self._state = _FfnState(self)
            self.l1, self.layers = l1, layers

        def release_workspace(self):
            """Frees the GPU memory the module's FfnForward objects hold (rebuilt at the next call), and the
            backward's scratch twell keeps for all modules (a pool of the GPU holding the largest
            backward's need, taken again at the next one)."""
            self._state.release()
            _release_scratch()

        def reset_parameters(self):
            bound_in, bound_out = self.hidden ** -0.5, self.ffn ** -0.5  # as nn.Linear's default
            with torch.no_grad():
                for p, bound in ((self.wg, bound_in), (self.wu, bound_in), (self.wd, bound_out)):
                    if p is not None:
                        p.uniform_(-bound, bound)

        @classmethod
        def from_hf_mlp(cls, mlp, **kwargs):
            """The FFN of a HF Llama-style MLP (gate_proj, up_proj, down_proj without bias, ReLU), copied: bf16
            on the GPU, the MLP's dtype on the CPU (float32 or float64; bf16 for a bf16 or float16 MLP), unless
            dtype= says otherwise; frozen weights stay frozen, and the module's train/eval mode is the MLP's.
            Its precision is "auto" unless precision= says otherwise: a bf16 module rounds where a bf16 model
            rounds, a float32 or float64 one (on the CPU) gives the MLP's results within float32 rounding."""
            act = getattr(mlp, "act_fn", None)
            if not isinstance(act, torch.nn.ReLU):
                raise TwellError(f"twell's FFN is ReLU-gated; this MLP's activation is {type(act).__name__}")
            for name in ("gate_proj", "up_proj", "down_proj"):
                if getattr(mlp, name).bias is not None:
                    raise TwellError(f"twell's FFN has no biases; this MLP's {name} has one")
            wg = mlp.gate_proj.weight
            kwargs.setdefault("device", wg.device)
            target = torch.empty(0, device=kwargs["device"]).device.type if kwargs["device"] is None else \
                torch.device(kwargs["device"]).type
            # kept on the CPU (and on meta where no GPU will take it), bf16 for the GPU
            keep = (target == "cpu" or (target == "meta" and not cuda_available())) and \
                wg.dtype in (torch.float32, torch.float64)
            kwargs.setdefault("dtype", wg.dtype if keep else torch.bfloat16)  # the GPU path takes bf16
            m = cls(wg.shape[1], wg.shape[0], True, **kwargs)
            with torch.no_grad():
                for ours, theirs in ((m.wg, wg), (m.wu, mlp.up_proj.weight), (m.wd, mlp.down_proj.weight.t())):
                    ours.copy_(theirs)
                    ours.requires_grad_(theirs.requires_grad)
            m.train(mlp.training)
            return m

        def forward(self, x):
            _check_shapes(x, self.wg, self.wu, self.wd)
            if x.device.type not in ("cpu", "cuda", "meta"):  # meta: shapes only (init_empty_weights)
                raise TwellError(f"twell.FFN runs on the CPU or a CUDA GPU, not on {x.device.type}")
            if x.is_cuda and x.dtype != self.wu.dtype and _autocast_on():
                x = x.to(self.wu.dtype)  # under autocast, as a Linear would take it
            elif not x.is_cuda and x.dtype == torch.float32 and _cpu_autocast_dtype() not in (None, x.dtype):
                x = x.to(_cpu_autocast_dtype())  # CPU autocast casts float32, as a Linear's input
            if x.is_cuda and self.wu.dtype != torch.bfloat16:
                raise TwellError(f"twell.FFN on the GPU takes bf16 parameters, this one's are {self.wu.dtype} "
                                 "(.to(torch.bfloat16); keep fp32 master weights in the optimizer if needed)")
            # Under torch.func.grad PyTorch's own refusal names an autograd.Function's setup_context; said
            # here instead (not while dynamo traces: it cannot trace the check).
            tracked = getattr(torch._C._functorch, "is_gradtrackingtensor", lambda t: False)
            if not torch.compiler.is_compiling() and any(t is not None and tracked(t)
                                                         for t in (x, self.wg, self.wu, self.wd)):
                raise TwellError("twell.FFN does not run under torch.func's gradient transforms (grad, vjp, jacrev): "
                                 "differentiate with torch.autograd (backward(), torch.autograd.grad); torch.vmap works")
            autocast = _autocast_on() if x.is_cuda else _cpu_autocast_dtype() is not None
            meta = x.device.type == "meta"  # shapes only (a converted model's FFNs are bf16 where a GPU will run it)
            if x.dtype != self.wu.dtype and not autocast and not meta:  # as a Linear, one dtype outside autocast
                half = torch.float16 in (x.dtype, self.wu.dtype)
                raise TwellError(f"twell.FFN: x is {x.dtype}, the parameters {self.wu.dtype}: convert one to the "
                                 "other" + (" (twell has no float16 kernels: model.to(torch.bfloat16))" if half else ""))
            shape = x.shape
            x2 = x.reshape(-1, self.hidden).contiguous()
            if not torch.compiler.is_compiling():  # a compiled graph's fake tensors have no address
                x2 = _aligned(x2)
            grad = torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (x2, self.wg, self.wu, self.wd))
            precision = _resolved_precision(self.precision, x)
            if grad and x.is_cuda and (not self.gated or precision != "bf16"):
                raise TwellError("twell.FFN: the GPU backward takes the gated FFN in bf16 precision only; this one is "
                                 f"gated={self.gated}, precision={precision} (train it on the CPU, or run it "
                                 "under torch.no_grad())")
            y, _ = torch.ops.twell.ffn(x2, self.wg, self.wu, self.wd, self._state.key, grad)
            return y.reshape(shape[:-1] + (self.hidden,))

        def last_stats(self):
            """The last call's statistics (waits for the GPU's non-zero count): path ("sparse", "gather", "dense"
            or "cpu"), tokens, nnz, spilled_tiles, sampled_density, max_nnz_per_token, l1_sum; -1 where the
            path did not count it (the GPU's dense path counts no non-zeros, only the GPU counts spills, only
            the CPU the per-token maximum and Σ|h|)."""
            last = self._state.last
            return None if last is None else last.stats

        def extra_repr(self):
            return (f"hidden={self.hidden}, ffn={self.ffn}, gated={self.gated}, l1={self.l1}, "
                    f"dispatch={self.dispatch}, precision={self.precision}")

else:  # without PyTorch: twell._capi still works; twell.FFN says what is missing

    class FFN:
        def __init__(self, *args, **kwargs):
            _torch()

        @classmethod
        def from_hf_mlp(cls, *args, **kwargs):
            _torch()
