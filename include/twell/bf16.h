// bfloat16 storage type usable on host and device: 1 sign, 8 exponent, 7 mantissa bits (the top
// half of an IEEE float). Conversion from float rounds to nearest, ties to even; NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TWELL_HD __host__ __device__ __forceinline__
#else
#define TWELL_HD inline
#endif

namespace twell {

TWELL_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

TWELL_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// Round-to-nearest-even float -> bf16 bits. NaN is kept quiet (sign and top payload kept).
TWELL_HD uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

TWELL_HD float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// Rounds a float to the nearest bf16 value and returns it as float: the "round to bf16" points of
// the reference backend (DESIGN.md §2).
TWELL_HD float round_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

struct bf16 {
  uint16_t bits = 0;

  bf16() = default;
  TWELL_HD explicit bf16(float f) : bits(float_to_bf16_bits(f)) {}
  TWELL_HD static bf16 from_bits(uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
  TWELL_HD explicit operator float() const { return bf16_bits_to_float(bits); }
  TWELL_HD float to_float() const { return bf16_bits_to_float(bits); }
};
static_assert(sizeof(bf16) == 2, "bf16 must be two bytes");

// IEEE half -> float (for reading f16 checkpoints on the host).
float f16_bits_to_float(uint16_t h);
uint16_t float_to_f16_bits(float f);

// Round-to-nearest-even double -> bf16 and f16 bits, rounded once (host). `float_to_bf16_bits(float(d))`
// rounds twice and can miss the nearest value by an ulp (1 + 2^-8 + 2^-30 gives 1, not 1 + 2^-7) —
// PyTorch's route, which the safetensors reader keeps on purpose; the f64 oracle's stores use these.
uint16_t double_to_bf16_bits(double d);
uint16_t double_to_f16_bits(double d);

}  // namespace twell
