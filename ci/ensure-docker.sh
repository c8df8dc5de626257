#!/usr/bin/env bash
# Make sure a Docker engine answers; start one the way that works on these machines when none does.
#
# Idempotent: when `docker info` answers, this prints one line and changes nothing (a working engine,
# local or remote through DOCKER_HOST, is left alone). Otherwise it installs docker.io (and debootstrap,
# which `trainbox base bootstrap` needs) from Debian when missing, starts dockerd in the background and
# waits, bounded, until it answers.
#
# Why these dockerd flags: no container registry is reachable and the machines forbid creating bridge
# networks or NAT rules, so the daemon runs with no default bridge and no iptables/masquerading; every
# build and container uses `--network host` (or none) instead.
#
# Knobs (environment): DOCKERD_DATA_ROOT (/var/lib/docker), DOCKERD_PIDFILE (/var/run/dockerd-trainbox.pid),
# DOCKERD_LOG (/var/log/dockerd-trainbox.log), DOCKERD_WAIT_S (60), DOCKERD_EXTRA_ARGS (appended, word-split).
set -euo pipefail

DATA_ROOT="${DOCKERD_DATA_ROOT:-/var/lib/docker}"
PIDFILE="${DOCKERD_PIDFILE:-/var/run/dockerd-trainbox.pid}"
LOG="${DOCKERD_LOG:-/var/log/dockerd-trainbox.log}"
WAIT_S="${DOCKERD_WAIT_S:-60}"

say() { printf 'ensure-docker: %s\n' "$*"; }
die() { printf 'ensure-docker: error: %s\n' "$*" >&2; exit 1; }

# Any docker client can answer `info`; prefer the one on PATH, fall back to Debian's.
client() {
    if command -v docker >/dev/null 2>&1; then command -v docker
    elif [ -x /usr/bin/docker ]; then echo /usr/bin/docker
    fi
}

engine_answers() {
    local c
    c="$(client)"
    [ -n "$c" ] || return 1
    timeout 10 "$c" info >/dev/null 2>&1
}

engine_version() {
    timeout 10 "$(client)" version --format '{{.Server.Version}}' 2>/dev/null || echo unknown
}

if engine_answers; then
    say "engine answers (server $(engine_version)); nothing to do"
    exit 0
fi

# Everything below changes the machine: it needs root (or password-less sudo).
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        die "no Docker engine answers and starting one needs root; run this script as root or with password-less sudo, or point DOCKER_HOST at a running engine"
    fi
fi

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install it; install Docker Engine yourself and rerun"
    say "installing ${missing[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    # The package's own init script would start dockerd with its default bridge network and NAT rules,
    # which these machines forbid: keep package scripts from starting services while installing.
    policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
        "${SUDO[@]}" chmod 0755 /usr/sbin/policy-rc.d
        policy=/usr/sbin/policy-rc.d
    fi
    rc=0
    { "${SUDO[@]}" apt-get update -qq && \
      "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } || rc=$?
    [ -z "$policy" ] || "${SUDO[@]}" rm -f "$policy"
    [ "$rc" -eq 0 ] || die "apt-get install ${missing[*]} failed (exit $rc); is Debian's archive reachable?"
fi
command -v dockerd >/dev/null 2>&1 || die "dockerd is still not on PATH after installing docker.io"

# A daemon we started earlier may still be coming up: wait for it instead of starting a second one.
pid=""
if [ -f "$PIDFILE" ]; then
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "dockerd (pid $pid) is running but not answering yet; waiting"
    else
        "${SUDO[@]}" rm -f "$PIDFILE"
        pid=""
    fi
fi

if [ -z "$pid" ]; then
    "${SUDO[@]}" mkdir -p "$DATA_ROOT" "$(dirname "$PIDFILE")" "$(dirname "$LOG")"
    # shellcheck disable=SC2206  # DOCKERD_EXTRA_ARGS is deliberately word-split
    extra=(${DOCKERD_EXTRA_ARGS:-})
    # setsid + nohup: the daemon must outlive this script and the CI step that ran it, and must not
    # hold the caller's stdin/stdout (CI runners wait for open pipes).
    "${SUDO[@]}" setsid nohup dockerd \
        --bridge=none --iptables=false --ip-masq=false \
        --data-root "$DATA_ROOT" --pidfile "$PIDFILE" "${extra[@]}" \
        </dev/null >>"$LOG" 2>&1 &
    say "started dockerd (data root $DATA_ROOT, log $LOG)"
fi

deadline=$((SECONDS + WAIT_S))
until engine_answers; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        tail -n 20 "$LOG" >&2 2>/dev/null || true
        die "dockerd did not answer within ${WAIT_S}s; the last lines of $LOG are above"
    fi
    if [ -f "$PIDFILE" ]; then
        p="$(cat "$PIDFILE" 2>/dev/null || true)"
        if [ -n "$p" ] && ! kill -0 "$p" 2>/dev/null; then
            tail -n 20 "$LOG" >&2 2>/dev/null || true
            die "dockerd exited while starting; the last lines of $LOG are above"
        fi
    fi
    sleep 1
done
say "engine answers (server $(engine_version), data root $DATA_ROOT, bridge none: use --network host)"
