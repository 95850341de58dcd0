#!/bin/bash
# Session 38, call 7 (the sampler kernel's row passes through one helper, 14ec388: PTX the same up to register
# names): the DeviceSampler tests and the LlamaCuda tests.
set -u
cd "$(dirname "$0")/.."
tar xJf out/bins.tar.xz -C out
O=$OUT/helper; mkdir -p $O
cp out/run154.sh $O/run.sh
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
out/new/twell_gpu_tests --gtest_filter='DeviceSampler*:LlamaCuda*' --gtest_brief=1 > $O/tests.log 2>&1; echo "rc $?" >> $O/tests.log
grep -E "rows drawn|PASSED|FAILED|rc " $O/tests.log
