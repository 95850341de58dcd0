#!/bin/bash
# Session 36, call 5: python/examples/train_l1.py
# (a dense original copied into the student): a grid of learning rates and L1 strengths, 300 steps each.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
O=$OUT/capi5; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf capi5.tar.xz capi5 && rm -rf capi5); }
trap finish EXIT
cp out/run136.sh $O/run.sh
PY=/opt/torch/.venv/bin/python
export TWELL_LIBRARY=$B/libtwell_c.so
for lr in 3e-4 1e-3; do for l1 in 3e-5 1e-4 3e-4; do
  ts train_l1 lr $lr l1 $l1
  timeout 60 $PY python/examples/train_l1.py --lr $lr --l1 $l1 --log-every 50 --json $O/train_l1_${lr}_$l1.json > $O/train_l1_${lr}_$l1.txt 2>&1; echo "rc $?" >> $O/train_l1_${lr}_$l1.txt; cat $O/train_l1_${lr}_$l1.txt
done; done
ts done
