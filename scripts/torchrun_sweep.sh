#!/usr/bin/env bash
# One run of a sweep's plan on N local GPUs through torchrun (Lightning picks up torchrun's environment).
#   scripts/torchrun_sweep.sh configs/sweeps/gpt2-wikitext.yaml 7 [NPROC] [extra study sweep args]
# Run index "pretrain" first if the sweep pretrains; loop over 0..N-1 (see `study sweep --dry-run`) for all runs.
set -euo pipefail
CONFIG=${1:?usage: scripts/torchrun_sweep.sh <sweep.yaml> <run index|pretrain> [nproc] [args]}
INDEX=${2:?run index}
NPROC=${3:-$(nvidia-smi -L 2>/dev/null | wc -l)}
shift $(( $# >= 3 ? 3 : 2 ))
exec torchrun --standalone --nproc-per-node="${NPROC:-1}" -m study.cli sweep --config "$CONFIG" \
  --run-index "$INDEX" --trainer.devices="${NPROC:-1}" --trainer.strategy=ddp "$@"
