#!/bin/bash
# Session 37, call 4 (the sampler's buckets, 5b2e0b5): the sampler before (run 142's library: a full
# stable sort of the vocabulary each sampled token) and after (buckets of logits, an id-order draw):
# twell.Model's and `twell run`'s decode tokens/s on a random 4-layer model of the 2B widths, the
# micro-benchmark of Sampler::sample at 49152 ids (old and new), the Python tests.
set -u
cd "$(dirname "$0")/.."
R=$PWD
mkdir -p out/o && tar xJf out/bins_old.tar.xz -C out/o && tar xJf out/bins.tar.xz -C out
B=$R/out/new; BO=$R/out/o/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
PY=/opt/torch/.venv/bin/python
O=$OUT/sampler3; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf sampler3.tar.xz sampler3 && rm -rf sampler3); }
trap finish EXIT
cp out/run145.sh $O/run.sh; cp out/probe143.py $O/probe.py
M=/tmp/m4; TWELL_LIBRARY=$B/libtwell_c.so $PY -c "
import sys; sys.path.insert(0, 'python/examples'); sys.path.insert(0, 'python')
import model_speed; model_speed.write_random_model('$M', 4)" 2>&1 | tail -3
for lib in old new; do
  L=$B/libtwell_c.so; [ $lib = old ] && L=$BO/libtwell_c.so
  ts python $lib
  TWELL_LIBRARY=$L timeout 200 $PY out/probe143.py $M > $O/python_$lib.json 2> $O/python_$lib.err; cat $O/python_$lib.json; tail -2 $O/python_$lib.err
done
P=$($PY -c "print('ab' * 1023 + 'a')")
for lib in old new; do
  T=$B/twell; [ $lib = old ] && T=$BO/twell
  for s in "--temperature 0" "--temperature 0.8 --top-p 0.95 --seed 1"; do
    ts twell run $lib $s
    timeout 120 $T run $M --byte-tokenizer --device cuda -p "$P" -n 128 --no-stop $s > /dev/null 2>> $O/twell_run_$lib.err; tail -1 $O/twell_run_$lib.err
  done
done
ts micro
for v in old new; do b=out/sb2; [ $v = old ] && b=out/sb2_old; echo "$v:" >> $O/micro_sampler.txt; $b >> $O/micro_sampler.txt; done; cat $O/micro_sampler.txt
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head; grep -B2 -A25 "^ERROR:\|^FAIL:" $O/python_tests.log | head -60
ts done
