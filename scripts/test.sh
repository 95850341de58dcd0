#!/usr/bin/env bash
# Builds twell and runs its tests:
#   1. the default build (CUDA when nvcc is present): CPU tests, and GPU tests (skipped, with a
#      message, where no Hopper GPU is present);
#   2. a clang build with AddressSanitizer + UndefinedBehaviorSanitizer and the libFuzzer target:
#      the CPU tests again, and the safetensors parser fuzzed for TWELL_FUZZ_SECONDS (default 30).
# Usage: scripts/test.sh [--quick]   (--quick: only step 1)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build -L 'cpu|gpu' --output-on-failure -j "$jobs"

if [ "${1:-}" = "--quick" ]; then exit 0; fi
probe=$(mktemp -d)
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cpp"
if ! command -v clang++ >/dev/null ||
   ! clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>/dev/null; then
  rm -rf "$probe"
  echo "clang++ with its sanitizer/libFuzzer runtime not found: skipping the sanitizer and fuzz build"
  echo "(scripts/install-deps.sh installs them where the distribution has them)"
  exit 0
fi
rm -rf "$probe"
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTWELL_CUDA=OFF \
  -DTWELL_FUZZ=ON -DTWELL_SANITIZE="address;undefined" -DTWELL_FUZZ_SECONDS="${TWELL_FUZZ_SECONDS:-30}" >/dev/null
cmake --build build-asan -j "$jobs"
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
  ctest --test-dir build-asan -L 'cpu|fuzz' --output-on-failure -j "$jobs"
