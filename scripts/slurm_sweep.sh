#!/usr/bin/env bash
# One run of a sweep's plan per SLURM array task, each run DDP over the task's processes via Lightning's SLURM
# support.
#   scripts/slurm_sweep.sh configs/sweeps/gpt2-wikitext.yaml [extra study sweep args]
# submits the pretraining step (if the sweep has one), then an array over the plan's runs, then the report.
# Cluster options come from the environment:
#   GPUS=4          GPUs per run (0: CPU only, no --gres; each run is TASKS DDP processes on CPU)
#   TASKS=$GPUS     processes per run (default: GPUS, or 1 when GPUS=0)
#   TIME=04:00:00   time limit per job          PARTITION=gpu    partition (empty: the cluster's default)
#   SBATCH_OPTS=""  any other sbatch options, e.g. "--account=abc --qos=high"
#   STUDY=study     the command that runs `study` (e.g. "uv run study")
set -euo pipefail
CONFIG=${1:?usage: scripts/slurm_sweep.sh <sweep.yaml> [study sweep args]}; shift
GPUS=${GPUS:-4} TIME=${TIME:-04:00:00} PARTITION=${PARTITION-gpu}
TASKS=${TASKS:-$(( GPUS > 0 ? GPUS : 1 ))}
STUDY=${STUDY:-study}
read -r -a EXTRA <<< "${SBATCH_OPTS:-}"
COMMON=(--time="$TIME" "${EXTRA[@]}")
[ -n "$PARTITION" ] && COMMON+=(--partition="$PARTITION")
if [ "$GPUS" -gt 0 ]; then
  ACCELERATOR=gpu; RESOURCES=(--gres=gpu:"$GPUS")
else
  ACCELERATOR=cpu; RESOURCES=()
fi
DDP=(--trainer.accelerator="$ACCELERATOR" --trainer.devices="$TASKS" --trainer.strategy=ddp)
# the plan (its size and folder) without running anything, with the arguments the runs get
LAST=$($STUDY sweep --config "$CONFIG" --dry-run "${DDP[@]}" "$@" | tail -1)  # "<N> runs; nothing written (a sweep writes its plan to <dir>/plan.json)"
N=$(awk '{print $1}' <<< "$LAST")
PLAN="${LAST#*writes its plan to }"
SWEEP_DIR=$(dirname "${PLAN%)}")
# srun starts one task per process; Lightning reads SLURM_* and sets up DDP (trainer.devices must equal TASKS).
# --wrap takes a shell string: every path and argument goes in quoted (%q), so spaces or `;` in them stay data.
# STUDY stays unquoted on purpose: it is a command line ("uv run study").
RUN="srun $STUDY sweep --config $(printf '%q' "$CONFIG") $(printf '%q ' "${DDP[@]}" "$@")"
OPTS=(--nodes=1 --ntasks-per-node="$TASKS" "${RESOURCES[@]}" "${COMMON[@]}")
PRE=$(sbatch --parsable "${OPTS[@]}" --job-name=sweep-pretrain --wrap "$RUN --run-index pretrain || true")
ARRAY=$(sbatch --parsable "${OPTS[@]}" --dependency=afterany:"$PRE" --array=0-$((N - 1)) --job-name=sweep \
  --wrap "$RUN --run-index \$SLURM_ARRAY_TASK_ID")
REPORT=$(sbatch --parsable "${COMMON[@]}" --dependency=afterany:"$ARRAY" --job-name=sweep-report \
  --wrap "$STUDY report $(printf '%q' "$SWEEP_DIR")")
echo "submitted: pretrain $PRE, runs $ARRAY (0..$((N - 1))), then the report $REPORT -> $SWEEP_DIR"
