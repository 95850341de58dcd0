#!/bin/bash
# Fifty-fourth session, on the session's review fixes (f163b35; the bench's records count every token set, a timed call
# that outlasts the hold retimes its case, model records' nnz_per_token_max, one median): the GPU suite, then `twell bench ffn`
# and `twell bench model`. Kernels unchanged since the thirty-ninth session: predicted within the H100 runs since the
# forty-eighth (0.59-0.62x at M = 131072, 0.64-0.67x at 16384, prefill 0.765-0.773x, 182-184 tokens/ms), and the M = 1
# rows' nnz/token nearer the asked 28.2 (the mean of 8 tokens, not one token's 41).
# Binaries (out/b20.tar.xz): head/ (twell, twell_gpu_tests of build-cuda, stripped, COMMIT).
# On the device, with carry ["out"]: `BUDGET=<seconds> bash bench/results/h200/s54/run.sh` (default 500).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-500} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b20.tar.xz -C out
B=$PWD/out/head
O=$OUT/s54_bench; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz s54_bench); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
timeout $(left 150) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30; save
timeout $(left 150) $B/twell bench ffn --backend cuda --json $O/ffn.json > $O/ffn.txt 2> $O/ffn_progress.log
echo "rc $?" >> $O/ffn.txt; grep -E "^(16384|131072) .*(0.50|1.00)% .* twell  |^rc" $O/ffn.txt; save
timeout $(left 200) $B/twell bench model --json $O/model.json > $O/model.txt 2> $O/model_progress.log
echo "rc $?" >> $O/model.txt; cat $O/model.txt
