#!/bin/bash
# Session 38, call 9 (c0b1c1f: SamplingOptions::drawable and the sampler's staging helper, host code only;
# the kernel unchanged): the DeviceSampler and LlamaCuda tests.
set -u
cd "$(dirname "$0")/.."
tar xJf out/bins.tar.xz -C out
O=$OUT/review; mkdir -p $O
cp out/run156.sh $O/run.sh
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
out/new/twell_gpu_tests --gtest_filter='DeviceSampler*:LlamaCuda*' --gtest_brief=1 > $O/tests.log 2>&1; echo "rc $?" >> $O/tests.log
grep -E "rows drawn|PASSED|FAILED|Failure|rc " -A3 $O/tests.log | head -30
