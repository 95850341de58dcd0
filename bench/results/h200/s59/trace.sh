#!/bin/bash
# Fifty-ninth session: where a conversation's turn of 21 tokens after 4096 cached goes (`twell bench model
# --turn 21`: 4.7 ms on an H100 for dense, 4.25 for twell, and nearly flat from 21 to 128 tokens, 4.7 to
# 5.25 ms, in `s59/`). Predicted: the GPU waits for the host's launches (~10 a layer, 380 a turn): the
# kernels' own time ~1.5-2 ms, the rest gaps. ktrace (kernels and host API calls) of the same bench, 5 turns.
# Not run in the fifty-ninth session: the device calls for it were refused and its device time ran out.
# With carry ["out"]: `BUDGET=<seconds> TAR=<tarball> NAME=<results folder> bash bench/results/h200/s59/trace.sh`.
cd "$(dirname "$0")/../../../.."
NAME=${NAME:-s59_trace} TAR=${TAR:-out/b48.tar.xz}
source bench/results/device_preamble.sh
CUDA_INJECTION64_PATH=$B/libtwell_ktrace.so TWELL_KTRACE_OUT=$O/trace.tsv TWELL_KTRACE_HOST=1 \
  timeout $(left 200) $B/twell bench model --no-prefill --no-decode --turn 21 --turn-context 4096 --warmup 2 --iters 5 \
  > $O/turn.txt 2> $O/turn_progress.log; echo "rc $?" >> $O/turn.txt; cat $O/turn.txt
ls -la $O; xz -9 $O/trace.tsv $O/trace.tsv.host.tsv 2>/dev/null; ls -la $O
