#!/bin/bash
# Session 36, call 10: scripts/gpu-check.sh --quick --only bench with the Python checks added
# (0317b07; binaries of 7d3593f, whose library and CLI are unchanged since).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
O=$OUT/gpu_check; mkdir -p $O
finish() { (cd $OUT && tar cJf gpu_check.tar.xz gpu_check && rm -rf gpu_check); }
trap finish EXIT
cp out/run141.sh $O/run.sh
timeout 400 scripts/gpu-check.sh $O/bench --bin $B --quick --only bench > $O/gpu_check.log 2>&1; echo "rc $?" >> $O/gpu_check.log
grep -E "^==|ffn_speed|tokens|rc " $O/gpu_check.log | head -30; head -4 $O/bench/python_ffn.txt
