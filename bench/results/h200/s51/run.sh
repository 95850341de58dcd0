#!/bin/bash
# Fifty-first session's check: the fiftieth session's checks (h200/s50/run.sh, whose predictions are in
# docs/perf.md's fiftieth-session section), reordered so that the GPU suite runs first when device time is
# short, on this session's build; and an A/B of the one-token FFN: old = 27cfb7a (the decode FFN kernel and
# the dense path's GEMV copy their weights before waiting for the kernel ahead), new = this build (they
# wait first unless FfnOptions::early_weight_reads; the model sets it). Predicted: one-token calls +0 to
# +3 µs under --timing gpu, +1 to +4 µs under --timing host, on calls of ~10-30 µs; the model unchanged.
# Binaries: out/b9.tar.xz (old) and out/b10.tar.xz (new), each a folder n2, built as h200/s47/run.sh says.
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s51/run.sh` (default 560).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out && rm -rf out/old && mv out/n2 out/old && tar xJf out/b10.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s51; mkdir -p $O; cp "$0" $O/run.sh; cp $B/COMMIT $O/COMMIT; cp out/old/COMMIT $O/COMMIT_old
save() { (cd $OUT && tar cJf results.tar.xz s51); }  # after each step: a run cut short keeps what it did
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 170) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
for b in old n2 old n2; do  # old, new, old, new
  for t in gpu host; do
    timeout $(left 20) out/$b/twell bench ffn --backend cuda -M 1 -d 0.005,0.1,0.5 --distribution uniform --timing $t \
      --json $O/one_token_${b}_${t}_$(date +%s%N).json >> $O/one_token_${b}_${t}.txt 2>> $O/one_token_progress.log
    echo "rc $?" >> $O/one_token_${b}_${t}.txt
  done
done
grep -h "rc \|^ *1 " $O/one_token_*.txt | head -40; save
timeout $(left 150) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; cat $O/ffn.txt; save
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt; save
timeout $(left 90) $PY -m unittest discover -s python/tests > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head; save
timeout $(left 80) $B/twell bench ffn --backend cuda --train -M 16384 -M 131072 -d 0.005 --json $O/train.json \
  > $O/train.txt 2> $O/train_progress.log
echo "rc $?" >> $O/train.txt; cat $O/train.txt; save
rm -rf $O
