#!/bin/bash
# Fifty-second session, second check (not run: the session's device time went on failed starts): can the
# one-token test fail now? Its first form could not: in `h100/s52/` it passed on the build with the old early
# weight reads too. The one-token kernels read only Wg's rows before waiting, and the test wrote the three
# weights with three kernels, of which only the last (Wd) could still be running when the FFN started.
# The test now writes all three in one kernel, Wg last, after ~100 µs. Predicted: head passes; early_reads
# fails its calls with early = false (every one: Wg stale for the whole of the early copies).
# Binaries (out/b13.tar.xz): head/twell_gpu_tests of this commit; early_reads/twell_gpu_tests of a worktree
# of this commit with third_party/ copied and
#   sed -i 's/  if (!a.early_weight_reads) wait_for_previous_grid();/  if (false) wait_for_previous_grid();/' \
#     src/cuda/kernels/ffn_gather.cu src/cuda/kernels/decode_gemv.cu
# then `cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && ninja -C build tests/twell_gpu_tests`;
# both stripped, `tar cJf out/b13.tar.xz -C out head early_reads`.
# On the device, with carry ["out"]: `bash bench/results/h200/s52/run2.sh`.
set -u
cd "$(dirname "$0")/../../../.."
tar xJf out/b13.tar.xz -C out
O=$OUT/s52_2; mkdir -p $O; cp "$0" $O/run.sh
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
for b in head early_reads; do
  timeout 120 out/$b/twell_gpu_tests --gtest_filter='*WeightsWrittenJustBeforeAreReadAsWritten*' > $O/$b.log 2>&1
  echo "rc $?" >> $O/$b.log
done
grep -c "Failure" $O/head.log $O/early_reads.log; grep -E "^rc |PASSED|FAILED  \]" $O/*.log
timeout 300 compute-sanitizer --tool memcheck out/head/twell_gpu_tests \
  --gtest_filter='*WeightsWrittenJustBeforeAreReadAsWritten*:*MaxClusterBlocks*:*NoBackupUnpacksAsZeros*' \
  > $O/memcheck.log 2>&1; echo "rc $?" >> $O/memcheck.log; tail -4 $O/memcheck.log
cd $OUT && tar cJf results.tar.xz s52_2 && rm -rf s52_2
