/* twell's C interface from a C program built against the installed package (CMakeLists.txt beside
 * this file): one small FFN on the CPU reference backend in float64, checked against the same sums
 * written out here, then a refused call and its message. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "twell/c_api.h"

enum { M = 2, H = 4, I = 3 };

static twell_tensor tensor(double* data, int64_t rows, int64_t cols) {
  twell_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = TWELL_DTYPE_F64;
  t.device = TWELL_DEVICE_CPU;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  return t;
}

int main(void) {
  /* The library loaded is the one this was compiled against: its structs have these layouts. */
  if (twell_c_api_version() != TWELL_C_API_VERSION) {
    fprintf(stderr, "c_api example: built for twell's C API %d, the library loaded has %d\n", TWELL_C_API_VERSION,
            (int)twell_c_api_version());
    return 1;
  }
  double x[M * H], wg[I * H], wu[I * H], wd[I * H], y[M * H];
  for (int i = 0; i < M * H; ++i) x[i] = 0.25 * (i % 5) - 0.5;
  for (int i = 0; i < I * H; ++i) {
    wg[i] = 0.1 * ((i * 7) % 11) - 0.4;
    wu[i] = 0.2 * ((i * 3) % 5) - 0.3;
    wd[i] = 0.15 * ((i * 5) % 7) - 0.35;
  }
  const twell_tensor tx = tensor(x, M, H), tg = tensor(wg, I, H), tu = tensor(wu, I, H), td = tensor(wd, I, H),
                     ty = tensor(y, M, H);
  twell_activation_stats stats;
  if (twell_cpu_ffn_forward(&tx, &tg, &tu, &td, &ty, TWELL_PRECISION_F64, &stats, NULL) != TWELL_OK) {
    fprintf(stderr, "c_api example: %s\n", twell_last_error());
    return 1;
  }
  double worst = 0;
  for (int m = 0; m < M; ++m)
    for (int c = 0; c < H; ++c) {
      double want = 0;
      for (int j = 0; j < I; ++j) {
        double g = 0, u = 0;
        for (int k = 0; k < H; ++k) g += x[m * H + k] * wg[j * H + k], u += x[m * H + k] * wu[j * H + k];
        want += (g > 0 ? g : 0) * u * wd[j * H + c];
      }
      worst = fmax(worst, fabs(y[m * H + c] - want));
    }
  printf("twell %s (C API %d): FFN of %lld tokens on the CPU, %lld non-zeros, largest difference %.1e\n",
         twell_version(), (int)twell_c_api_version(), (long long)stats.tokens, (long long)stats.nnz, worst);
  const twell_tensor wrong = tensor(wd, I, H - 1);
  if (twell_cpu_ffn_forward(&tx, &tg, &tu, &wrong, &ty, TWELL_PRECISION_F64, NULL, NULL) != TWELL_ERROR) return 1;
  printf("refused: %s\n", twell_last_error());
  return worst < 1e-12 ? 0 : 1;
}
