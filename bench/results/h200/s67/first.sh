#!/bin/bash
# Sixty-seventh session, first call: HEAD (7a57aac: the per-line L2 prefetch kernel and the ffn_gathers
# refactor, neither run on a GPU) = out/b67h.tar.xz (with twell_ktrace). The whole GPU suite; then the decode
# step's L2 prefetch A/B (s66/prefetch2.sh's question): batches 1 and 2 alternating --decode-l2-prefetch
# 2, 0, 1, 0, 2; a ktrace of a batch-1 step with 2. On an H200 only, the top table's benches after it.
# Predicted: suite 213/213. Prefetch: if the copy engines the bulk prefetches held were the only cost,
# batch 1 below 1.41 ms (twell) and 2.27 (dense) with 2; if the L2 cannot keep the prefetched lines until
# the GEMVs read them, even or slower (the prefetch kernel's blocks still compete for SM slots).
# On the device, with carry ["out/b67h.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s67/first.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s67_first} TAR=out/b67h.tar.xz
source bench/results/device_preamble.sh
timeout $(left 200) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1
echo "rc $?" >> $O/gpu_tests.log; tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A6 $O/gpu_tests.log | head -20; save
for r in 2 0 1 0_2 2_2; do
  decode p$r head 1,2 --decode-l2-prefetch ${r%_2}; save
done
CUDA_INJECTION64_PATH=$B/libtwell_ktrace.so TWELL_KTRACE_OUT=$O/trace1_p2.tsv timeout $(left 60) \
  $B/twell bench model --no-prefill --decode-batch 1 --gather-batches 1 --decode-l2-prefetch 2 > $O/trace1_p2.txt 2>&1
echo "rc $?" >> $O/trace1_p2.txt; tail -2 $O/trace1_p2.txt
timeout $(left 60) $PY scripts/ktrace.py $O/trace1_p2.tsv --window 12 > $O/trace1_p2_summary.txt 2>&1
head -30 $O/trace1_p2_summary.txt; rm -f $O/trace1_p2.tsv; save
grep -q H200 $O/gpu.txt || exit 0
timeout $(left 200) $B/twell bench ffn -M 16384,131072 -d 0.005,0.01 --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E " twell |dense_cublas|^rc" $O/ffn.txt; save
