#!/bin/bash
# Session 46's device call: the checks pending since session 44 (bench/results/h200/s44/pending/run.sh: what
# each checks and the prediction for ffn_stats), in order of importance and within one deadline, on the build
# of 84ddeb3 (out/b9.tar.xz; no C++ changed since) with this session's Python (twell.FFN as custom operators,
# compiled on the GPU by the Python tests), and python/examples/train_sparse.py at its GPU defaults.
# Everything is tarred into one file at the end (the device returns at most eight). Run on the device with
# carry ["out"] after making out/b9.tar.xz as bench/results/h200/s44/pending/run.sh's header says (any later
# build will do while no C++ changes; BUDGET= the seconds the script may take, default 560).
set -u
cd "$(dirname "$0")/../../../.."
END=$(( $(date +%s) + ${BUDGET:-560} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf out/b9.tar.xz -C out
B=$PWD/out/n2 PY=/opt/torch/.venv/bin/python
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/s46; mkdir -p $O; cp "$0" $O/run.sh
timeout $(left 180) $B/twell_gpu_tests --gtest_brief=1 > $O/gpu_tests.log 2>&1; echo "rc $?" >> $O/gpu_tests.log
tail -3 $O/gpu_tests.log; grep -E "FAILED|Failure" -A8 $O/gpu_tests.log | head -30
TWELL_LIBRARY=$B/libtwell_c.so timeout $(left 240) $PY -m unittest discover -s python/tests -v > $O/python_tests.log 2>&1
echo "rc $?" >> $O/python_tests.log; grep -E "^(FAIL|ERROR)|^Ran|^OK|FAILED" $O/python_tests.log | head
TWELL_LIBRARY=$B/libtwell_c.so timeout $(left 150) $PY python/examples/train_sparse.py --out /tmp/train_out \
  > $O/train.txt 2>&1; echo "rc $?" >> $O/train.txt; grep -v "Writing model" $O/train.txt | tail -6
cp /tmp/train_out/train_log.json /tmp/train_out/train.png $O/ 2>/dev/null
timeout $(left 30) $B/generate > $O/generate_example.txt 2>&1; echo "rc $?" >> $O/generate_example.txt
tail -3 $O/generate_example.txt
timeout $(left 90) $B/twell bench model --no-decode --batch 8 --iters 3 --save /tmp/sp > $O/bench_model_save.txt 2>&1
echo "rc $?" >> $O/bench_model_save.txt; tail -3 $O/bench_model_save.txt
python3 -c "import random,sys; random.seed(1); sys.stdout.buffer.write(bytes(random.getrandbits(8) for _ in range(65536)))" \
  > /tmp/rand.bin
TWELL_LIBRARY=$B/libtwell_c.so timeout $(left 150) $PY - > $O/ffn_stats_py.txt 2>&1 <<'PY'
import time, twell
data = open("/tmp/rand.bin", "rb").read()
for mb in (1, 8):
    m = twell.Model("/tmp/sp", device="cuda", tokenizer="bytes", context=2048, max_batch=mb, kv_cache=False)
    for rep in range(3):
        t = time.time(); s = m.ffn_stats(data, context=2048); dt = time.time() - t
        print(f"max_batch {mb} run {rep}: {dt:.3f} s, layer 0 {s[0]['tokens']} tokens "
              f"{s[0]['nnz_per_token']:.3f} nnz/token, layer 37 {s[37]['nnz_per_token']:.3f}", flush=True)
    del m
PY
tail -7 $O/ffn_stats_py.txt
cd $OUT && tar cJf results.tar.xz s46 && rm -rf s46
