#!/bin/bash
# Session 33, call 4: scripts/gpu-check.sh --quick --only bench (b240240) with this build's
# binaries: the benchmark half that call 3 (gpu_check/, tests and sanitizers passed) ran out of time
# in. Binaries of 08011a8 (the script change since touches no binary).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
O=$OUT/gpu_check_bench; mkdir -p $O
finish() { (cd $OUT && tar cJf gpu_check_bench.tar.xz gpu_check_bench && rm -rf gpu_check_bench); }
trap finish EXIT
cp out/run122.sh $O/run.sh
t0=$(date +%s)
timeout 500 scripts/gpu-check.sh $O --bin $R/out/new --quick --only bench > $O/stdout.txt 2>&1; echo "rc $? after $(( $(date +%s) - t0 )) s" >> $O/stdout.txt
tail -60 $O/stdout.txt
