#!/usr/bin/env bash
# One run of a sweep's plan per SLURM array task, each run DDP over the task's GPUs via Lightning's SLURM support.
#   scripts/slurm_sweep.sh configs/sweeps/gpt2-wikitext.yaml [extra study sweep args]
# submits the pretraining step (if the sweep has one), then an array over the plan's runs, then the report.
# Edit the #SBATCH-equivalent options below (GPUS, TIME, PARTITION) for your cluster.
set -euo pipefail
CONFIG=${1:?usage: scripts/slurm_sweep.sh <sweep.yaml> [study sweep args]}; shift
GPUS=${GPUS:-4} TIME=${TIME:-04:00:00} PARTITION=${PARTITION:-gpu}
STUDY=${STUDY:-study}
# the plan (and its size) without running anything
N=$($STUDY sweep --config "$CONFIG" --dry-run "$@" | tail -1 | awk '{print $1}')
# srun starts one task per GPU; Lightning reads SLURM_* and sets up DDP (trainer.devices must equal GPUS).
RUN="srun $STUDY sweep --config $CONFIG --trainer.devices=$GPUS --trainer.strategy=ddp $*"
OPTS=(--nodes=1 --ntasks-per-node="$GPUS" --gres=gpu:"$GPUS" --time="$TIME" --partition="$PARTITION")
PRE=$(sbatch --parsable "${OPTS[@]}" --job-name=sweep-pretrain --wrap "$RUN --run-index pretrain || true")
ARRAY=$(sbatch --parsable "${OPTS[@]}" --dependency=afterany:"$PRE" --array=0-$((N - 1)) --job-name=sweep \
  --wrap "$RUN --run-index \$SLURM_ARRAY_TASK_ID")
sbatch --dependency=afterany:"$ARRAY" --job-name=sweep-report --time=00:30:00 \
  --wrap "$STUDY sweep --config $CONFIG --no-estimate $* || true"
echo "submitted: pretrain $PRE, runs $ARRAY (0..$((N - 1))), then the report"
