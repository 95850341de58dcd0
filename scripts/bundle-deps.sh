#!/usr/bin/env bash
# Copies the header-only dependencies (nlohmann-json, CLI11) and GoogleTest's sources from this
# machine's packages into third_party/ (git-ignored; CUTLASS is there already, from install-deps.sh), so that a machine without network access
# (a GPU box) can configure and build: carry third_party/ there; CMake uses it when the system
# packages are missing. Run scripts/install-deps.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf third_party/include third_party/googletest && mkdir -p third_party/include
cp -r /usr/include/nlohmann /usr/include/CLI third_party/include/
cp -r /usr/src/googletest third_party/googletest
du -sh third_party
