#!/bin/bash
# Session 46's one device call: the pending checks of sessions 44-45 (bench/results/h200/s44/pending/run.sh,
# on the build of 84ddeb3 carried as out/b9.tar.xz; it also runs this session's Python tests, among them
# twell.FFN compiled by torch.compile on the GPU), then python/examples/train_sparse.py at its GPU defaults.
# Everything is tarred into one file (the device returns at most eight).
set -u
cd "$(dirname "$0")/../../../.."
bash bench/results/h200/s44/pending/run.sh
O=$OUT/s46; mkdir -p $O; cp "$0" $O/run.sh
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
/opt/torch/.venv/bin/python -c "import transformers" 2>/dev/null || echo "no transformers on the device" > $O/train.txt
TWELL_LIBRARY=$PWD/out/n2/libtwell_c.so timeout 240 /opt/torch/.venv/bin/python python/examples/train_sparse.py \
  --out /tmp/train_out >> $O/train.txt 2>&1; echo "rc $?" >> $O/train.txt; tail -8 $O/train.txt
cp /tmp/train_out/train_log.json /tmp/train_out/train.png $O/ 2>/dev/null
cd $OUT && tar cJf results.tar.xz s44 s46 && rm -rf s44 s46
