# Sourced by the device scripts of bench/results/*/sNN/ after `cd` to the repository root, with NAME (the
# results folder) and TAR (a tarball of head/: twell, twell_gpu_tests, libtwell_c.so, stripped, and
# COMMIT; bench/results/pack.sh makes one from a commit, or from a local build with --build) set.
# Gives: the binaries in $B, PyTorch's
# Python in $PY (the twell package and library on its paths, cuDNN on the loader's), the results
# folder $O under $OUT with COMMIT and gpu.txt, `save` (packs $O into $OUT/results.tar.xz; also run on
# exit), `left N` (N seconds, or what is left of BUDGET seconds, at least 5), and for A/Bs `unpack` and
# `decode` (below).
set -u
END=$(( $(date +%s) + ${BUDGET:-500} ))
left() { local l=$(( END - $(date +%s) )); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l : 5 )); }
tar xJf "$TAR" -C out
B=$PWD/out/head PY=/opt/torch/.venv/bin/python
export PYTHONPATH=$PWD/python TWELL_LIBRARY=$B/libtwell_c.so TWELL_REQUIRE_CUDNN=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib:${LD_LIBRARY_PATH:-}
O=$OUT/$NAME; mkdir -p $O; cp $B/COMMIT $O/COMMIT
save() { (cd $OUT && tar cJf results.tar.xz $NAME); }
trap 'save; rm -rf $O' EXIT
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $O/gpu.txt; cat $O/gpu.txt
# `unpack V TARBALL`: another build (pack.sh's tarball) as out/V, its COMMIT kept as $O/COMMIT_V, for an A/B.
unpack() {
  local d; d=$(mktemp -d -p out)
  tar xJf "$2" -C "$d" && mv "$d/head" "out/$1" && rmdir "$d" && cp "out/$1/COMMIT" "$O/COMMIT_$1"
}
# `decode NAME V BATCHES [ARGS...]`: out/V's `twell bench model` decode steps at BATCHES (e.g. 1,32,64), into
# $O/decode_NAME.{txt,json} (progress in decode_NAME_progress.log); prints its rows, each led by NAME.
decode() {
  local n=$1 v=$2 batches=$3; shift 3
  timeout $(left 60) out/$v/twell bench model --no-prefill --decode-batch $batches --gather-batches 1 "$@" \
    --json $O/decode_$n.json > $O/decode_$n.txt 2> $O/decode_${n}_progress.log
  echo "rc $?" >> $O/decode_$n.txt; grep -E "model_decode|^rc" $O/decode_$n.txt | awk -v n=$n '{print n, $0}'
}
