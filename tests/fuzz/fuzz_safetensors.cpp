// libFuzzer target for the safetensors parser: any byte string must either parse into tensors
// whose views lie inside the input, or fail with twell::Error, never crash, leak or read out of
// bounds (run under ASan/UBSan). Build: -DTWELL_FUZZ=ON with clang; ctest -L fuzz runs it for
// TWELL_FUZZ_SECONDS over the seed corpus in tests/fuzz/corpus.
#include <cstddef>
#include <cstdint>

#include "twell/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto file = twell::io::SafetensorsFile::parse(data, size, "fuzz.safetensors");
    volatile uint8_t sink = 0;
    for (const auto& info : file.tensors()) {
      if (!info.readable) continue;  // listed only: view() refuses it
      const twell::TensorView view = file.view(info.name);
      // Every byte of every view must be inside the input (ASan flags any that is not).
      const auto* bytes = static_cast<const uint8_t*>(view.data);
      for (size_t i = 0; i < view.nbytes(); ++i) sink = sink ^ bytes[i];
      twell::io::first_non_finite(view);
      if (info.dtype == twell::DType::bf16 || info.dtype == twell::DType::f16 ||
          info.dtype == twell::DType::f32) {
        file.read_as(info.name, twell::DType::f32);
        file.read_as(info.name, twell::DType::bf16);
      }
      try {
        file.check_finite(info.name);
      } catch (const twell::Error&) {
      }
    }
    (void)file.metadata().size();
  } catch (const twell::Error&) {
    // Rejected input: the expected outcome for almost everything.
  }
  return 0;
}
