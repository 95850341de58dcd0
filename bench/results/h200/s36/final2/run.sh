#!/bin/bash
# Session 36, call 7: the Python tests after twell.FFN moved to the package's level (pickling), db618f5.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/final2; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf final2.tar.xz final2 && rm -rf final2); }
trap finish EXIT
cp out/run138.sh $O/run.sh
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 /opt/torch/.venv/bin/python -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log; grep -B2 -A25 "^ERROR:\|^FAIL:" $O/python_tests.log | head -60
ts done
