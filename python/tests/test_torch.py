"""twell.FFN and twell.ffn_forward on PyTorch tensors: against float64 PyTorch, forward and backward, on
the CPU backend and (where a Hopper GPU is present) on the GPU; skipped without PyTorch."""
import copy
import json
import os
import pickle
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import twell  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

GPU, WHY = twell.cuda_available(), twell.cuda_unavailable_reason()


def sparse_problem(M, H, I, device, seed=0):
    """bf16 x [M, H] and weights whose gate is ~0.6% active: x's channel 0 is 1 and each neuron's gate
    weight there is -2.5 (the calibration of BENCHMARKS.md's synthetic models)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g)
    x[:, 0] = 1
    wg = torch.randn(I, H, generator=g) / (H - 1) ** 0.5
    wg[:, 0] = -2.5
    wu = torch.randn(I, H, generator=g) / H ** 0.5
    wd = torch.randn(I, H, generator=g) / I ** 0.5
    return [t.to(device=device, dtype=torch.bfloat16) for t in (x, wg, wu, wd)]


def reference(x, wg, wu, wd, dtype):
    """The FFN in PyTorch at `dtype` (bf16: a dense bf16 model's roundings; f64: the oracle)."""
    x, wg, wu, wd = (t.to(dtype) for t in (x, wg, wu, wd))
    h = torch.relu(x @ wg.t()) * (x @ wu.t())
    return h @ wd, h


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


if torch is not None:
    class Mlp(torch.nn.Module):  # transformers' LlamaMLP, with a ReLU
        def __init__(self, H, I, bias=False):
            super().__init__()
            self.gate_proj = torch.nn.Linear(H, I, bias=bias)
            self.up_proj = torch.nn.Linear(H, I, bias=bias)
            self.down_proj = torch.nn.Linear(I, H, bias=bias)
            self.act_fn = torch.nn.ReLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class Block(torch.nn.Module):  # a Linear and a twell FFN with a residual, H = 64, I = 192
        def __init__(self, device, dtype, **kwargs):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64, device=device, dtype=dtype)
            self.ffn = twell.FFN(64, 192, l1=1e-3, device=device, dtype=dtype, **kwargs)

        def forward(self, x):
            return self.ffn(self.lin(x)) + x


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TorchFfn(unittest.TestCase):
    def check_forward_and_backward(self, device, M, dispatch, expect_path):
        H, I = 256, 1024
        x, wg, wu, wd = sparse_problem(M, H, I, device)
        ffn = twell.FFN(H, I, l1=1e-3, dispatch=dispatch, device=device)
        with torch.no_grad():
            ffn.wg.copy_(wg), ffn.wu.copy_(wu), ffn.wd.copy_(wd)
        xg = x.clone().requires_grad_()
        y = ffn(xg.view(2, M // 2, H))  # any leading shape
        self.assertEqual(tuple(y.shape), (2, M // 2, H))
        self.assertEqual(y.dtype, torch.bfloat16)
        stats = ffn.last_stats()
        self.assertEqual(stats["path"], expect_path)
        self.assertEqual(set(stats), {"path", "tokens", "nnz", "spilled_tiles", "sampled_density",
                                      "max_nnz_per_token", "l1_sum"})  # the same keys on every backend
        self.assertEqual(stats["tokens"], M)
        dy = torch.randn(2, M // 2, H, generator=torch.Generator().manual_seed(5)).to(device, torch.bfloat16)
        (y * dy).sum().backward()

        # float64 oracle, with the penalty λ · (1/M) Σ|h| (one layer) in its loss
        leaves = [t.double().requires_grad_() for t in (x, wg, wu, wd)]
        y64, h64 = reference(*leaves, torch.float64)
        ((y64 * dy.double().view(M, H)).sum() + 1e-3 / M * h64.abs().sum()).backward()
        # a dense bf16 PyTorch model's error, the yardstick (the issue: twell within 2× of it)
        leaves16 = [t.clone().requires_grad_() for t in (x, wg, wu, wd)]
        y16, h16 = reference(*leaves16, torch.bfloat16)
        ((y16 * dy.view(M, H)).sum() + 1e-3 / M * h16.float().abs().sum()).backward()

        ours = [y.view(M, H), xg.grad, ffn.wg.grad, ffn.wu.grad, ffn.wd.grad]
        oracle = [y64, *(t.grad for t in leaves)]
        bf16 = [y16, *(t.grad for t in leaves16)]
        for name, a, o, b in zip(["y", "dx", "dwg", "dwu", "dwd"], ours, oracle, bf16):
            self.assertEqual(a.shape, o.shape, name)
            err, yardstick = rel(a, o), rel(b, o)
            self.assertLessEqual(err, 2 * yardstick + 1e-6, f"{name}: twell {err:.2e}, dense bf16 {yardstick:.2e}")

    def test_cpu_backend(self):
        self.check_forward_and_backward("cpu", 64, "previous", "cpu")

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_gpu_sparse_path(self):
        self.check_forward_and_backward("cuda", 1000, "always_sparse", "sparse")

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_gpu_dispatched_path(self):
        self.check_forward_and_backward("cuda", 1000, "previous", "dense")  # few tokens: dense pays

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_gpu_takes_views_not_16_byte_aligned(self):
        """A contiguous view at an odd offset (buf[3:]) is not 16-byte aligned, as the GPU kernels read: twell
        copies it (x, the weights, dy) and gives the bits of aligned tensors (it refused them before)."""
        M, H, I = 300, 256, 1024
        x, wg, wu, wd = sparse_problem(M, H, I, "cuda")
        dy = torch.randn(M, H, generator=torch.Generator().manual_seed(6)).to("cuda", torch.bfloat16)

        def odd(t):  # the same values, 6 bytes past a 16-byte boundary: (buffer, view)
            buf = torch.cat([t.new_zeros(3), t.flatten()])
            return buf, buf[3:].view(t.shape)

        self.assertNotEqual(odd(x)[1].data_ptr() % 16, 0)
        with torch.no_grad():
            want = twell.ffn_forward(x, wg, wu, wd)
            self.assertTrue(torch.equal(twell.ffn_forward(*(odd(t)[1] for t in (x, wg, wu, wd))), want))
        ffn = twell.FFN(H, I, l1=1e-3, dispatch="always_sparse", device="cuda")
        with torch.no_grad():
            ffn.wg.copy_(wg), ffn.wu.copy_(wu), ffn.wd.copy_(wd)
        runs = []
        for shifted in (False, True):
            ffn.zero_grad(set_to_none=True)
            buf = (odd(x)[0] if shifted else x.clone()).requires_grad_()
            xv = buf[3:].view(M, H) if shifted else buf
            y = ffn(xv)
            y.backward(odd(dy)[1] if shifted else dy)
            runs.append([y, (buf.grad[3:].view(M, H) if shifted else buf.grad), ffn.wg.grad, ffn.wu.grad, ffn.wd.grad])
        for name, a, b in zip(["y", "dx", "dwg", "dwu", "dwd"], *runs):
            self.assertTrue(torch.equal(a, b), name)
        with torch.no_grad():  # torch.vmap's batched tensors have no address: passed on as they are
            batched = torch.vmap(ffn)(x.view(2, M // 2, H))
            self.assertEqual(tuple(batched.shape), (2, M // 2, H))
            self.assertLess(rel(batched.reshape(M, H).double(), ffn(x).double()), 1e-2)

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_gpu_large_call_dispatches_sparse_and_uses_torchs_memory(self):
        M, H, I = 16384, 512, 1536
        x, wg, wu, wd = sparse_problem(M, H, I, "cuda", seed=3)
        twell.clear_cache()  # the inference workspace is shared: none held by earlier calls
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        ffn = twell.FFN(H, I, dispatch="observe", device="cuda")
        with torch.no_grad():
            ffn.wg.copy_(wg), ffn.wu.copy_(wu), ffn.wd.copy_(wd)
            y = ffn(x)
        stats = ffn.last_stats()
        self.assertEqual(stats["path"], "sparse")
        self.assertGreater(stats["nnz"], 0)
        self.assertLess(stats["nnz"] / M, 0.02 * I)
        # the workspace (~3.4 · M · I · 2 bytes) came from PyTorch's allocator
        self.assertGreater(torch.cuda.memory_allocated() - before, 3 * M * I * 2)
        y64, _ = reference(x, wg, wu, wd, torch.float64)
        y16, _ = reference(x, wg, wu, wd, torch.bfloat16)
        self.assertLessEqual(rel(y, y64), 2 * rel(y16, y64) + 1e-6)
        # functional form, same bits as the module with the same options
        y2 = twell.ffn_forward(x, wg, wu, wd)
        self.assertTrue(torch.equal(y2, y))

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_from_hf_mlp(self):
        mlp = Mlp(128, 384).to("cuda", torch.bfloat16)
        ffn = twell.FFN.from_hf_mlp(mlp, dispatch="always_sparse")
        self.assertTrue(torch.equal(ffn.wd, mlp.down_proj.weight.t()))
        x = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            y, want = ffn(x), mlp(x)
            y64, _ = reference(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight.t(), torch.float64)
        self.assertLessEqual(rel(y, y64), 2 * rel(want, y64) + 1e-6)
        mlp.act_fn = torch.nn.SiLU()
        with self.assertRaisesRegex(twell.TwellError, "ReLU-gated; this MLP's activation is SiLU"):
            twell.FFN.from_hf_mlp(mlp)

        # a whole model's ReLU MLPs swapped in place; the SiLU one stays
        class Layer(torch.nn.Module):
            def __init__(self, act):
                super().__init__()
                self.mlp = Mlp(128, 384)
                self.mlp.act_fn = act

            def forward(self, x):
                return x + self.mlp(x)

        model = torch.nn.Sequential(Layer(torch.nn.ReLU()), Layer(torch.nn.ReLU()), Layer(torch.nn.SiLU()))
        model = model.to("cuda", torch.bfloat16)
        with torch.no_grad():
            want = model(x)
            self.assertEqual(twell.replace_hf_mlps(model, dispatch="always_sparse"), 2)
            self.assertIsInstance(model[0].mlp, twell.FFN)
            self.assertEqual(model[0].mlp.layers, 2)
            self.assertNotIsInstance(model[2].mlp, twell.FFN)
            got = model(x)
        self.assertLess(rel(got, want), 2e-2)

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_bad_input_says_why(self):
        x, wg, wu, wd = sparse_problem(64, 128, 256, "cuda")
        with self.assertRaisesRegex(twell.TwellError, "bf16"):
            twell.ffn_forward(x.float(), wg.float(), wu.float(), wd.float())
        with self.assertRaisesRegex(twell.TwellError, "last dimension 64 is not the weights' H = 128"):
            twell.ffn_forward(x[:, :64], wg, wu, wd)
        with self.assertRaisesRegex(twell.TwellError, "one device"):
            twell.ffn_forward(x, wg.cpu(), wu, wd)
        with self.assertRaisesRegex(twell.TwellError, "neuron-major"):
            twell.ffn_forward(x, wg, wu, wd.t())
        self.assertEqual(tuple(twell.ffn_forward(x[:0], wg, wu, wd).shape), (0, 128))


    def test_one_dtype_and_float16_said_on_the_cpu(self):
        x, wg, wu, wd = sparse_problem(8, 16, 32, "cpu")
        with self.assertRaisesRegex(twell.TwellError, "one dtype, got x bfloat16, wg float32, wu float32"):
            twell.ffn_forward(x, wg.float(), wu.float(), wd.float())
        with self.assertRaisesRegex(twell.TwellError, "I >= 1 and H >= 1"):
            twell.ffn_forward(x[:, :0], wg[:, :0], wu[:, :0], wd[:, :0])
        f32 = twell.FFN(16, 32, dtype=torch.float32)
        with self.assertRaisesRegex(twell.TwellError, "x is torch.float64, the parameters torch.float32"):
            f32(torch.randn(3, 16, dtype=torch.float64))
        with self.assertRaisesRegex(twell.TwellError, "no float16 kernels"):
            f32.half()(torch.randn(3, 16).half())
        model = torch.nn.Sequential(Mlp(16, 32)).half()
        with self.assertRaisesRegex(twell.TwellError, "1 of the MLPs hold float16 weights.*model.to\\(torch.bfloat16\\)"):
            twell.replace_hf_mlps(model)
        self.assertIsInstance(model[0], Mlp)  # nothing replaced
        f64 = twell.FFN(16, 32, dtype=torch.float64, precision="f64")
        with self.assertRaisesRegex(twell.TwellError, "torch.func's gradient transforms"):
            torch.func.grad(lambda x: f64(x).sum())(torch.randn(3, 16, dtype=torch.float64))
        self.assertEqual(torch.vmap(f64)(torch.randn(2, 3, 16, dtype=torch.float64)).shape, (2, 3, 16))
        meta = torch.nn.Sequential(Mlp(16, 32)).to("meta")  # shapes only: a bf16 FFN in an fp32 model is fine
        twell.replace_hf_mlps(meta, dtype=torch.bfloat16)
        self.assertEqual(meta(torch.empty(3, 16, device="meta")).shape, (3, 16))


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TorchFfnUse(unittest.TestCase):
    """How a PyTorch user calls it: streams, threads, copies, autograd's corners."""

    def module(self, H=256, I=1024, device="cuda", **kwargs):
        x, wg, wu, wd = sparse_problem(1000, H, I, device)
        ffn = twell.FFN(H, I, device=device, **kwargs)
        with torch.no_grad():
            for p, w in ((ffn.wg, wg), (ffn.wu, wu), (ffn.wd, wd)):
                if p is not None:
                    p.copy_(w)
        return ffn, x

    def test_cuda_available_is_a_bool(self):
        self.assertIsInstance(twell.cuda_available(), bool)
        self.assertEqual(twell.cuda_available(), twell.cuda_unavailable_reason() == "")
        self.assertEqual(twell.__version__, twell.version())

    def test_cpu_precision_follows_the_dtype(self):
        # "auto": a float32 module (a float32 model's MLPs replaced) keeps float32's accuracy; bf16 rounds
        H, I, M = 32, 96, 20
        mlp = Mlp(H, I)
        x = torch.randn(M, H)
        y64, _ = reference(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight.t(), torch.float64)
        with torch.no_grad():
            ffn = twell.FFN.from_hf_mlp(mlp)
            self.assertEqual(ffn.wu.dtype, torch.float32)
            self.assertLess(rel(ffn(x), y64), 1e-6)
            self.assertLess(rel(twell.ffn_forward(x, ffn.wg, ffn.wu, ffn.wd), y64), 1e-6)
            rounded = rel(twell.FFN.from_hf_mlp(mlp, precision="bf16")(x), y64)
            self.assertGreater(rounded, 1e-4)
            self.assertGreater(rel(twell.ffn_forward(x, ffn.wg, ffn.wu, ffn.wd, precision="bf16"), y64), 1e-4)
            with torch.autocast("cpu", dtype=torch.bfloat16):  # x made bf16: rounded as the autocast Linears
                self.assertEqual(rel(ffn(x), y64), rel(twell.FFN.from_hf_mlp(mlp, precision="bf16")(x.bfloat16()), y64))
            self.assertLess(rel(ffn.to(torch.bfloat16)(x.bfloat16()), y64), 2e-2)  # bf16 parameters: bf16
        self.assertIn("precision=auto", repr(ffn))
        # a CPU forward's backward after release_workspace() (CPU runners hold nothing)
        f = twell.FFN(H, I, dtype=torch.float64)
        xg = torch.randn(3, H, dtype=torch.float64, requires_grad=True)
        y = f(xg)
        f.release_workspace()
        y.sum().backward()
        self.assertEqual(xg.grad.shape, (3, H))

    def test_cpu_float64_oracle_and_non_gated_backward(self):
        H, I, M = 32, 96, 20
        g = torch.Generator().manual_seed(7)
        x, wg, wu, wd = (torch.randn(*s, generator=g, dtype=torch.float64) / d
                         for s, d in (((M, H), 1), ((I, H), H ** 0.5), ((I, H), H ** 0.5), ((I, H), I ** 0.5)))
        y = twell.ffn_forward(x, wg, wu, wd, precision="f64")
        y64, _ = reference(x, wg, wu, wd, torch.float64)
        self.assertLess(rel(y, y64), 1e-13)
        # non-gated: h = relu(x wuᵀ), y = h wd; the backward against PyTorch's autograd in float64
        ffn = twell.FFN(H, I, gated=False, precision="f64", device="cpu", dtype=torch.float64)
        with torch.no_grad():
            ffn.wu.copy_(wu), ffn.wd.copy_(wd)
        xg = x.clone().requires_grad_()
        ffn(xg).sum().backward()
        leaves = [t.clone().requires_grad_() for t in (x, wu, wd)]
        (torch.relu(leaves[0] @ leaves[1].t()) @ leaves[2]).sum().backward()
        for a, b in zip((xg.grad, ffn.wu.grad, ffn.wd.grad), (t.grad for t in leaves)):
            self.assertLess(rel(a, b), 1e-12)
        with self.assertRaisesRegex(twell.TwellError, "precision must be one of"):
            twell.FFN(H, I, precision="fp64")
        state = pickle.loads(pickle.dumps(ffn))  # a module pickles with its parameters
        self.assertTrue(torch.equal(state.wd, ffn.wd))

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_checkpointing_autocast_and_max_tokens(self):
        import torch.utils.checkpoint as cp
        ffn, x = self.module(dispatch="always_sparse", max_tokens=8192)
        self.assertEqual(ffn(x[:10]).shape, (10, 256))  # sized for 8192 tokens at the first call
        grads = []
        for checkpointed in (False, True):
            for p in ffn.parameters():
                p.grad = None
            xg = x.clone().requires_grad_()
            y = cp.checkpoint(ffn, xg, use_reentrant=False) if checkpointed else ffn(xg)
            y.float().sum().backward()
            grads.append([xg.grad] + [p.grad for p in ffn.parameters()])
        for a, b in zip(*grads):
            self.assertTrue(torch.equal(a, b))
        with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
            self.assertEqual(ffn(x.float()).dtype, torch.bfloat16)  # an f32 input, as a Linear takes it
        wide = twell.FFN(256, 1024, device="cuda", dtype=torch.float32)
        with self.assertRaisesRegex(twell.TwellError, "takes bf16 parameters"):
            wide(x)

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_training_workspaces_live_with_their_graphs(self):
        """A training forward's workspace is held by its autograd graph, not by the module: nothing between
        steps, and activation checkpointing holds one layer's at a time (the same gradients)."""
        import gc
        import torch.utils.checkpoint as cp
        H, I, M, L = 512, 1536, 4096, 4
        layers = [twell.FFN(H, I, device="cuda") for _ in range(L)]
        x = torch.randn(M, H, device="cuda", dtype=torch.bfloat16)
        config = twell._capi.CudaFfn.make_config(M, H, I, training=True)
        ws = twell._capi.CudaFfn.workspace_bytes(config)

        def step(checkpointed):
            for m in layers:
                for p in m.parameters():
                    p.grad = None
            xg = x.clone().requires_grad_()
            h = xg
            for m in layers:
                h = h + (cp.checkpoint(m, h, use_reentrant=False) if checkpointed else m(h))
            h.float().sum().backward()
            torch.cuda.synchronize()
            return [xg.grad] + [p.grad for m in layers for p in m.parameters()]

        step(False)  # the handles, cuBLASLt's workspace and the tuning
        gc.collect()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()  # the parameters and their gradients
        peaks, grads = {}, {}
        for checkpointed in (False, True):
            torch.cuda.reset_peak_memory_stats()
            g = step(checkpointed)
            peaks[checkpointed] = torch.cuda.max_memory_allocated() - base
            held = torch.cuda.memory_allocated() - base - g[0].numel() * g[0].element_size()  # x's gradient
            self.assertLess(held, ws, f"checkpointed {checkpointed}: {held} bytes held after the step")
            grads[checkpointed] = [t.cpu() for t in g]
        self.assertGreater(peaks[False] - peaks[True], 2 * ws, peaks)  # L workspaces at once against one
        for a, b in zip(grads[False], grads[True]):
            self.assertTrue(torch.equal(a, b))

    @unittest.skipUnless(GPU and torch is not None and torch.cuda.device_count() >= 2, "fewer than two GPUs")
    def test_a_module_on_the_second_gpu(self):
        # the handle is built and called on the tensors' device, whatever device is current
        results = []
        for device in ("cuda:0", "cuda:1"):
            ffn, x = self.module(device=device, dispatch="always_sparse")
            xg = x.clone().requires_grad_()
            y = ffn(xg)
            y.float().sum().backward()
            self.assertEqual(y.device, torch.device(device))
            self.assertEqual(ffn.last_stats()["path"], "sparse")
            results.append([t.cpu() for t in (y, xg.grad, ffn.wg.grad, ffn.wd.grad)])
            self.assertEqual(torch.cuda.current_device(), 0)
        for a, b in zip(*results):
            self.assertTrue(torch.equal(a, b))

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_calls_from_two_streams_and_two_threads_are_ordered(self):
        H, I, M = 512, 1536, 16384
        inputs = [sparse_problem(M, H, I, "cuda", seed=s) for s in (1, 2)]
        with torch.no_grad():
            want = [twell.ffn_forward(*p) for p in inputs]
            streams = [torch.cuda.Stream(), torch.cuda.Stream()]
            for _ in range(5):  # one cached FfnForward, its workspace shared by the two streams
                outs = []
                for p, st in zip(inputs, streams):
                    with torch.cuda.stream(st):
                        outs.append(twell.ffn_forward(*p))
                torch.cuda.synchronize()
                for o, w in zip(outs, want):
                    self.assertTrue(torch.equal(o, w))
        ffn = twell.FFN(H, I, device="cuda", dispatch="always_sparse")
        with torch.no_grad():
            ffn.wg.copy_(inputs[0][1]), ffn.wu.copy_(inputs[0][2]), ffn.wd.copy_(inputs[0][3])
            ref = ffn(inputs[0][0])

        def on_two_threads(call):  # five calls on each of two threads, each thread on a stream of its own
            results, errors = [], []

            def work():
                try:
                    st = torch.cuda.Stream()
                    with torch.cuda.stream(st):
                        for _ in range(5):
                            results.append(call())
                    st.synchronize()
                except Exception as e:  # noqa: BLE001
                    errors.append(e)
            threads = [threading.Thread(target=work) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            torch.cuda.synchronize()
            self.assertEqual(errors, [])
            self.assertEqual(len(results), 10)
            return results

        def infer():
            with torch.no_grad():
                return ffn(inputs[0][0])
        for r in on_two_threads(infer):
            self.assertTrue(torch.equal(r, ref))

        def train():  # each forward has its own state, each backward gives x's gradient
            x = inputs[0][0].clone().requires_grad_()
            ffn(x).float().sum().backward()
            return x.grad
        ref_grad = train()
        for g in on_two_threads(train):
            self.assertTrue(torch.equal(g, ref_grad))

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_inference_modules_share_one_workspace(self):
        import gc
        twell.clear_cache()
        gc.collect()
        self.check_shared_workspace()
        gc.collect()
        shared = twell._device(torch.device("cuda", torch.cuda.current_device()))
        for memory in (shared.forward, shared.lt):  # they went with the modules
            self.assertTrue(memory is None or memory() is None)

    def check_shared_workspace(self):
        shared = twell._device(torch.device("cuda", torch.cuda.current_device()))

        def requested():  # the bytes asked of PyTorch's allocator (memory_allocated() counts its blocks)
            return torch.cuda.memory_stats()["requested_bytes.all.current"]

        def shared_bytes():
            return shared.forward().numel() + shared.lt().numel()

        # (shape, tokens, dispatch): the TwELL path (sampled at every call, or fused on the previous call's
        # density), the gather path, the dense path, the one-token kernel
        cases = [((512, 1536), 8192, "observe"), ((512, 1536), 8192, "previous"), ((512, 1536), 100, "always_sparse"),
                 ((512, 1536), 8192, "observe"), ((256, 1024), 1, "previous"), ((512, 1536), 8192, "previous")]
        problems = [sparse_problem(M, H, I, "cuda", seed=i) for i, ((H, I), M, _) in enumerate(cases)]
        problems[3][1][:, 0] = 2.5  # case 3's gate mostly active: it runs dense
        modules = []
        for ((H, I), _, dispatch), (_, wg, wu, wd) in zip(cases, problems):
            m = twell.FFN(H, I, device="cuda", dispatch=dispatch)
            with torch.no_grad():
                m.wg.copy_(wg), m.wu.copy_(wu), m.wd.copy_(wd)
            modules.append(m)
        twins = [copy.deepcopy(m) for m in modules]
        torch.cuda.synchronize()
        start = requested()
        want, stats, used = [], [], []
        with torch.no_grad():
            for twin, p in zip(twins, problems):  # each twin's three calls, synchronised as the modules' below
                want.append([])  # (dispatch "previous" reads the last call's density where it has arrived)
                for _ in range(3):
                    want[-1].append(twin(p[0]))
                    torch.cuda.synchronize()
                stats.append(twin.last_stats())
                used.append(requested() - start - sum(y.numel() * 2 for ys in want for y in ys))
        self.assertEqual([s["path"] for s in stats], ["sparse", "sparse", "gather", "dense", "gather", "sparse"])
        self.assertGreater(used[0], 3 * 8192 * 1536 * 2)  # one inference workspace, and cuBLASLt's ...
        self.assertEqual(used[-1], used[0])  # ... for all six (the fifth's shape is smaller)
        self.assertEqual(used[0], shared_bytes())
        # the modules' calls interleaved, on two streams: each gives its twin's results and statistics
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        with torch.no_grad():
            for r in range(3):
                outs = []
                for i, (m, p) in enumerate(zip(modules, problems)):
                    with torch.cuda.stream(streams[(i + r) % 2]):
                        outs.append(m(p[0]))
                torch.cuda.synchronize()
                for i, o in enumerate(outs):
                    self.assertTrue(torch.equal(o, want[i][r]), (r, i))
            for m, st in zip(modules, stats):
                self.assertEqual(m.last_stats(), st)
            # a larger call grows the memory; the others let the old go at once (their statistics kept)
            # and are rebuilt on the new at their next call
            x2 = torch.cat([problems[0][0], problems[0][0]])
            torch.cuda.synchronize()
            before, old = requested(), shared.forward().numel()
            y2 = modules[0](x2)
            new = shared.forward().numel()
            self.assertGreater(new, 1.9 * old)
            self.assertEqual(requested() - before, new - old + y2.numel() * 2)
            y64, _ = reference(x2, *problems[0][1:], torch.float64)
            y16, _ = reference(x2, *problems[0][1:], torch.bfloat16)
            self.assertLessEqual(rel(y2, y64), 2 * rel(y16, y64) + 1e-6)
            for i in range(1, len(cases)):
                self.assertEqual(modules[i].last_stats(), stats[i])
                self.assertTrue(torch.equal(modules[i](problems[i][0]), want[i][0]), i)

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_copies_and_release(self):
        ffn, x = self.module()
        with torch.no_grad():
            y = ffn(x)
            twin = copy.deepcopy(ffn)  # parameters copied, GPU objects rebuilt at the first call
            self.assertTrue(torch.equal(twin(x), y))
            ffn.release_workspace()
            self.assertTrue(torch.equal(ffn(x), y))
        twell.clear_cache()

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_autograd_corners(self):
        ffn, x = self.module(dispatch="always_sparse")
        # only the weights, then only x, need gradients
        ffn(x).float().sum().backward()
        self.assertIsNotNone(ffn.wd.grad)
        for p in ffn.parameters():
            p.requires_grad_(False)
        xg = x.clone().requires_grad_()
        ffn(xg).float().sum().backward()
        self.assertEqual(xg.grad.shape, x.shape)
        self.assertEqual(xg.grad.dtype, torch.bfloat16)
        for p in ffn.parameters():
            p.requires_grad_(True)
            p.grad = None
        # the same tensor twice in one graph
        (ffn(xg).float().sum() + ffn(xg).float().sum()).backward()
        # several forwards awaiting their backwards (other tokens, then a call larger than the objects were
        # sized for): each keeps its own state, so the first's backward gives the bits of a forward alone
        xg.grad = None
        ffn.zero_grad(set_to_none=True)
        ffn(xg).float().sum().backward()
        want = [xg.grad.clone()] + [p.grad.clone() for p in ffn.parameters()]
        for other in (x.clone(), torch.cat([x] * 10)):
            xg.grad = None
            ffn.zero_grad(set_to_none=True)
            y1 = ffn(xg)
            y2 = ffn(other.requires_grad_())
            y1.float().sum().backward()
            got = [xg.grad.clone()] + [p.grad.clone() for p in ffn.parameters()]
            for a, b in zip(got, want):
                self.assertTrue(torch.equal(a, b), other.shape)
            y2.float().sum().backward()
            self.assertEqual(other.grad.shape, other.shape)
        # saved-tensor hooks that move what the graph saves (to CPU memory, pinned or not): refused, saying why
        for pin in (False, True):
            with torch.autograd.graph.save_on_cpu(pin_memory=pin):
                y1 = ffn(xg)
            with self.assertRaisesRegex(twell.TwellError, "saved-tensor hook"):
                y1.float().sum().backward()
        # no tokens: an output in the graph, zero gradients
        for p in ffn.parameters():
            p.grad = None
        y0 = ffn(x[:0].clone().requires_grad_())
        self.assertTrue(y0.requires_grad)
        y0.float().sum().backward()
        self.assertTrue(torch.equal(ffn.wd.grad, torch.zeros_like(ffn.wd)))
        # training what the GPU backward does not take is refused before any work
        plain, _ = self.module(gated=False)
        with self.assertRaisesRegex(twell.TwellError, "gated FFN in bf16 precision only"):
            plain(x)
        with torch.no_grad():
            self.assertEqual(plain(x).shape, x.shape)  # inference is fine
        with self.assertRaisesRegex(twell.TwellError, "has no backward"):
            twell.ffn_forward(x, ffn.wg, ffn.wu, ffn.wd)


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TorchFfnFromHf(unittest.TestCase):
    """On the CPU backend: what a model converted with replace_hf_mlps keeps of the original (its
    state_dict's names, frozen weights, mode), and what the module refuses at once."""

    def test_replace_hf_mlps_keeps_a_shared_mlp_shared(self):
        mlp = Mlp(16, 32)

        class Two(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = mlp, mlp
                self.c = torch.nn.Sequential(mlp)

        model = Two()
        x = torch.randn(4, 16)
        with torch.no_grad():
            want = mlp(x)
        self.assertEqual(twell.replace_hf_mlps(model), 3)  # places: a shared MLP runs at each
        self.assertIsInstance(model.a, twell.FFN)
        self.assertIs(model.a, model.b)
        self.assertIs(model.a, model.c[0])
        self.assertEqual(model.a.layers, 3)
        with torch.no_grad():
            self.assertLess(rel(model.a(x), want), 1e-6)
        with self.assertRaisesRegex(twell.TwellError, "an MLP itself: twell.FFN.from_hf_mlp\\(mlp\\)"):
            twell.replace_hf_mlps(Mlp(16, 32))

    def test_hf_state_dict_names_and_frozen_weights_stay_frozen(self):
        torch.manual_seed(0)
        mlp = Mlp(32, 96).eval().requires_grad_(False)
        ffn = twell.FFN.from_hf_mlp(mlp, precision="f64")
        self.assertEqual(ffn.wu.dtype, torch.float32)  # the CPU keeps a float32 MLP's dtype
        self.assertFalse(any(p.requires_grad for p in ffn.parameters()))
        self.assertFalse(ffn.training)
        x = torch.randn(5, 32)
        with torch.no_grad():
            self.assertLess(rel(ffn(x), mlp(x)), 1e-6)
        self.assertEqual(sorted(ffn.state_dict()), ["wd", "wg", "wu"])  # the parameters' own names (FSDP, EMA)
        self.assertEqual(ffn.state_dict()["wd"].data_ptr(), ffn.wd.data_ptr())
        sd = twell.hf_state_dict(torch.nn.Sequential(ffn))
        self.assertEqual(sorted(sd), ["0.down_proj.weight", "0.gate_proj.weight", "0.up_proj.weight"])
        self.assertTrue(torch.equal(sd["0.down_proj.weight"], mlp.down_proj.weight))
        again = torch.nn.Sequential(Mlp(32, 96))
        again.load_state_dict(sd)  # what save_pretrained(state_dict=hf_state_dict(model)) writes
        self.assertTrue(torch.equal(again[0].down_proj.weight, mlp.down_proj.weight))
        for assign in (False, True):  # either layout loads; assigned, wd is contiguous
            fresh = twell.FFN(32, 96, dtype=torch.float32)
            fresh.load_state_dict(mlp.state_dict(), assign=assign)
            self.assertTrue(torch.equal(fresh.wd, ffn.wd))
            self.assertTrue(fresh.wd.is_contiguous())
        missing = twell.FFN(32, 96, dtype=torch.float32).load_state_dict(
            {"gate_proj.weight": mlp.gate_proj.weight}, strict=False).missing_keys
        self.assertEqual(sorted(missing), ["down_proj.weight", "up_proj.weight"])  # in the names it was given
        with self.assertRaisesRegex(RuntimeError, r"size mismatch for down_proj.weight \(as twell's wd, transposed\): "
                                    r"copying a param with shape torch.Size\(\[32, 96\]\) from checkpoint, the shape "
                                    r"in current model is torch.Size\(\[32, 64\]\)"):  # down_proj's layout
            twell.FFN(32, 64, dtype=torch.float32).load_state_dict(mlp.state_dict())
        copy.deepcopy(ffn), pickle.loads(pickle.dumps(ffn))
        shared = torch.nn.Module()  # one FFN at two paths: both converted
        shared.a = shared.b = ffn
        self.assertEqual(sorted(twell.hf_state_dict(shared)), [f"{p}.{n}" for p in "ab" for n in
                                                               ("down_proj.weight", "gate_proj.weight", "up_proj.weight")])
        self.assertEqual(twell.FFN.from_hf_mlp(mlp, device=None).wu.device.type, "cpu")  # the default device

        model = torch.nn.Sequential(Mlp(32, 96), Mlp(32, 96, bias=True))
        self.assertEqual(twell.replace_hf_mlps(model), 1)  # the one with biases is left as it is
        self.assertIsInstance(model[1], Mlp)
        silu = Mlp(32, 96)
        silu.act_fn = torch.nn.SiLU()
        with self.assertWarnsRegex(UserWarning, "nothing replaced .*activations: SiLU"):
            self.assertEqual(twell.replace_hf_mlps(torch.nn.Sequential(silu)), 0)

    def test_refusals_double_backward_meta_and_autocast(self):
        for bad in (dict(layers=0), dict(l1=-1.0), dict(l1=float("nan")), dict(l1=10**400), dict(dtype=torch.float16),
                    dict(gated="no"), dict(max_tokens=-1)):
            with self.assertRaises(twell.TwellError, msg=str(bad)):
                twell.FFN(8, 16, **bad)
        ffn = twell.FFN(16, 32, precision="f64", dtype=torch.float64)
        x = torch.randn(6, 16, dtype=torch.float64, requires_grad=True)
        g, = torch.autograd.grad(ffn(x).sum(), x, create_graph=True)  # a gradient is a constant there...
        with self.assertRaisesRegex(twell.TwellError, "no double backward"):
            (g ** 2).sum().backward()  # ... and differentiating it raises (it was silently cut)
        g, = torch.autograd.grad((x + ffn(x)).pow(2).sum(), x, create_graph=True)  # through a residual
        with self.assertRaisesRegex(twell.TwellError, "no double backward"):
            torch.autograd.grad(g.pow(2).sum(), x)  # grad(inputs=...) too, not only backward()
        lin = torch.nn.Linear(16, 1, dtype=torch.float64)  # first-order uses of a create_graph still work
        gw, = torch.autograd.grad(lin(ffn(x)).pow(2).sum(), [lin.weight], create_graph=True)
        gw.pow(2).sum().backward()
        self.assertIsNotNone(ffn.wd.grad)
        meta = twell.FFN(16, 32, device="meta")
        out = meta(torch.empty(3, 16, device="meta", dtype=torch.bfloat16))
        self.assertEqual((out.shape, out.requires_grad), ((3, 16), True))
        f32, f64 = twell.FFN(16, 32, dtype=torch.float32), twell.FFN(16, 32, dtype=torch.float64)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            self.assertEqual(f32(torch.randn(4, 16)).dtype, torch.bfloat16)  # as a Linear gives under autocast
            self.assertEqual(f64(torch.randn(4, 16, dtype=torch.float64)).dtype, torch.float64)  # as a Linear too
        f32(torch.randn(5, 16))
        with self.assertRaises(twell.TwellError):
            f32(torch.randn(7, 16).half())
        self.assertEqual(f32.last_stats()["tokens"], 5)  # the refused call's are not there


@unittest.skipIf(torch is None, "PyTorch is not installed")
class TorchFfnCompiled(unittest.TestCase):
    """twell.FFN as the custom ops twell::ffn and twell::ffn_backward: torch.compile(fullgraph=True) and
    torch.export take it whole, with the same results as eager."""

    def block_model(self, device, dtype, **kwargs):
        torch.manual_seed(0)
        return torch.nn.Sequential(Block(device, dtype, **kwargs), Block(device, dtype, **kwargs))

    def check_compiled_matches_eager(self, device, dtype, backend, tolerance=0.0, **kwargs):
        model = self.block_model(device, dtype, **kwargs)
        x = torch.randn(2, 7, 64, device=device, dtype=dtype)

        def run(f, x):
            model.zero_grad()
            xg = x.clone().requires_grad_()
            y = f(xg)
            y.float().pow(2).sum().backward()
            return [y.detach(), xg.grad] + [p.grad.clone() for p in model.parameters()]
        want = run(model, x)
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        for tokens in (5, 9):  # other token counts first (dynamic shapes)
            with torch.no_grad():
                compiled(torch.randn(2, tokens, 64, device=device, dtype=dtype))
        got = run(compiled, x)
        for a, b in zip(got, want):
            self.assertLessEqual(rel(a, b), tolerance)
        self.assertEqual(model[1].ffn.last_stats()["tokens"], 14)
        return model, x

    def test_compile_export_and_opcheck_on_the_cpu(self):
        model, x = self.check_compiled_matches_eager("cpu", torch.float64, "aot_eager", precision="f64")
        exported = torch.export.export(model, (x,))
        self.assertIn("torch.ops.twell.ffn", exported.graph_module.code)
        self.assertTrue(torch.equal(exported.module()(x), model(x)))
        ffn = model[0].ffn
        xg = x.view(-1, 64).clone().requires_grad_()
        for tokens in (14, 0):  # the schema, the fake (meta) kernel, the autograd registration
            result = torch.library.opcheck(torch.ops.twell.ffn.default,
                                           (xg[:tokens], ffn.wg, ffn.wu, ffn.wd, ffn._state.key, True))
            self.assertEqual(set(result.values()), {"SUCCESS"}, result)
        del model, ffn
        with self.assertRaisesRegex(twell.TwellError, "does not exist in this process"):
            exported.module()(x)  # its modules are gone: refused, not run with another module's state

    def test_functional_forward_compiles_whole(self):
        torch.manual_seed(1)
        wg, wu, wd = (torch.randn(32, 16, dtype=torch.float64) * 0.3 for _ in range(3))

        def f(x):
            return twell.ffn_forward(torch.tanh(x), wg, wu, wd, precision="f64") * 2

        x = torch.randn(3, 5, 16, dtype=torch.float64)
        with torch.no_grad():
            compiled = torch.compile(f, fullgraph=True, backend="aot_eager")  # a graph break would raise
            for tokens in (4, 0, 5):
                xt = x[:, :tokens]
                self.assertTrue(torch.equal(compiled(xt), f(xt)))
        # torch.vmap: a batch of x is one call on more tokens; batched weights, one call a slice
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # not PyTorch's slice-by-slice fallback, which warns
            batched = torch.vmap(lambda xi: twell.ffn_forward(xi, wg, wu, wd, precision="f64"))(x)
            wgs = torch.stack([wg, wg * 0.5, wg * 2])
            per_weight = torch.vmap(lambda w: twell.ffn_forward(x[0], w, wu, wd, precision="f64"))(wgs)
        self.assertTrue(torch.equal(batched, torch.stack([twell.ffn_forward(xi, wg, wu, wd, precision="f64")
                                                          for xi in x])))
        for w, y in zip(wgs, per_weight):
            self.assertTrue(torch.equal(y, twell.ffn_forward(x[0], w, wu, wd, precision="f64")))
        result = torch.library.opcheck(torch.ops.twell.ffn_forward.default, (x.view(-1, 16), wg, wu, wd, "f64",
                                       "observe"), test_utils=("test_schema", "test_faketensor"))
        self.assertEqual(set(result.values()), {"SUCCESS"}, result)

    def test_layers_compiled_one_by_one_share_code_and_graphs_outlive_modules(self):
        from torch._dynamo.utils import counters
        torch._dynamo.reset()
        counters.clear()
        blocks = [Block("cpu", torch.float64, precision="f64") for _ in range(10)]
        for b in blocks:
            b.compile(fullgraph=True, backend="aot_eager")  # as FSDP2-style training compiles each block
        h = torch.randn(3, 64, dtype=torch.float64, requires_grad=True)
        for b in blocks:
            h = b(h)
        h.sum().backward()
        self.assertLessEqual(counters["stats"]["unique_graphs"], 2)  # not one a layer (the recompile limit is 8)
        # a graph keeps its module: the backward of a module deleted after its forward runs
        x = torch.randn(5, 16, dtype=torch.float64, requires_grad=True)
        twell.FFN(16, 32, precision="f64", dtype=torch.float64)(x).sum().backward()
        self.assertEqual(x.grad.shape, x.shape)
        # ... and no more: a module holding its own output (a graph) is freed with it, as a Linear is
        import gc
        import weakref
        m = twell.FFN(16, 32, precision="f64", dtype=torch.float64)
        gone = weakref.ref(m)
        m.out = m(x)
        del m
        gc.collect()
        self.assertIsNone(gone())

    def test_built_under_a_default_device_and_pickled(self):
        with torch.device("meta"):  # as transformers builds a model before loading its weights
            ffn = twell.FFN(16, 32, l1=0.5, layers=3, precision="f64", dtype=torch.float64)
        ffn.to_empty(device="cpu")
        ffn.reset_parameters()
        x = torch.randn(4, 16, dtype=torch.float64)
        with torch.no_grad():
            y = ffn(x)
        self.assertLess(rel(y, reference(x, ffn.wg, ffn.wu, ffn.wd, torch.float64)[0]), 1e-12)
        twin = pickle.loads(pickle.dumps(ffn))
        self.assertEqual((twin.l1, twin.layers), (0.5, 3))
        with self.assertRaises(twell.TwellError):
            twin.l1 = -1.0

    @unittest.skipUnless(GPU, f"no Hopper GPU: {WHY}")
    def test_compile_on_the_gpu(self):
        # aot_eager runs the same kernels; inductor fuses the bf16 residual adds around the FFN in float32
        for backend, tolerance in (("aot_eager", 0.0), ("inductor", 2e-2)):
            self.check_compiled_matches_eager("cuda", torch.bfloat16, backend, tolerance, dispatch="always_sparse")
        ffn = self.block_model("cuda", torch.bfloat16)[0].ffn
        x = torch.randn(3, 64, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            compiled = torch.compile(twell.ffn_forward, fullgraph=True, backend="aot_eager")
            weights = (ffn.wg, ffn.wu, ffn.wd)
            self.assertTrue(torch.equal(compiled(x, *weights), twell.ffn_forward(x, *weights)))


try:
    import transformers  # noqa: F401
except ImportError:
    transformers = None


@unittest.skipIf(torch is None or transformers is None, "PyTorch and transformers are not both installed")
class GenerationMatchesTransformers(unittest.TestCase):
    """twell.Model's greedy generation on the CPU backend draws transformers' tokens for the same float32
    checkpoint, with its repetition_penalty too (applied to the prompt's ids and the new ones)."""

    def test_greedy_tokens_with_and_without_the_repetition_penalty(self):
        import tempfile
        cfg = transformers.LlamaConfig(vocab_size=258, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, hidden_act="relu",
                                       max_position_embeddings=64, tie_word_embeddings=False, bos_token_id=256,
                                       eos_token_id=257)
        torch.manual_seed(0)
        hf = transformers.LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            for p in hf.parameters():  # weights large enough that the text moves and repeats
                p.normal_(0, 0.3)
        prompt = [256, 10, 11, 12, 10]
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp, safe_serialization=True)
            with twell.Model(tmp, device="cpu", tokenizer="bytes") as m:
                for penalty in (1.0, 1.3, 0.8):
                    with torch.no_grad():
                        want = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                           repetition_penalty=penalty, eos_token_id=None, pad_token_id=0)
                    got = m.generate(prompt, max_new_tokens=16, stop=False, repetition_penalty=penalty)
                    self.assertEqual(got, want[0, len(prompt):].tolist(), f"repetition_penalty {penalty}")


@unittest.skipIf(torch is None or transformers is None, "PyTorch and transformers are not both installed")
class TrainSparseExample(unittest.TestCase):
    """python/examples/train_sparse.py at a tiny size: it trains, logs, saves an HF checkpoint, and
    twell.Model's logits of that checkpoint match the trained model's (the example checks and exits 1)."""

    def test_trains_saves_and_loads(self):
        import subprocess
        import tempfile
        here = os.path.dirname(os.path.abspath(__file__))
        with tempfile.TemporaryDirectory() as tmp:
            text = os.path.join(tmp, "text.txt")
            with open(text, "w") as f:
                f.write("the quick brown fox jumps over the lazy dog. " * 200)
            out = os.path.join(tmp, "runs", "ckpt")

            def train(out, steps):
                args = [sys.executable, os.path.join(here, "..", "examples", "train_sparse.py"), "--data", text,
                        "--out", out, "--steps", str(steps), "--log-every", "3", "--batch", "2", "--context", "32",
                        "--hidden", "64", "--layers", "2", "--device", "cpu"]
                return subprocess.run(args, capture_output=True, text=True, timeout=300)

            run = train(out, 6)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            self.assertRegex(run.stdout, r"step +6/6 +CE [0-9.]+ +held-out [0-9.]+ .*non-zeros a token [0-9.]+ of 256")
            self.assertRegex(run.stdout, r"logits relative error [0-9.e+-]+ against the trained model's")
            with open(os.path.join(out, "train_log.json")) as f:
                self.assertEqual([e["step"] for e in json.load(f)["log"]], [3, 6])
            self.assertTrue(os.path.isfile(os.path.join(out, "model.safetensors")))
            # An earlier run's folder is replaced whole; nothing is left beside it.
            again = train(out, 3)
            self.assertEqual(again.returncode, 0, again.stdout + again.stderr)
            with open(os.path.join(out, "train_log.json")) as f:
                self.assertEqual([e["step"] for e in json.load(f)["log"]], [3])
            self.assertEqual(sorted(os.listdir(os.path.dirname(out))), ["ckpt"])
            # A folder of something else (here the data's) is refused before any training, and kept.
            refused = train(tmp, 3)
            self.assertEqual(refused.returncode, 2, refused.stdout + refused.stderr)
            self.assertIn("holds files of something else", refused.stderr)
            self.assertNotIn("step", refused.stdout)
            self.assertTrue(os.path.isfile(text))


if __name__ == "__main__":
    unittest.main()
