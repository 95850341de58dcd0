#!/bin/bash
# Session 39, call 6: is the gather FFN faster than the dense one for decode batches above 8 on the sparse
# model? twell bench model, decode batches 8 to 128, twell_gather records up to 128.
set -u
cd "$(dirname "$0")/.."
R=$PWD
tar xJf out/bins.tar.xz -C out
B=$R/out/new
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/gather_batches; mkdir -p $O
cp out/run162.sh $O/run.sh
$B/twell bench model --no-prefill --decode-batch 8,16,32,64,128 --gather-batches 128 --json $O/model.json > $O/model.txt 2>&1; echo "rc $?"; grep -E "model_decode|error" $O/model.txt | head -20
