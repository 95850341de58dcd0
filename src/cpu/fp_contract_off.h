// Switches off floating-point contraction (FMA) for the rest of the translation unit, so that the
// reference backend rounds every product before adding it, whatever -march or -ffp-contract the
// build uses. That keeps its results identical across builds and keeps the dense and sparse paths
// bit-identical (src/cpu/ffn_common.h documents the arithmetic).
//
// Include it FIRST in every src/cpu file that does floating-point maths: GCC's optimize pragma
// applies to the functions declared after it, and a translation unit whose functions carry mixed
// options loses inlining between them. ffn_common.h refuses to compile without it.
#pragma once

#define TWELL_CPU_FP_CONTRACT_OFF 1

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
