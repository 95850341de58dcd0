#!/bin/bash
# Forty-ninth session: where a decode step's time goes at batch 16, 64 and 256 (context 512), both
# models, traced by ktrace (CUPTI, inside the replayed graphs). The bytes a step must read set its
# floor: the weights once (4.1 GB) and the KV cache (8 KB a token a layer: 10.5 GB at batch 64).
# Prediction (H200 s10: batch 64 6.17 ms a step, H100 s49: 7.6 ms): the floor at ~4.3 TB/s (H200) is
# ~3.4 ms; the gap is in kernels far from the bandwidth at M = 64 (the projections' GEMMs) or the
# attention's, which the trace names.
# Binaries: out/b9.tar.xz as in s49/run.sh, plus out/n2/libtwell_ktrace.so.
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-400} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s49d; mkdir -p $O; cp "$0" $O/; cp $B/COMMIT $O/
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 200) env CUDA_INJECTION64_PATH=$B/libtwell_ktrace.so TWELL_KTRACE_OUT=$O/t.tsv \
  $B/twell bench model --no-prefill --decode-batch 16,64,256 --gather-batches 1 --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
$PY scripts/ktrace.py $O/t.tsv --window 24 > $O/ktrace.txt 2>&1; echo "rc $?" >> $O/ktrace.txt; head -150 $O/ktrace.txt
xz -9 $O/t.tsv
cd $OUT && tar cJf decode64.tar.xz s49d && rm -rf s49d
