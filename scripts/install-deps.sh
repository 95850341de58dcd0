#!/usr/bin/env bash
# Installs what twell needs to build and test on Debian/Ubuntu. The CUDA toolkit (nvcc, CUDA 13)
# is optional: without it the CPU-only library, CLI and tests are built.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  cmake ninja-build g++ git python3 \
  libgtest-dev nlohmann-json3-dev libcli11-dev >/dev/null
# Optional: clang with its sanitizer and libFuzzer runtimes, for the sanitizer/fuzz build of
# scripts/test.sh (skipped, with a message, where they are missing).
$SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null 2>&1 ||
  echo "twell: clang's sanitizer runtime is not available here; scripts/test.sh will skip the sanitizer build"
echo "twell: dependencies installed"
