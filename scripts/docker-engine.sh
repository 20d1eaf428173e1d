#!/usr/bin/env bash
# Make a Docker engine available for the docker runtime's end-to-end tests (`make docker-engine`).
#
#   scripts/docker-engine.sh [start|stop|status]
#
# start (the default) is idempotent: a daemon already answering on the socket is reused. As root on a
# Debian-like machine it installs docker.io (and debootstrap, which `make test-image` needs) when they
# are missing, then runs `dockerd --iptables=false --bridge=none` in the background (containers use
# the host network), logging to $CACHE/docker/dockerd.log, and waits for the socket.
#
# When the engine cannot be had here (not root, no apt-get, the install fails) it says why, records the
# reason in $CACHE/docker/engine.status and exits 0: `make test` goes on and the docker tests skip with
# that reason (SPARKCTL_REQUIRE_DOCKER=1 makes that an error). A daemon that should start here (root,
# installed) but does not is an error (exit 1) unless SPARKCTL_REQUIRE_DOCKER=0: CI must not go green
# by skipping the docker tests.
set -uo pipefail

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sparkctl/docker"
SOCK="${SPARKCTL_DOCKERD_SOCKET:-/var/run/docker.sock}"
LOG="$CACHE/dockerd.log"
PIDFILE="$CACHE/dockerd.pid"
STATUS="$CACHE/engine.status"
WAIT_S="${SPARKCTL_DOCKERD_WAIT_S:-60}"
mkdir -p "$CACHE"

NAME=docker-engine
# shellcheck source=lib/outcome.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/outcome.sh"

answering() { # the daemon is up when the API answers on the socket, not merely when the file exists
    [[ -S "$SOCK" ]] && DOCKER_HOST="unix://$SOCK" timeout 5 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

ensure_packages() {
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $(id -u) -ne 0 ]]; then
        unavailable "${missing[*]} not installed and not root (run \`sudo make docker-engine\`)"
    fi
    command -v apt-get >/dev/null 2>&1 || unavailable "${missing[*]} not installed and no apt-get on this machine"
    say "installing ${missing[*]} (apt-get, log in $CACHE/apt.log)"
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; } \
        >"$CACHE/apt.log" 2>&1; then
        tail -n 5 "$CACHE/apt.log" >&2
        unavailable "apt-get install ${missing[*]} failed (see $CACHE/apt.log)"
    fi
}

start() {
    if answering; then
        say "reusing the daemon answering on $SOCK"
        record ready "daemon on unix://$SOCK"
        return 0
    fi
    ensure_packages
    command -v docker >/dev/null 2>&1 || unavailable "no docker client on PATH"
    if [[ $(id -u) -ne 0 ]]; then
        unavailable "no daemon answering on $SOCK and starting dockerd needs root (run \`sudo make docker-engine\`)"
    fi
    say "starting dockerd (log: $LOG)"
    # setsid: the daemon outlives `make`, and a Ctrl-C in the terminal does not reach it.
    setsid dockerd --iptables=false --bridge=none --host="unix://$SOCK" >>"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    local waited=0
    until answering; do
        if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
            tail -n 15 "$LOG" >&2
            broken "dockerd exited during start-up (see $LOG)"
        fi
        if ((waited >= WAIT_S)); then
            tail -n 15 "$LOG" >&2
            broken "dockerd did not answer on $SOCK within ${WAIT_S}s (see $LOG)"
        fi
        sleep 1
        waited=$((waited + 1))
    done
    say "dockerd ready on $SOCK after ${waited}s (pid $(cat "$PIDFILE"))"
    record ready "daemon on unix://$SOCK"
}

stop() { # stops only a daemon this script started (its pid file), never someone else's
    if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        local pid
        pid="$(cat "$PIDFILE")"
        say "stopping dockerd (pid $pid)"
        kill -TERM "$pid"
        for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        rm -f "$PIDFILE"
    else
        say "no dockerd started by this script is running"
    fi
    record unavailable "dockerd stopped by scripts/docker-engine.sh stop"
}

case "${1:-start}" in
start) start ;;
stop) stop ;;
status)
    if answering; then echo "ready: daemon on unix://$SOCK"; else echo "not running (unix://$SOCK)"; exit 1; fi ;;
*) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
