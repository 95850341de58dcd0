#!/bin/bash
# Sixty-sixth session: decode steps asking the L2 for their weights ahead (LlamaCudaOptions::decode_l2_prefetch,
# a side stream in the step's graph): 2 = once the QKV projection is done the output projection's and the
# gate's weights (31 MB at the 2B shape), once the output projection is done the dense FFN's up or the
# next layer's QKV; 1 = the first only; 0 = none (before). One build, out/b66p.tar.xz: the model and decode
# tests, then `bench model` decode steps alternated 2, 0, 1, 2, 0, then ktrace of a batch-1 step with 2 and 0.
# Predicted (H100, twell at batch 1, 1.42 ms a step: 2.36 GB of weights in it, 0.7 ms at DRAM speed): the
# gate read from L2 by the decode FFN and the O projection's weights partly so, ~-4 µs a layer, the next
# QKV ~-2: 1.42 -> ~1.2 ms; dense 2.28 -> ~2.1 ms (gate and up); at 32 sequences, where the attention
# streams 134 MB of keys a layer, little or nothing.
# On the device, with carry ["out/b66p.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s66/prefetch.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s66_prefetch} TAR=out/b66p.tar.xz
source bench/results/device_preamble.sh
mv $B out/P
timeout $(left 120) out/P/twell_gpu_tests --gtest_brief=1 --gtest_filter='*LlamaCuda*:*Decode*:*FewToken*' > $O/tests.log 2>&1
echo "rc $?" >> $O/tests.log; tail -3 $O/tests.log; grep -E "FAILED|Failure" -A6 $O/tests.log | head -20; save
for r in 2 0 1 2_2 0_2; do
  decode p$r P 1,2,8,32 --decode-l2-prefetch ${r%_2}; save
done
for r in 2 0; do
  CUDA_INJECTION64_PATH=out/P/libtwell_ktrace.so TWELL_KTRACE_OUT=$O/trace1_p$r.tsv timeout $(left 60) \
    out/P/twell bench model --no-prefill --decode-batch 1 --gather-batches 1 --decode-l2-prefetch $r > $O/trace1_p$r.txt 2>&1
  echo "rc $?" >> $O/trace1_p$r.txt; tail -2 $O/trace1_p$r.txt
  timeout $(left 60) $PY scripts/ktrace.py $O/trace1_p$r.tsv --window 12 > $O/trace1_p${r}_summary.txt 2>&1
  head -40 $O/trace1_p${r}_summary.txt; xz -9 $O/trace1_p$r.tsv; save
done
