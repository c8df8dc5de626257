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
#
# `--emulate arm64` also lets this x86_64 host build and run linux/arm64 images (`trainbox base bootstrap
# --platform linux/arm64`, `image build --platform linux/arm64`): it installs Debian's qemu-user-static and
# binfmt-support, mounts binfmt_misc and enables qemu-aarch64, whose F (fix-binary) flag lets the emulator work
# inside BuildKit's containers. Idempotent too; it fails in one line where binfmt_misc cannot be mounted (an
# unprivileged container).
set -euo pipefail

EMULATE=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        --emulate) EMULATE="${2:-}"; shift 2 || shift ;;
        --emulate=*) EMULATE="${1#*=}"; shift ;;
        *) printf 'ensure-docker: error: unknown argument %s (usage: ensure-docker.sh [--emulate arm64])\n' "$1" >&2
           exit 2 ;;
    esac
done
case "$EMULATE" in
    ""|arm64) ;;
    *) printf 'ensure-docker: error: --emulate %s: only arm64 is supported\n' "$EMULATE" >&2; exit 2 ;;
esac

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

BINFMT=/proc/sys/fs/binfmt_misc

emulation_ready() {
    local entry="$BINFMT/qemu-aarch64"
    [ "$(uname -m)" = aarch64 ] && return 0
    [ -r "$entry" ] && [ "$(head -n1 "$entry")" = enabled ] && grep -q '^flags:.*F' "$entry"
}

ensure_emulation() {
    if emulation_ready; then
        say "linux/arm64 emulation ready ($(uname -m) host; qemu-aarch64 in $BINFMT)"
        return 0
    fi
    as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo -n "$@"; fi; }
    if ! command -v qemu-aarch64-static >/dev/null 2>&1 || ! command -v update-binfmts >/dev/null 2>&1; then
        command -v apt-get >/dev/null 2>&1 || die "no qemu-aarch64-static and no apt-get to install it"
        say "installing qemu-user-static and binfmt-support from Debian"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            qemu-user-static binfmt-support >/dev/null || die "apt-get install qemu-user-static binfmt-support failed"
    fi
    if ! grep -q " $BINFMT " /proc/mounts; then
        as_root mount -t binfmt_misc binfmt_misc "$BINFMT" 2>/dev/null \
            || die "cannot mount binfmt_misc at $BINFMT (an unprivileged container?): linux/arm64 builds need it"
    fi
    as_root update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
    [ -e "$BINFMT/qemu-aarch64" ] || as_root update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
    emulation_ready || die "qemu-aarch64 is not registered with the F flag in $BINFMT after setting it up: $(tr '\n' ' ' < "$BINFMT/qemu-aarch64" 2>/dev/null || echo 'no entry')"
    say "linux/arm64 emulation ready (qemu-aarch64 registered in $BINFMT, flags $(sed -n 's/^flags: //p' "$BINFMT/qemu-aarch64"))"
}

if engine_answers; then
    say "engine answers (server $(engine_version)); nothing to do"
    [ -z "$EMULATE" ] || ensure_emulation
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
[ -z "$EMULATE" ] || ensure_emulation
