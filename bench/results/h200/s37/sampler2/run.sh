#!/bin/bash
# Session 37, call 3: the sampler before (run 142's library: a full stable sort of the vocabulary each
# sampled token, doubles through an element call each) and after (the review-fixed quickselect, id-order draw), with the micro-benchmark of Sampler::sample at 49152 ids (old and new), the Python tests, model_speed.py, twell_tests and the GPU suite: decode
# tokens/s of twell.Model and of `twell run` on a random 4-layer model of the 2B widths.
set -u
cd "$(dirname "$0")/.."
R=$PWD
mkdir -p out/o && tar xJf out/bins_old.tar.xz -C out/o && tar xJf out/bins.tar.xz -C out
B=$R/out/new; BO=$R/out/o/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
PY=/opt/torch/.venv/bin/python
O=$OUT/sampler2; mkdir -p $O
t0=$(date +%s)
ts() { echo "== $(( $(date +%s) - t0 ))s $*"; }
finish() { (cd $OUT && tar cJf sampler2.tar.xz sampler2 && rm -rf sampler2); }
trap finish EXIT
cp out/run144.sh $O/run.sh; cp out/probe143.py $O/probe.py
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
ts model_speed with fp32 reference
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY python/examples/model_speed.py --model $M --json $O/model_speed.json > $O/model_speed.txt 2>&1; echo "rc $?" >> $O/model_speed.txt; tail -14 $O/model_speed.txt
ts micro
for v in old new; do b=out/sb2; [ $v = old ] && b=out/sb2_old; echo "$v:" >> $O/micro_sampler.txt; $b >> $O/micro_sampler.txt; done; cat $O/micro_sampler.txt
ts python tests
TWELL_LIBRARY=$B/libtwell_c.so timeout 300 $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log; grep -E "ERROR|FAIL|^Ran|^OK|rc " $O/python_tests.log | head; grep -B2 -A25 "^ERROR:\|^FAIL:" $O/python_tests.log | head -60
ts gpu suite
$B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; rc=$?; echo "rc $rc" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -B3 -A12 "Failure" $O/gpu_tests.log | head -40
ts twell_tests
mkdir -p /work && ln -sfn $R /work/main; mkdir -p build-cuda && cp $B/twell build-cuda/twell
$B/twell_tests --gtest_brief=1 > $O/twell_tests_gpu.log 2>&1; echo "rc $?" >> $O/twell_tests_gpu.log; tail -3 $O/twell_tests_gpu.log; grep -B3 -A12 "Failure" $O/twell_tests_gpu.log | head -30
ts done
