#!/bin/bash
# Sixty-fifth session: the few-token GEMM with more chunks in flight a warp where its registers allow (4 at
# up to 8 tokens, 3 at 9-16, 2 above; before: 2 always), B = out/b65d.tar.xz, against A = out/b65m.tar.xz
# (HEAD's kernels, with the micro). B's few-token and model tests, then both micros and decode steps.
# Predicted (H100, micro "early"): the output projection 5.5 -> ~4.5 µs at 2-8 tokens (its warps' 4 chunks
# all loaded under the previous kernel), the QKV and gate -0.5 µs; decode steps of 2-16 sequences ~-0.1 ms.
# On the device, with carry ["out/b65d.tar.xz", "out/b65m.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s65/depth.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s65_depth} TAR=out/b65d.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/B; unpack A out/b65m.tar.xz
timeout $(left 60) out/B/twell_gpu_tests --gtest_filter='*FewToken*:*LlamaCuda*' > $O/tests_B.log 2>&1
echo "rc $?" >> $O/tests_B.log; tail -2 $O/tests_B.log; grep -E "FAILED|Failure" -A6 $O/tests_B.log | head -20; save
for v in B A; do
  timeout $(left 40) out/$v/twell_micro_few_token_gemm 2,8,16,32 > $O/micro_$v.txt 2>&1
  echo "rc $?" >> $O/micro_$v.txt; grep -E " early |^rc|WRONG" $O/micro_$v.txt | awk -v n=$v '{print n, $0}'
done; save
decode B B 2,8,16; decode A A 2,8,16; save
