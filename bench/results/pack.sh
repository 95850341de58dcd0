#!/usr/bin/env bash
# Makes the tarball a device script unpacks (device_preamble.sh's TAR) from one commit's build:
#   bench/results/pack.sh COMMIT OUT.tar.xz [EXTRA_TARGET ...]
#   bench/results/pack.sh --build DIR OUT.tar.xz [EXTRA_TARGET ...]
# e.g. `bench/results/pack.sh 083ed3a out/b61a.tar.xz twell_micro_turn_attention`.
# With a COMMIT, it is built in its own worktree (/tmp/twell-pack-<commit>, kept for the next call;
# its third_party/ is this checkout's, so run scripts/install-deps.sh first) as a Release CUDA build
# (~10 minutes from scratch on two cores). With --build, DIR (a Release CUDA build of this checkout,
# e.g. build-cuda) is brought up to date and packed as it is: COMMIT is then HEAD, with "-dirty"
# where the tree has uncommitted changes. head/ in the tarball holds twell, twell_gpu_tests,
# libtwell_c.so and the extra targets (libraries too, e.g. twell_ktrace), stripped, and COMMIT.
set -euo pipefail
if [ $# -lt 2 ] || { [ "$1" = --build ] && [ $# -lt 3 ]; }; then
  echo "usage: $0 COMMIT OUT.tar.xz [EXTRA_TARGET ...] | $0 --build DIR OUT.tar.xz [EXTRA_TARGET ...]" >&2
  exit 2
fi
cd "$(dirname "$0")/../.."
root=$PWD
if [ "$1" = --build ]; then
  build=$(realpath "$2")
  grep -q "CMAKE_BUILD_TYPE:STRING=Release" "$build/CMakeCache.txt" || { echo "$build is not a Release build" >&2; exit 1; }
  commit=$(git rev-parse HEAD)$(git diff --quiet HEAD -- || echo -dirty)
  out=$(realpath -m "$3")
  shift 3
else
  commit=$(git rev-parse --verify "$1^{commit}")
  out=$(realpath -m "$2")
  shift 2
  [ -d third_party/cutlass/include ] || { echo "third_party/cutlass is missing: run scripts/install-deps.sh" >&2; exit 1; }
  wt=/tmp/twell-pack-${commit:0:12}
  if [ ! -d "$wt" ]; then
    git worktree prune  # entries of worktrees whose folders are gone (/tmp cleared)
    git worktree add --detach "$wt" "$commit" >/dev/null
  fi
  [ -e "$wt/third_party" ] || ln -s "$root/third_party" "$wt/third_party"
  cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  build=$wt/build
fi
cmake --build "$build" --target twell twell_gpu_tests twell_c "$@"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/head"
cp -L "$build/twell" "$build/tests/twell_gpu_tests" "$build/libtwell_c.so" "$stage/head/"
for t in "$@"; do
  f=$(find "$build" -maxdepth 2 -type f \( -name "$t" -o -name "lib$t.so" \) -perm -u+x | head -1)
  [ -n "$f" ] || { echo "no executable or library $t in $build" >&2; exit 1; }
  cp "$f" "$stage/head/"
done
strip "$stage"/head/*
echo "$commit" > "$stage/head/COMMIT"
mkdir -p "$(dirname "$out")"
tar cJf "$out" -C "$stage" head
echo "$out: $(ls "$stage/head" | paste -sd ' ') ($(du -h "$out" | cut -f1))"
