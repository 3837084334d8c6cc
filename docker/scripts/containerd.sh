#!/usr/bin/env bash
# Private, standalone containerd instances for tests (the Kubernetes-node case: no dockerd).
#
#   containerd.sh start  NAME [extra containerd args...]   prints the socket path
#   containerd.sh stop   NAME                              stop by pid, unmount leftovers under DIR
#   containerd.sh status NAME                              exit 0 running+answering, 1 running but
#                                                          not answering, 3 not running
#   containerd.sh purge  NAME                              stop, then rm -rf DIR
#
# State lives in DIR=${SNEAKERNET_RUN:-/tmp/sneakernet-run}/containerd-NAME:
#   config.toml root/ state/ opt/ containerd.sock containerd.pid containerd.log containerd.args
#
# The config is private (`containerd --config DIR/config.toml`): own root, state, sockets; the
# CRI plugin is disabled (no CNI, no streaming server, no listening TCP port); no metrics or
# debug listeners. Every snapshotter containerd builds in is available; the tests use
# `overlayfs` and `native`. Namespaces are created on first use (`ctr -n k8s.io ...`).
# Processes are only ever signalled by pid (the pidfile, or a /proc scan for containerd
# shims whose command line names DIR); never by name.
set -euo pipefail

die() { echo "containerd.sh: $*" >&2; exit 1; }
usage() { echo "usage: $0 start|stop|status|purge NAME [extra containerd args...]" >&2; exit 2; }

[ $# -ge 2 ] || usage
cmd=$1 name=$2
shift 2
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "bad NAME '$name' (use [A-Za-z0-9._-])"

RUN=${SNEAKERNET_RUN:-/tmp/sneakernet-run}
case $RUN in /*) ;; *) RUN=$PWD/$RUN ;; esac
DIR=$RUN/containerd-$name
SOCK=$DIR/containerd.sock
PIDFILE=$DIR/containerd.pid
LOG=$DIR/containerd.log
CONFIG=$DIR/config.toml
START_TIMEOUT=${SNEAKERNET_CONTAINERD_START_TIMEOUT:-30}
STOP_TIMEOUT=20

# The ttrpc socket is DIR/containerd.sock.ttrpc; unix socket paths are limited to 107 bytes.
if [ $(( ${#DIR} + 30 )) -gt 107 ]; then
    die "run dir '$DIR' is too long for unix socket paths; set SNEAKERNET_RUN shorter"
fi

answering() {
    timeout 10 ctr --address "$SOCK" version >/dev/null 2>&1
}

SCRIPT=containerd.sh
STRAY_EXES="containerd containerd-shim* runc"
source "$(dirname "${BASH_SOURCE[0]}")/lib/procs.sh"

write_config() {
    cat >"$CONFIG" <<EOF
# Written by docker/scripts/containerd.sh for instance '$name'. Private: own root, state and
# sockets; no CRI, no TCP listeners.
version = 2
root = "$DIR/root"
state = "$DIR/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$SOCK"
  tcp_address = ""

[ttrpc]
  address = "$SOCK.ttrpc"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$DIR/opt"
EOF
}

do_status() {
    local pid
    if pid=$(daemon_pid); then
        if answering; then
            echo "running pid=$pid $SOCK"
            return 0
        fi
        echo "running pid=$pid but not answering on $SOCK"
        return 1
    fi
    echo "stopped"
    return 3
}

cleanup_leftovers() {
    local pid
    for pid in $(stray_pids); do
        terminate "$pid" "leftover process of '$name'"
    done
    unmount_all
}

do_start() {
    local pid want have i launcher
    mkdir -p "$DIR"
    want="$*"

    if pid=$(daemon_pid); then
        have=$(tr '\n' ' ' <"$DIR/containerd.args" 2>/dev/null || true)
        have=${have% }
        if [ "$have" != "$want" ]; then
            die "instance '$name' (pid $pid) already runs with other extra args" \
                "(${have:-none}) than requested (${want:-none}); stop it first"
        fi
        for ((i = 0; i < START_TIMEOUT * 2; i++)); do
            if answering; then echo "$SOCK"; return 0; fi
            pid_alive "$pid" || break
            sleep 0.5
        done
        die "instance '$name' (pid $pid) is running but does not answer on $SOCK; see $LOG"
    fi

    command -v containerd >/dev/null || die "containerd not found (apt-get install containerd)"
    command -v ctr >/dev/null || die "ctr not found (apt-get install containerd)"
    [ "$(id -u)" = 0 ] || die "must run as root to start containerd"

    cleanup_leftovers
    rm -f "$PIDFILE" "$SOCK" "$SOCK.ttrpc"
    mkdir -p "$DIR/root" "$DIR/state" "$DIR/opt"
    write_config
    printf '%s\n' "$@" >"$DIR/containerd.args"
    echo "=== $(date -Is) containerd.sh start $name $*" >>"$LOG"

    launcher=()
    command -v setsid >/dev/null && launcher=(setsid)
    # Detach from the caller's session; stdin from /dev/null, all output to the log.
    # containerd has no --pidfile: the launched process is containerd itself (exec'd by
    # setsid when we are not a process group leader), so $! is its pid.
    "${launcher[@]}" containerd --config "$CONFIG" "$@" </dev/null >>"$LOG" 2>&1 &
    local launched=$!
    echo "$launched" >"$PIDFILE"

    for ((i = 0; i < START_TIMEOUT * 4; i++)); do
        if answering; then
            if ! daemon_pid >/dev/null; then
                die "containerd '$name' answers on $SOCK but pid $launched is not it; see $LOG"
            fi
            echo "$SOCK"
            return 0
        fi
        if ! pid_alive "$launched"; then
            echo "containerd.sh: containerd '$name' exited during startup; last log lines:" >&2
            tail -n 25 "$LOG" >&2 || true
            rm -f "$PIDFILE"
            cleanup_leftovers || true
            exit 1
        fi
        sleep 0.25
    done
    echo "containerd.sh: containerd '$name' did not answer within ${START_TIMEOUT}s; last log lines:" >&2
    tail -n 25 "$LOG" >&2 || true
    do_stop >/dev/null 2>&1 || true
    exit 1
}

do_stop() {
    local pid
    if pid=$(daemon_pid); then
        terminate "$pid" "containerd '$name'"
        echo "=== $(date -Is) containerd.sh stopped $name (pid $pid)" >>"$LOG"
    fi
    [ -d "$DIR" ] || return 0
    cleanup_leftovers
    rm -f "$PIDFILE" "$SOCK" "$SOCK.ttrpc"
}

case $cmd in
start) do_start "$@" ;;
stop) [ $# -eq 0 ] || usage; do_stop ;;
status) [ $# -eq 0 ] || usage; do_status ;;
purge) [ $# -eq 0 ] || usage; do_stop; rm -rf "$DIR" ;;
*) usage ;;
esac
