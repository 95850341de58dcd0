#!/bin/bash
# A/B on one GPU: the training step (forward + backward) of 68cbfaf (the session's start) against this
# session's build (ba038b3: the workspace region, use_workspace, the dW partial sums as scratch),
# alternated twice, M = 16384 and 131072 at 0.5% uniform. Binaries: out/old.tar.xz (old/twell) and
# out/b9.tar.xz (n2/twell). Prediction: the same times within noise (only where buffers sit changed).
set -u
cd "$(dirname "$0")/../../../.."
tar xJf out/b9.tar.xz -C out && tar xJf out/old.tar.xz -C out
O=$OUT/s48ab; mkdir -p $O; cp "$0" $O/run3.sh
for r in 1 2; do
  for v in old n2; do
    timeout 100 out/$v/twell bench ffn --backend cuda --train -M 16384 -M 131072 -d 0.005 --distribution uniform \
      --json $O/train_${v}_$r.json > $O/train_${v}_$r.txt 2>&1
    echo "== $v round $r rc $?"; grep -E "^(16384|131072) .*(dense_cublas|twell ) " $O/train_${v}_$r.txt
  done
done
# and the last tidy's tests (expect_same_grads; Python's _GpuRunner)
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$PWD/out/n2/libtwell_c.so
timeout 120 out/n2/twell_gpu_tests --gtest_brief=1 --gtest_filter='*FfnBackward*:*UseWorkspace*:*PathsTakenInTurn*' \
  > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log
timeout 150 /opt/torch/.venv/bin/python -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; tail -3 $O/python_tests.log
cd $OUT && tar cJf results.tar.xz s48ab && rm -rf s48ab
