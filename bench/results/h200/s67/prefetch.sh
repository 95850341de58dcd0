#!/bin/bash
# Sixty-seventh session, second call: the decode step's L2 prefetch narrowed (first.sh: with the output
# projection's, the gate's and then the up's or the next QKV's 31 MB a layer, a batch-1 twell step 1.41 ->
# 1.67-1.70 ms; the prefetch kernel 11-15 µs, the decode FFN 12 -> 18 µs beside it). Now 1 = the output
# projection's 8 MB only, during the attention (~9 µs, DRAM idle), from ≤ 32 blocks; 2 = that and the gate's.
# out/b67p.tar.xz (HEAD, with twell_ktrace). The bits test, then batches 1 and 2 alternating 1, 0, 2, 0, 1;
# a ktrace of a batch-1 step with 1.
# Predicted: with 1, the O GEMV reads from L2 (~9.5 -> ~5 µs a layer): batch 1 ~1.41 -> ~1.25 ms (twell),
# 2.27 -> ~2.1 (dense) if the prefetch kernel stays off the attention's and the QKV GEMV's way; else even.
# On the device, with carry ["out/b67p.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s67/prefetch.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s67_prefetch} TAR=out/b67p.tar.xz
source bench/results/device_preamble.sh
timeout $(left 60) $B/twell_gpu_tests --gtest_filter='LlamaCuda.L2Prefetch*' > $O/tests.log 2>&1
echo "rc $?" >> $O/tests.log; tail -3 $O/tests.log; save
for r in 1 0 2 0_2 1_2; do
  decode p$r head 1,2 --decode-l2-prefetch ${r%_2}; save
done
CUDA_INJECTION64_PATH=$B/libtwell_ktrace.so TWELL_KTRACE_OUT=$O/trace1_p1.tsv timeout $(left 60) \
  $B/twell bench model --no-prefill --decode-batch 1 --gather-batches 1 --decode-l2-prefetch 1 > $O/trace1_p1.txt 2>&1
echo "rc $?" >> $O/trace1_p1.txt; tail -2 $O/trace1_p1.txt
timeout $(left 60) $PY scripts/ktrace.py $O/trace1_p1.tsv --window 12 > $O/trace1_p1_summary.txt 2>&1
sed -n '/graph 5/,$p' $O/trace1_p1_summary.txt | head -24; rm -f $O/trace1_p1.tsv; save
