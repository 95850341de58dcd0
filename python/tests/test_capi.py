"""The C interface through ctypes, with the standard library alone (CI has no PyTorch): the CPU
reference FFN against a plain Python one, the backward against the chain rule written out, errors."""
import array
import importlib.util
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from twell import _capi  # noqa: E402


def f64(values, shape):
    a = array.array("d", values)
    return a, _capi.tensor(a.buffer_info()[0], _capi.F64, _capi.CPU, shape)


def matmul_t(a, b, rows, inner, cols):
    """a [rows, inner] times b [cols, inner] transposed."""
    return [[sum(a[r * inner + k] * b[c * inner + k] for k in range(inner)) for c in range(cols)] for r in range(rows)]


class CpuFfn(unittest.TestCase):
    M, H, I = 3, 8, 16

    def setUp(self):
        rng = random.Random(1)
        n = lambda count, s: [rng.gauss(0, s) for _ in range(count)]  # noqa: E731
        self.x, self.tx = f64(n(self.M * self.H, 1.0), (self.M, self.H))
        self.wg, self.twg = f64(n(self.I * self.H, 0.4), (self.I, self.H))
        self.wu, self.twu = f64(n(self.I * self.H, 0.4), (self.I, self.H))
        self.wd, self.twd = f64(n(self.I * self.H, 0.3), (self.I, self.H))
        self.g = [[max(v, 0.0) for v in row] for row in matmul_t(self.x, self.wg, self.M, self.H, self.I)]
        self.u = matmul_t(self.x, self.wu, self.M, self.H, self.I)
        self.h = [[g * u for g, u in zip(gr, ur)] for gr, ur in zip(self.g, self.u)]

    def forward(self, y, stats=None, wd=None):
        return _capi.lib.twell_cpu_ffn_forward(_capi.ref(self.tx), _capi.ref(self.twg), _capi.ref(self.twu),
                                               _capi.ref(wd or self.twd), _capi.ref(y), _capi.PRECISION["f64"],
                                               stats, None)

    def test_version_and_library(self):
        self.assertRegex(_capi.version(), r"^\d+\.\d+\.\d+$")
        self.assertEqual(_capi.lib.twell_c_api_version(), _capi.API_VERSION)
        # the package's version (pyproject.toml) is the library's (CMakeLists.txt's project version)
        pyproject = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyproject.toml")
        with open(pyproject) as f:
            self.assertIn(f'version = "{_capi.version()}"', f.read())

    def test_forward_is_the_plain_python_ffn(self):
        y, ty = f64([float("nan")] * (self.M * self.H), (self.M, self.H))
        stats = _capi.ActivationStats()
        _capi.check(self.forward(ty, _capi.ctypes.byref(stats)))
        for m in range(self.M):
            for c in range(self.H):
                want = sum(self.h[m][j] * self.wd[j * self.H + c] for j in range(self.I))
                self.assertAlmostEqual(y[m * self.H + c], want, delta=1e-12 * (1 + abs(want)))
        self.assertEqual(stats.tokens, self.M)
        self.assertEqual(stats.nnz, sum(v != 0 for row in self.h for v in row))
        self.assertAlmostEqual(stats.l1_sum, sum(abs(v) for row in self.h for v in row), delta=1e-9)

    def test_thread_count_changes_no_bit(self):
        one_thread, default = array.array("d", [0.0] * (self.M * self.H)), array.array("d", [0.0] * (self.M * self.H))
        previous = _capi.set_num_threads(1)
        try:
            self.assertEqual(self.forward(_capi.tensor(one_thread.buffer_info()[0], _capi.F64, _capi.CPU,
                                                       (self.M, self.H))), 0)
        finally:
            self.assertEqual(_capi.set_num_threads(previous), 1)
        self.assertEqual(self.forward(_capi.tensor(default.buffer_info()[0], _capi.F64, _capi.CPU, (self.M, self.H))), 0)
        self.assertEqual(one_thread.tolist(), default.tolist())
        for bad in (-1, 5000, 2.0, True, "1"):
            with self.assertRaisesRegex(_capi.TwellError, "n must be an integer in \\[0, 4096\\]"):
                _capi.set_num_threads(bad)

    def test_backward_is_the_chain_rule(self):
        rng = random.Random(2)
        dy, tdy = f64([rng.gauss(0, 1) for _ in range(self.M * self.H)], (self.M, self.H))
        dx, tdx = f64([0.0] * (self.M * self.H), (self.M, self.H))
        dwd, tdwd = f64([0.0] * (self.I * self.H), (self.I, self.H))
        l1 = 0.01
        _capi.check(_capi.lib.twell_cpu_ffn_backward(
            _capi.ref(self.tx), _capi.ref(self.twg), _capi.ref(self.twu), _capi.ref(self.twd), _capi.ref(tdy), l1,
            _capi.ref(tdx), None, None, _capi.ref(tdwd), _capi.PRECISION["f64"]))
        M, H, I = self.M, self.H, self.I
        for m in range(M):
            dh = [sum(dy[m * H + c] * self.wd[j * H + c] for c in range(H)) for j in range(I)]
            # the L1 penalty's gradient on the active set, sign(h)
            dh = [d + (l1 * ((h > 0) - (h < 0)) if g > 0 else 0.0) for d, h, g in zip(dh, self.h[m], self.g[m])]
            dg = [d * u if g > 0 else 0.0 for d, u, g in zip(dh, self.u[m], self.g[m])]
            du = [d * g for d, g in zip(dh, self.g[m])]
            for c in range(H):
                want = sum(dg[j] * self.wg[j * H + c] + du[j] * self.wu[j * H + c] for j in range(I))
                self.assertAlmostEqual(dx[m * H + c], want, delta=1e-12 * (1 + abs(want)))
        for j in range(I):
            for c in range(H):
                want = sum(self.h[m][j] * dy[m * H + c] for m in range(M))
                self.assertAlmostEqual(dwd[j * H + c], want, delta=1e-12 * (1 + abs(want)))

    def test_struct_layouts_are_the_headers(self):
        # the sizes src/capi/c_api.cpp asserts for the structs of include/twell/c_api.h
        sizes = {_capi.Tensor: 56, _capi.ActivationStats: 32, _capi.FfnStats: 40, _capi.CudaFfnConfig: 72,
                 _capi.ModelOptions: 80, _capi.ModelInfo: 80, _capi.Sampling: 64, _capi.Generation: 32,
                 _capi.TokenizerInfo: 20}
        for struct, size in sizes.items():
            self.assertEqual(_capi.ctypes.sizeof(struct), size, struct.__name__)
        config = _capi.CudaFfnConfig
        self.assertEqual((config.cublaslt_workspace.offset, config.cublaslt_workspace_bytes.offset), (40, 48))
        self.assertEqual(_capi.Tensor.shape.offset, 24)
        self.assertEqual(_capi.FfnStats.tokens.offset, 8)
        self.assertEqual(_capi.ModelOptions.log.offset, 32)
        self.assertEqual(_capi.ModelOptions.gpu_memory.offset, 48)
        self.assertEqual(_capi.ModelOptions.max_batch.offset, 56)
        self.assertEqual(_capi.ModelOptions.max_tokens.offset, 64)
        self.assertEqual(_capi.ModelInfo.max_batch.offset, 72)
        self.assertEqual(_capi.Generation.prefill_seconds.offset, 16)

    def test_errors_name_the_argument_and_write_nothing(self):
        y, ty = f64([7.0] * (self.M * self.H), (self.M, self.H))
        _, short = f64([0.0] * (self.I * (self.H - 1)), (self.I, self.H - 1))
        with self.assertRaisesRegex(_capi.TwellError, r"wd.*\[16, 8\].*\[16, 7\]"):
            _capi.check(self.forward(ty, wd=short))
        self.assertEqual(set(y), {7.0})
        with self.assertRaisesRegex(_capi.TwellError, "1 to 4 dimensions"):
            _capi.tensor(None, _capi.F64, _capi.CPU, (1, 2, 3, 4, 5))

    def test_cuda_availability_says_why_not(self):
        ok, why = _capi.cuda_available()
        self.assertEqual(ok, why == "")
        if not ok:  # a GPU handle is refused with the same reason (CI has no GPU)
            with self.assertRaisesRegex(_capi.TwellError, "twell_cuda_ffn_create: |has no CUDA backend"):
                _capi.CudaFfn(_capi.CudaFfn.make_config(128, 64, 128))
            with self.assertRaisesRegex(_capi.TwellError, "dispatch must be one of"):
                _capi.CudaFfn.make_config(128, 64, 128, dispatch="sometimes")


