#!/bin/bash
# Cloud TPU VM pod slices: create, copy the code, install, run on every worker, collect logs, stop, delete.
#
#   export TPU_NAME=neobert-v5e ZONE=us-west4-a ACCELERATOR=v5litepod-256 WORKDIR=/mnt/shared/runs/neobert
#   launch/tpu/pod.sh create        # the slice (RUNTIME_VERSION, SPOT=1 optional)
#   launch/tpu/pod.sh copy          # this checkout -> ~/neobert-jax on every worker (no .venv, no runs)
#   launch/tpu/pod.sh setup         # venv + requirements + jax[tpu] on every worker
#   launch/tpu/pod.sh run [trainer flags...]   # start training on all workers, detached, one log per worker
#   launch/tpu/pod.sh logs          # fetch every worker's log into ./tpu-logs/$TPU_NAME/
#   launch/tpu/pod.sh tail          # last lines of every worker's log
#   launch/tpu/pod.sh stop          # end the training processes
#   launch/tpu/pod.sh delete        # delete the slice
#
# Every worker runs the same command; distributed.initialize() finds the other workers from the TPU metadata.
# WORKDIR must be one directory shared by all workers (e.g. a Filestore/NFS mount, or a gcsfuse mount of a
# bucket): each worker writes its own checkpoint shards and data-iterator state there, worker 0 the logs.
# If any worker dies the others stop within NEOBERT_HEARTBEAT_TIMEOUT seconds; `run` again to resume.
# DRY_RUN=1 prints the gcloud commands instead of running them.
set -euo pipefail

CMD="${1:-}"; shift || true
if [[ -z "$CMD" || "$CMD" == -h || "$CMD" == --help || "$CMD" == help ]]; then
  sed -n '2,20p' "$0"; exit 0
fi
: "${TPU_NAME:?set TPU_NAME}"
: "${ZONE:?set ZONE (e.g. us-west4-a)}"
PROJECT_FLAG=()
[[ -n "${PROJECT:-}" ]] && PROJECT_FLAG=(--project="$PROJECT")
REMOTE_DIR="${REMOTE_DIR:-neobert-jax}"                 # relative to each worker's home
CONFIG="${CONFIG:-configs/neobert_250m.py}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LOG_NAME="neobert-train.log"
PID_NAME="neobert-train.pid"

gc() {  # run (or with DRY_RUN=1 print) a gcloud command
  if [[ "${DRY_RUN:-0}" == "1" ]]; then printf 'gcloud'; printf ' %q' "$@"; printf '\n'; else gcloud "$@"; fi
}
on_all() {  # the same shell command on every worker of the slice, in parallel
  gc compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=all --command="$1"
}

case "$CMD" in
  create)
    : "${ACCELERATOR:?set ACCELERATOR (e.g. v5litepod-256, v4-128, v5p-128)}"
    # v5e needs a v5e runtime image; v4/v5p use tpu-ubuntu2204-base.
    default_rt="tpu-ubuntu2204-base"; [[ "$ACCELERATOR" == v5litepod* ]] && default_rt="v2-alpha-tpuv5-lite"
    extra=(); [[ "${SPOT:-0}" == "1" ]] && extra+=(--spot)
    gc compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
      --accelerator-type="$ACCELERATOR" --version="${RUNTIME_VERSION:-$default_rt}" "${extra[@]}"
    ;;
  copy)
    tarball="$(mktemp -d)/neobert-jax.tgz"
    # only the source: no virtualenv, caches, run directories or git history
    tar -C "$REPO" --exclude=.venv --exclude=.git --exclude='runs' --exclude='__pycache__' -czf "$tarball" .
    gc compute tpus tpu-vm scp "$tarball" "$TPU_NAME:~/neobert-jax.tgz" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=all
    on_all "mkdir -p ~/$REMOTE_DIR && tar -xzf ~/neobert-jax.tgz -C ~/$REMOTE_DIR && rm ~/neobert-jax.tgz"
    ;;
  setup)
    # jax[tpu] pins the matching libtpu; the rest is the project's own pinned requirements.
    on_all "cd ~/$REMOTE_DIR && python3.11 -m venv .venv && .venv/bin/pip install -q -r requirements.txt \
      'jax[tpu]==0.10.2' -f https://storage.googleapis.com/jax-releases/libtpu_releases.html"
    ;;
  run)
    : "${WORKDIR:?set WORKDIR to a directory shared by all workers}"
    args=""; for a in "$@"; do args+=" $(printf '%q' "$a")"; done
    # setsid nohup: training outlives the ssh session. Each worker logs to its own home directory and
    # remembers the trainer's pid for `stop`.
    env_vars="NEOBERT_HEARTBEAT_TIMEOUT=${NEOBERT_HEARTBEAT_TIMEOUT:-120}"
    train="$env_vars setsid nohup .venv/bin/python -m neobert_jax.train --config=$CONFIG --workdir=$WORKDIR$args"
    on_all "cd ~/$REMOTE_DIR && $train > ~/$LOG_NAME 2>&1 < /dev/null & echo \$! > ~/$PID_NAME; echo started on \$(hostname)"
    ;;
  tail)
    on_all "echo == \$(hostname); tail -n ${LINES_TO_SHOW:-5} ~/$LOG_NAME"
    ;;
  logs)
    if [[ -z "${NUM_WORKERS:-}" ]]; then   # one network endpoint per worker VM
      ips="$(gcloud compute tpus tpu-vm describe "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
        --format='value(networkEndpoints[].ipAddress)')"
      NUM_WORKERS="$(tr ';,' '\n\n' <<< "$ips" | grep -c .)"
    fi
    out="tpu-logs/$TPU_NAME"; mkdir -p "$out"
    for ((w = 0; w < NUM_WORKERS; w++)); do
      gc compute tpus tpu-vm scp "$TPU_NAME:~/$LOG_NAME" "$out/worker_$w.log" --zone="$ZONE" \
        "${PROJECT_FLAG[@]}" --worker="$w" || echo "worker $w: no log" >&2
    done
    echo "logs in $out/"
    ;;
  stop)
    # SIGTERM: the trainer saves a checkpoint at an agreed step and exits; `run` resumes from it.
    on_all "test -f ~/$PID_NAME && kill -TERM \$(cat ~/$PID_NAME) 2>/dev/null; rm -f ~/$PID_NAME; true"
    ;;
  delete)
    gc compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --quiet
    ;;
  *)
    sed -n '2,20p' "$0"; exit 2
    ;;
esac
