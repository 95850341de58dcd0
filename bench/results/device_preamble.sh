# Sourced by the device scripts of bench/results/*/sNN/ after `cd` to the repository root, with NAME (the
# results folder) and TAR (a tarball of head/: twell, twell_gpu_tests, libtwell_c.so, stripped, and
# COMMIT; bench/results/pack.sh makes one from a commit, or from a local build with --build) set.
# Gives: the binaries in $B, PyTorch's
# Python in $PY (the twell package and library on its paths, cuDNN on the loader's), the results
# folder $O under $OUT with COMMIT and gpu.txt, `save` (packs $O into $OUT/results.tar.xz; also run on
# exit) and `left N` (N seconds, or what is left of BUDGET seconds, at least 5).
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
