#!/bin/bash
# Sixty-sixth session, second run of the decode steps' L2 prefetch (prefetch.sh: with bulk prefetches,
# cp.async.bulk.prefetch.L2, a batch-1 step went 1.41 -> 2.57 ms, the decode GEMV 12 -> 23 µs: the copy
# engines held). Now every 128-byte line a prefetch.global.L2 from 132 blocks of 256 threads (out/b66q.tar.xz).
# Decode steps of 1 and 2 sequences alternated --decode-l2-prefetch 2, 0, 2, 0, then ktrace of a batch-1 step with 2.
# Predicted: if the copy engines were the only cost, batch 1 below 1.41 ms (twell) and 2.27 (dense); if
# the L2 cannot keep 31 MB of prefetched lines until they are read (the GEMVs' streaming loads), even or slower.
# On the device, with carry ["out/b66q.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s66/prefetch2.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s66_prefetch2} TAR=out/b66q.tar.xz
source bench/results/device_preamble.sh
mv $B out/P
for r in 2 0 2_2 0_2; do
  decode p$r P 1,2 --decode-l2-prefetch ${r%_2}; save
done
CUDA_INJECTION64_PATH=out/P/libtwell_ktrace.so TWELL_KTRACE_OUT=$O/trace1_p2.tsv timeout $(left 60) \
  out/P/twell bench model --no-prefill --decode-batch 1 --gather-batches 1 --decode-l2-prefetch 2 > $O/trace1_p2.txt 2>&1
echo "rc $?" >> $O/trace1_p2.txt; tail -2 $O/trace1_p2.txt
timeout $(left 60) $PY scripts/ktrace.py $O/trace1_p2.tsv --window 12 > $O/trace1_p2_summary.txt 2>&1
head -40 $O/trace1_p2_summary.txt; rm -f $O/trace1_p2.tsv; save
