#!/bin/bash
# Sixty-sixth session, first call: HEAD (f22bb8a: the few-token GEMM's deeper kernel only where the grid stays
# resident at 8 warps a block, the output projection; c25cfd8 and f22bb8a had not run on a GPU) = out/b66h.tar.xz,
# against A = out/b65m.tar.xz (fae9cb4, before the depth work, with the micro). The whole GPU suite, both
# micros, then on an H200 only (none lent since the forty-seventh session) the top table's benches: bench ffn
# at M = 16384 and 131072 (0.5% and 1%) and the 22-layer prefill.
# Predicted (micro "early", H100): the output projection ~4.8 / 5.3 / 5.8 µs at 2 / 8 / 16 tokens (the deep
# kernel's), QKV and gate A's (~10.1 / 9.3 µs at 2 tokens), not the deep kernel's 10.8 / 10.0.
# On the device, with carry ["out/b66h.tar.xz", "out/b65m.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s66/check.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s66_check} TAR=out/b66h.tar.xz
source bench/results/device_preamble.sh
unpack A out/b65m.tar.xz
timeout $(left 200) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1
echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A6 $O/gpu_tests.log | head -20; save
for v in head A; do
  timeout $(left 40) out/$v/twell_micro_few_token_gemm 2,8,16,32 > $O/micro_$v.txt 2>&1
  echo "rc $?" >> $O/micro_$v.txt; grep -E " early |^rc|WRONG" $O/micro_$v.txt | awk -v n=$v '{print n, $0}'
done; save
grep -q H200 $O/gpu.txt || exit 0
timeout $(left 200) $B/twell bench ffn -M 16384,131072 -d 0.005,0.01 --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E " twell |dense_cublas|^rc" $O/ffn.txt; save
timeout $(left 200) $B/twell bench model --no-decode --json $O/prefill.json > $O/prefill.txt 2> $O/prefill_progress.log
echo "rc $?" >> $O/prefill.txt; grep -E "model_prefill|^rc" $O/prefill.txt; save
