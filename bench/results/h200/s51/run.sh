#!/bin/bash
# Fifty-first session's check: the fiftieth session's script (h200/s50/run.sh: its predictions are in
# docs/perf.md's fiftieth-session section) on this session's build, then an A/B of the one-token FFN:
# old = 27cfb7a (the decode FFN kernel and the dense path's GEMV copy their weights before waiting for the
# kernel ahead), new = this build (they wait first unless FfnOptions::early_weight_reads; the model sets
# it). Predicted: one-token calls +0 to +3 µs under --timing gpu (the kernel ahead is the stream holder,
# whose end the early copies could overlap only at its tail), +1 to +4 µs under --timing host, on calls
# of ~10-30 µs; the model's decode unchanged (it reads early as before).
# Binaries: out/b9.tar.xz (old) and out/b10.tar.xz (new), each a folder n2, built as h200/s47/run.sh says.
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s51/run.sh` (default 570).
set -u
cd "$(dirname "$0")/../../../.."
START=$(date +%s) TOTAL=${BUDGET:-570}
tar xJf out/b9.tar.xz -C out && rm -rf out/old && mv out/n2 out/old && tar xJf out/b10.tar.xz -C out
O=$OUT/s51; mkdir -p $O; cp "$0" $O/run.sh; cp out/n2/COMMIT $O/COMMIT_new; cp out/old/COMMIT $O/COMMIT_old
for b in old n2 old n2; do  # old, new, old, new
  for t in gpu host; do
    timeout 40 out/$b/twell bench ffn --backend cuda -M 1 -d 0.005,0.1,0.5 --distribution uniform --timing $t \
      --json $O/one_token_${b}_${t}_$(date +%s%N).json >> $O/one_token_${b}_${t}.txt 2>> $O/one_token_progress.log
    echo "rc $?" >> $O/one_token_${b}_${t}.txt
  done
done
grep -h "rc \|1 *|" $O/one_token_*.txt | head -40
(cd $OUT && tar cJf s51.tar.xz s51 && rm -rf s51)
# The fiftieth session's checks on the new build (its script unpacks out/b9.tar.xz: point it at b10);
# they leave $OUT/results.tar.xz.
cp out/b10.tar.xz out/b9.tar.xz
BUDGET=$(( TOTAL - ($(date +%s) - START) - 10 )) bash bench/results/h200/s50/run.sh
