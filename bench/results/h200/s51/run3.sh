#!/bin/bash
# Fifty-first session, third check: can the new one-token test fail? The GPU suite of this commit
# (head/) against a build of it whose one-token kernels copy their weights before waiting, as before
# the session's fix (early_reads/: `if (!a.early_weight_reads) wait_for_previous_grid();` made
# `if (false) ...` in ffn_gather.cu and decode_gemv.cu). Predicted: head passes, early_reads fails
# the test's calls after the writer kernel (stale weights: the bits of the other set).
# Then the Python tests on this commit's library (the C API's alignment check, the copy refusals).
# Binaries: out/head/{twell_gpu_tests,libtwell_c.so}, out/early_reads/twell_gpu_tests (stripped), in out/b11.tar.xz.
# (early_reads/: a worktree of this commit with third_party/ copied in, the two lines changed by
#  sed -i 's/  if (!a.early_weight_reads) wait_for_previous_grid();/  if (false) wait_for_previous_grid();/'
#  src/cuda/kernels/ffn_gather.cu src/cuda/kernels/decode_gemv.cu, then `ninja -C build tests/twell_gpu_tests`;
#  `tar cJf out/b11.tar.xz -C out head early_reads`.)
# On the device, with carry ["out"]: `bash bench/results/h200/s51/run3.sh`.
set -u
cd "$(dirname "$0")/../../../.."
tar xJf out/b11.tar.xz -C out
O=$OUT/s51_3; mkdir -p $O; cp "$0" $O/run.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
for b in head early_reads head early_reads; do
  timeout 60 out/$b/twell_gpu_tests --gtest_filter='*WeightsWrittenJustBeforeAreReadAsWritten*' >> $O/$b.log 2>&1
  echo "rc $?" >> $O/$b.log
done
grep -cE "Failure" $O/head.log $O/early_reads.log; grep -E "rc |PASSED|FAILED  \]" $O/*.log
PYTHONPATH=$PWD/python TWELL_LIBRARY=$PWD/out/head/libtwell_c.so timeout 90 /opt/torch/.venv/bin/python -m unittest \
  discover -s python/tests > $O/python_tests.log 2>&1; echo "rc $?" >> $O/python_tests.log
grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED|^rc" $O/python_tests.log
cd $OUT && tar cJf results.tar.xz s51_3 && rm -rf s51_3
