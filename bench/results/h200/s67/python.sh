#!/bin/bash
# Sixty-seventh session, last call: HEAD 301f8f6 (the Python review fixes: generate's stop=None, prompts of one
# message / an int / None / a lone surrogate refused as TwellErrors, last_generation under the lock, ...; the
# tokenizer's 4-byte id index) = out/b67z.tar.xz. The Python tests with PyTorch and the GPU (ModelOnTheGpu, the
# torch FFN layer), then the tokenizer-loading C++ tests on the GPU machine. Predicted: all pass.
# On the device, with carry ["out/b67z.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s67/python.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s67_python} TAR=out/b67z.tar.xz
source bench/results/device_preamble.sh
timeout $(left 240) $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; tail -4 $O/python_tests.log; grep -E "^(FAIL|ERROR):" $O/python_tests.log | head; save
timeout $(left 100) $B/twell_gpu_tests --gtest_brief=1 --gtest_filter='CApiGpu*:*Tokenizer*:LlamaCuda.*Generat*' > $O/gpu_tests.log 2>&1
echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; save
