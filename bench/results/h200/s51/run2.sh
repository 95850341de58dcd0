#!/bin/bash
# Fifty-first session, second check: is the training ratio's rise in s51/ (H100: 0.591x at 16384 against
# 0.562x in s48/review2/) the fiftieth session's --timing host change (the host now waits for the L2 flush
# before the timed call) or the board? The training bench of ec0f94e^ (old timing) and of this build (new),
# alternated twice on one GPU, 0.5% uniform at 16384 and 131072. Predicted in the fiftieth session: at
# most ~1% higher ratios with the new timing. Then compute-sanitizer memcheck and racecheck of the new
# one-token test.
# Binaries: out/b10.tar.xz (new, folder n2) and out/old_timing/twell.
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s51/run2.sh` (default 300).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-300} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b10.tar.xz -C out
O=$OUT/s51_2; mkdir -p $O; cp "$0" $O/run.sh; cp out/n2/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz s51_2); }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
for round in 1 2; do
  for b in old_timing/twell n2/twell; do
    tag=$(dirname $b)_$round
    timeout $(left 60) out/$b bench ffn --backend cuda --train -M 16384 -M 131072 -d 0.005 --distribution uniform \
      --json $O/train_$tag.json > $O/train_$tag.txt 2>> $O/train_progress.log
    echo "rc $?" >> $O/train_$tag.txt; grep -E "16384|131072|rc" $O/train_$tag.txt
  done
  save
done
for tool in memcheck racecheck; do
  timeout $(left 90) compute-sanitizer --tool $tool --error-exitcode 9 out/n2/twell_gpu_tests \
    --gtest_filter='*WeightsWrittenJustBeforeAreReadAsWritten*' > $O/$tool.log 2>&1
  echo "rc $?" >> $O/$tool.log; tail -4 $O/$tool.log; save
done
rm -rf $O
