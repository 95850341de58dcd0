#!/bin/bash
# Session 33, call 3: scripts/gpu-check.sh --quick end to end with this build's binaries (--bin; the
# script's own build was checked in the twenty-sixth session): GPU tests, memcheck and racecheck
# subsets, the quick FFN benchmark, its energy cases, the 4-layer model benchmark and the decode
# timeline. Build 08011a8.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
O=$OUT/gpu_check; mkdir -p $O
finish() { (cd $OUT && tar cJf gpu_check.tar.xz gpu_check && rm -rf gpu_check); }
trap finish EXIT
cp out/run121.sh $O/run.sh
t0=$(date +%s)
timeout 560 scripts/gpu-check.sh $O --bin $R/out/new --quick > $O/stdout.txt 2>&1; echo "rc $? after $(( $(date +%s) - t0 )) s" >> $O/stdout.txt
tail -60 $O/stdout.txt
