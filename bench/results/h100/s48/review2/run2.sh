#!/bin/bash
# The second review's fixes (the dW partial sums as scratch, deferred handle destruction): every
# *FfnBackward* GPU test and CApiGpu, the Python tests, one training step's timing (bench ffn --train,
# M = 16384 and 131072 at 0.5%), with the binaries of out/b9.tar.xz (twell, twell_gpu_tests, libtwell_c.so).
set -u
cd "$(dirname "$0")/../../../.."
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
O=$OUT/s48b; mkdir -p $O; cp "$0" $O/run2.sh; cp $B/COMMIT $O/
timeout 150 $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='*FfnBackward*:CApiGpu.*:*UseWorkspace*' > $O/gpu_tests.log 2>&1
echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log
timeout 150 $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log
tail -3 $O/python_tests.log
timeout 120 $B/twell bench ffn --backend cuda --train -M 16384 -M 131072 -d 0.005 --json $O/ffn_train.json > $O/ffn_train.txt 2>&1
echo "rc $?" >> $O/ffn_train.txt; cat $O/ffn_train.txt
cd $OUT && tar cJf results.tar.xz s48b && rm -rf s48b
