#!/bin/bash
# Sixty-fifth session: the KV caches head-major ([B, nkv, max_context, hd], kv_cache_index), B =
# out/b65l.tar.xz, against A = out/b65h.tar.xz (fcc2427: [B, max_context, nkv·hd], a head's key 128 bytes
# every 4 KB). B's full GPU suite first, then decode steps and the 64 × 2048 prefill of both, B then A,
# ncu of B's decode attention at 32 sequences, and a second pair of decode runs.
# Predicted (H100): the decode attention at 32 sequences 55.3 -> ~46 µs (74% -> ~88% of DRAM bandwidth),
# the twell step 4.60 -> ~4.25 ms, the dense step alike; at 64 about -0.6 ms; batch 1 within noise; the
# prefill even (cuDNN and the flash kernel read whole 64-key tiles either way).
# On the device, with carry ["out/b65l.tar.xz", "out/b65h.tar.xz"]: `BUDGET=<s> bash bench/results/h200/s65/layout.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s65_layout} TAR=out/b65l.tar.xz
source bench/results/device_preamble.sh
mv $B $PWD/out/B; unpack A out/b65h.tar.xz
timeout $(left 200) out/B/twell_gpu_tests > $O/tests_B.log 2>&1
echo "rc $?" >> $O/tests_B.log; tail -3 $O/tests_B.log; grep -E "FAILED|Failure" -A6 $O/tests_B.log | head -20; save
decode B B 1,16,32,64; decode A A 1,16,32,64; save
for v in B A; do
  timeout $(left 150) out/$v/twell bench model --no-decode --json $O/prefill_$v.json > $O/prefill_$v.txt \
    2> $O/prefill_${v}_progress.log
  echo "rc $?" >> $O/prefill_$v.txt; grep -E "model_prefill|^rc" $O/prefill_$v.txt | awk -v n=$v '{print n, $0}'; save
done
timeout $(left 70) ncu --set full --kernel-name regex:decode_attention --launch-skip 400 --launch-count 1 \
  -o $O/attn32 out/B/twell bench model --no-prefill --decode-batch 32 --gather-batches 1 > $O/attn32.log 2>&1
echo "rc $?" >> $O/attn32.log; ncu --import $O/attn32.ncu-rep --page details > $O/attn32.txt 2>&1
grep -E "^  [a-z_]|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Waves" $O/attn32.txt | head -8
rm -f $O/attn32.ncu-rep; save
decode B_2 B 1,16,32,64; decode A_2 A 1,16,32,64; save
