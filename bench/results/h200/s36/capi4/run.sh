#!/bin/bash
# Session 36, call 4: python/examples/train_l1.py
# (a dense original copied into the student, fp32 master weights) at three L1 strengths.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
O=$OUT/capi4; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf capi4.tar.xz capi4 && rm -rf capi4); }
trap finish EXIT
cp out/run135.sh $O/run.sh
PY=/opt/torch/.venv/bin/python
export TWELL_LIBRARY=$B/libtwell_c.so
for l1 in 1e-4 3e-4 1e-3; do
  ts train_l1 $l1
  timeout 90 $PY python/examples/train_l1.py --l1 $l1 --json $O/train_l1_$l1.json > $O/train_l1_$l1.txt 2>&1; echo "rc $?" >> $O/train_l1_$l1.txt; cat $O/train_l1_$l1.txt
done
ts done
