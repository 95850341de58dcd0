#!/bin/bash
# Session 36, call 8: the Python tests with twell.replace_hf_mlps (b3185c6).
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
export TWELL_REQUIRE_CUDNN=1
O=$OUT/final3; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf final3.tar.xz final3 && rm -rf final3); }
trap finish EXIT
cp out/run139.sh $O/run.sh
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 /opt/torch/.venv/bin/python -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log; grep -B2 -A25 "^ERROR:\|^FAIL:" $O/python_tests.log | head -60
ts done
