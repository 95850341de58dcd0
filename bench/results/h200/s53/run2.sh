#!/bin/bash
# Fifty-third session, second check, on 289555c's build: the one-token test's writer now waits for the host's word
# that forward() is enqueued (a page-locked flag) and ~50 us more before writing the weights (in s53/ the build
# with the old early weight reads failed it in one run of two); max_cluster_blocks asks past 8 blocks only for a
# kernel allowed non-portable clusters. Predicted: the GPU suite 197/197 (MaxClusterBlocksIsWhatTheDeviceRuns
# still 16 for decode attention's kind of kernel, 8 for the other); head passes the one-token test three runs of
# three; early_reads (this commit with `if (false) wait_for_previous_grid();` in ffn_gather.cu and
# decode_gemv.cu, as s52/run2.sh says) fails it three of three, every call with early = false; memcheck of
# the fifty-second session's new tests 0 errors (16 before: the failing cluster-size queries).
# Binaries (out/b15.tar.xz): head/twell_gpu_tests, early_reads/twell_gpu_tests, stripped.
# On the device, with carry ["out"]: `bash bench/results/h200/s53/run2.sh`.
set -u
cd "$(dirname "$0")/../../../.."
tar xJf out/b15.tar.xz -C out
O=$OUT/s53_2; mkdir -p $O; cp out/head/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz s53_2); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt
T='*WeightsWrittenJustBeforeAreReadAsWritten*'
for b in head early_reads head early_reads head early_reads; do
  timeout 60 out/$b/twell_gpu_tests --gtest_filter="$T" >> $O/one_token_$b.log 2>&1; echo "rc $?" >> $O/one_token_$b.log
done
grep -c "Failure" $O/one_token_*.log; grep -E "^rc " $O/one_token_*.log; save
timeout 150 compute-sanitizer --tool memcheck out/head/twell_gpu_tests \
  --gtest_filter="$T:*MaxClusterBlocks*:*NoBackupUnpacksAsZeros*:*NeedsASparseForward*" > $O/memcheck.log 2>&1
echo "rc $?" >> $O/memcheck.log; tail -4 $O/memcheck.log; save
timeout 200 out/head/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
