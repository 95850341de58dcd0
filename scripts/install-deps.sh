#!/usr/bin/env bash
# Installs what twell needs to build and test on Debian/Ubuntu. The CUDA toolkit (nvcc, CUDA 13)
# is optional: without it the CPU-only library, CLI and tests are built.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  cmake ninja-build g++ git python3 python3-pip python3-venv \
  libgtest-dev nlohmann-json3-dev libcli11-dev >/dev/null
# CMakeLists.txt needs CMake 3.24 (Debian 12 and Ubuntu 24.04 ship newer; older releases do not).
cmake_have=$(cmake --version | awk 'NR == 1 { print $3 }')
if [ "$(printf '%s\n' 3.24 "$cmake_have" | sort -V | head -n1)" != 3.24 ]; then
  echo "twell: CMake $cmake_have is older than the 3.24 twell needs; install a newer one first, e.g." \
    "python3 -m venv ~/cmake-venv && ~/cmake-venv/bin/pip install cmake && export PATH=~/cmake-venv/bin:\$PATH," \
    "then run this script again (without sudo, which resets PATH; as root, or it asks for sudo itself)" >&2
  exit 1
fi
# Optional: clang with its sanitizer and libFuzzer runtimes, for the sanitizer/fuzz build of
# scripts/test.sh (skipped, with a message, where they are missing).
$SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-dev >/dev/null 2>&1 ||
  echo "twell: clang's sanitizer runtime is not available here; scripts/test.sh will skip the sanitizer build"
# CUTLASS/CuTe headers for the CUDA build (header-only; the fused gate GEMM): PyPI's
# nvidia-cutlass wheel, unpacked into third_party/cutlass/include (git-ignored).
CUTLASS_VERSION=4.2.0.0
cutlass_dir="$(cd "$(dirname "$0")/.." && pwd)/third_party/cutlass"
if [ ! -f "$cutlass_dir/VERSION" ] || [ "$(cat "$cutlass_dir/VERSION")" != "$CUTLASS_VERSION" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "nvidia-cutlass==$CUTLASS_VERSION"
  rm -rf "$cutlass_dir" && mkdir -p "$cutlass_dir/include"
  python3 - "$tmp"/nvidia_cutlass-*.whl "$cutlass_dir/include" <<'PY'
import sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            z.extract(name, "/tmp/twell-cutlass-unpack")
import shutil
shutil.copytree("/tmp/twell-cutlass-unpack/" + prefix, sys.argv[2], dirs_exist_ok=True)
shutil.rmtree("/tmp/twell-cutlass-unpack")
PY
  echo "$CUTLASS_VERSION" >"$cutlass_dir/VERSION"
  rm -rf "$tmp"
fi
# cuDNN frontend headers (header-only; the prefill attention through cuDNN's fused SDPA, with
# libcudnn loaded at run time): PyPI's nvidia-cudnn-frontend, its include/ unpacked into
# third_party/cudnn_frontend/include (git-ignored). The backend headers (cudnn.h) come with the
# CUDA/cuDNN installation; without them the build uses twell's own attention kernels only.
CUDNN_FRONTEND_VERSION=1.32.0
fe_dir="$(cd "$(dirname "$0")/.." && pwd)/third_party/cudnn_frontend"
fetch_cudnn_frontend() {
  local tmp
  tmp=$(mktemp -d)
  # Any wheel holds the same headers: ask for one fixed platform, whatever this machine runs.
  python3 -m pip download --quiet --no-deps --disable-pip-version-check --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation cp -d "$tmp" \
    "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION" &&
    rm -rf "$fe_dir" && mkdir -p "$fe_dir" &&
    python3 - "$tmp"/nvidia_cudnn_frontend-*.whl "$fe_dir" <<'PY' &&
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.startswith("include/") and not name.endswith("/"):
            z.extract(name, sys.argv[2])
PY
    echo "$CUDNN_FRONTEND_VERSION" >"$fe_dir/VERSION"
  local status=$?
  rm -rf "$tmp"
  return $status
}
if [ ! -f "$fe_dir/VERSION" ] || [ "$(cat "$fe_dir/VERSION")" != "$CUDNN_FRONTEND_VERSION" ]; then
  # Optional: without it the build keeps twell's own prefill attention.
  fetch_cudnn_frontend ||
    echo "twell: could not fetch the cuDNN frontend headers; the CUDA build will use twell's own attention only"
fi
echo "twell: dependencies installed"