@unittest.skipIf(importlib.util.find_spec("torch") is not None, "PyTorch is installed: test_torch.py covers twell.FFN")
class WithoutTorch(unittest.TestCase):
    def test_the_torch_layer_says_what_is_missing(self):
        import twell
        for call in (lambda: twell.FFN(64, 128), lambda: twell.FFN.from_hf_mlp(None)):
            with self.assertRaisesRegex(ImportError, "needs PyTorch"):
                call()
        self.assertIsInstance(twell.cuda_available(), bool)
        self.assertEqual(twell.__version__, _capi.version())

    def test_l1_coefficient_is_lambda_over_tokens_and_layers(self):
        import twell
        self.assertEqual(twell.l1_coefficient(0.5, 100, 2), 0.5 / 200)
        self.assertEqual(twell.l1_coefficient(0.5, 0), 0.0)
        for l1 in (-1, float("nan"), float("inf"), "0.1"):  # as twell.FFN's l1 refuses them
            with self.assertRaisesRegex(ValueError, "l1 must be a finite number of at least 0"):
                twell.l1_coefficient(l1, 10)
        with self.assertRaisesRegex(ValueError, "layers >= 1"):
            twell.l1_coefficient(0.5, 10, 0)


if __name__ == "__main__":
    unittest.main()
