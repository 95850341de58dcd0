#!/bin/bash
# Session 43: the batched next-token NLL with the KV cache on (the test's new block), and memcheck of it.
set -u
cd "$(dirname "$0")/.."
tar xJf out/b8.tar.xz -C out
B=$PWD/out/n2
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s43e; mkdir -p $O
cp "$0" $O/run.sh
{
$B/twell_gpu_tests --gtest_brief=1 --gtest_filter='LlamaCuda.NextTokenNllBatch*' 2>&1 | grep -E "FAILED|PASSED|Failure|Which is|Expected|test_llama" | head -20
compute-sanitizer --tool memcheck --print-limit 5 $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='LlamaCuda.NextTokenNllBatch*' 2>&1 | tail -3
} > $O/check.txt 2>&1; cat $O/check.txt
