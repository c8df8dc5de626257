#!/usr/bin/env bash
# Stops the test cluster ci/slurm/up.sh started (by its pid files), cancelling its jobs first.
set -uo pipefail
dir=${TRAINBOX_SLURM_DIR:-/var/lib/trainbox-slurm}
export SLURM_CONF="$dir/slurm.conf"
[[ -f "$SLURM_CONF" ]] && timeout 10 scancel --full --quiet --user "$(id -un)" 2>/dev/null
stop() {  # a pid file's process, TERM then KILL
  local pidfile=$1 pid
  [[ -f "$pidfile" ]] || return 0
  pid=$(cat "$pidfile")
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}
for f in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid" "$dir/run/munge/munged.pid"; do stop "$f"; done
echo "slurm-down: stopped (state kept in $dir)" >&2
