#!/bin/bash
# Session 36, call 3: the Python tests after the no-token fix, and python/examples/train_l1.py
# (a sparse teacher) at three L1 strengths.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
O=$OUT/capi3; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf capi3.tar.xz capi3 && rm -rf capi3); }
trap finish EXIT
cp out/run134.sh $O/run.sh
PY=/opt/torch/.venv/bin/python
export TWELL_LIBRARY=$B/libtwell_c.so
ts python tests
timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; tail -22 $O/python_tests.log
for l1 in 3e-4 1e-3 3e-3; do
  ts train_l1 $l1
  timeout 90 $PY python/examples/train_l1.py --l1 $l1 --json $O/train_l1_$l1.json > $O/train_l1_$l1.txt 2>&1; echo "rc $?" >> $O/train_l1_$l1.txt; cat $O/train_l1_$l1.txt
done
ts done
