#!/usr/bin/env bash
# Private, loopback-only dockerd instances for tests.
#
#   dockerd.sh start  NAME [--containerd-store] [extra dockerd args...]
#                                                    prints the DOCKER_HOST url (unix://...)
#   dockerd.sh stop   NAME                           stop by pid, unmount leftovers under DIR
#   dockerd.sh status NAME                           exit 0 running+answering, 1 running but
#                                                    not answering, 3 not running
#   dockerd.sh purge  NAME                           stop, then rm -rf DIR
#
# State lives in DIR=${SNEAKERNET_RUN:-/tmp/sneakernet-run}/dockerd-NAME:
#   data/ exec/ docker.sock docker.pid dockerd.log daemon.json dockerd.args
#
# Every instance runs with --bridge=none --iptables=false --ip-forward=false
# --ip-masq=false and its own (dockerd-managed) containerd under DIR/exec/containerd,
# so several instances coexist (e.g. one overlay2, one --storage-driver vfs).
#
# --containerd-store: Docker with the containerd image store. dockerd, containerd and the shims
# come from Debian 13 (docker.io 26.x, containerd 1.7.x; install-deps.sh unpacks them into
# ${SNEAKERNET_TRIXIE_DOCKER:-/opt/sneakernet/trixie-docker}), put first on PATH (Debian 12's
# runc stays), and daemon.json holds {"features": {"containerd-snapshotter": true}}.
# Processes are only ever signalled by pid (pidfiles, or a /proc scan for processes
# whose command line names DIR); never by name.
set -euo pipefail

die() { echo "dockerd.sh: $*" >&2; exit 1; }
usage() { echo "usage: $0 start|stop|status|purge NAME [--containerd-store] [extra dockerd args...]" >&2; exit 2; }

[ $# -ge 2 ] || usage
cmd=$1 name=$2
shift 2
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "bad NAME '$name' (use [A-Za-z0-9._-])"

RUN=${SNEAKERNET_RUN:-/tmp/sneakernet-run}
case $RUN in /*) ;; *) RUN=$PWD/$RUN ;; esac
DIR=$RUN/dockerd-$name
SOCK=$DIR/docker.sock
URL=unix://$SOCK
PIDFILE=$DIR/docker.pid
LOG=$DIR/dockerd.log
CTRD_PIDFILE=$DIR/exec/containerd/containerd.pid
START_TIMEOUT=${SNEAKERNET_DOCKERD_START_TIMEOUT:-60}
STOP_TIMEOUT=20

# The managed containerd's ttrpc socket is DIR/exec/containerd/containerd.sock.ttrpc;
# unix socket paths are limited to 107 bytes.
if [ $(( ${#DIR} + 40 )) -gt 107 ]; then
    die "run dir '$DIR' is too long for unix socket paths; set SNEAKERNET_RUN shorter"
fi

docker_cli() {
    env -u DOCKER_CONTEXT -u DOCKER_TLS_VERIFY -u DOCKER_CERT_PATH \
        timeout 15 docker -H "$URL" "$@"
}

answering() {
    local v
    v=$(docker_cli info --format '{{.ServerVersion}}' 2>/dev/null) || return 1
    [ -n "$v" ]
}

SCRIPT=dockerd.sh
STRAY_EXES="dockerd containerd containerd-shim* runc docker-init docker-proxy"
source "$(dirname "${BASH_SOURCE[0]}")/lib/procs.sh"

do_status() {
    local pid
    if pid=$(daemon_pid); then
        if answering; then
            echo "running pid=$pid $URL"
            return 0
        fi
        echo "running pid=$pid but not answering on $URL"
        return 1
    fi
    echo "stopped"
    return 3
}

do_start() {
    local pid want have i launcher arg ctrstore= config='{}'
    mkdir -p "$DIR"
    want="$*"
    local orig=("$@") extra=()
    for arg in "$@"; do
        if [ "$arg" = --containerd-store ]; then ctrstore=1; else extra+=("$arg"); fi
    done
    set -- "${extra[@]}"
    if [ -n "$ctrstore" ]; then
        local trixie=${SNEAKERNET_TRIXIE_DOCKER:-/opt/sneakernet/trixie-docker}
        [ -x "$trixie/usr/sbin/dockerd" ] && [ -x "$trixie/usr/bin/containerd" ] ||
            die "no Debian 13 dockerd/containerd under $trixie (run docker/scripts/install-deps.sh as root)"
        PATH=$trixie/usr/sbin:$trixie/usr/bin:$PATH
        export PATH
        config='{"features": {"containerd-snapshotter": true}}'
    fi

    if pid=$(daemon_pid); then
        have=$(tr '\n' ' ' <"$DIR/dockerd.args" 2>/dev/null || true)
        have=${have% }
        if [ "$have" != "$want" ]; then
            die "instance '$name' (pid $pid) already runs with other extra args" \
                "(${have:-none}) than requested (${want:-none}); stop it first"
        fi
        for ((i = 0; i < START_TIMEOUT * 2; i++)); do
            if answering; then echo "$URL"; return 0; fi
            pid_alive "$pid" || break
            sleep 0.5
        done
        die "instance '$name' (pid $pid) is running but does not answer on $URL; see $LOG"
    fi

    command -v dockerd >/dev/null || die "dockerd not found (apt-get install docker.io)"
    command -v containerd >/dev/null || die "containerd not found (apt-get install containerd)"
    command -v docker >/dev/null || die "docker CLI not found (apt-get install docker.io)"
    [ "$(id -u)" = 0 ] || die "must run as root to start dockerd"

    # Leftovers of a crashed instance (stray containerd/shims, mounts, stale files).
    cleanup_leftovers
    rm -f "$PIDFILE" "$SOCK"
    mkdir -p "$DIR/data" "$DIR/exec"
    # Private config file: never pick up the host's /etc/docker/daemon.json.
    echo "$config" >"$DIR/daemon.json"
    printf '%s\n' "${orig[@]}" >"$DIR/dockerd.args"
    {
        echo "=== $(date -Is) dockerd.sh start $name $*"
    } >>"$LOG"

    launcher=()
    command -v setsid >/dev/null && launcher=(setsid)
    # Detach from the caller's session; stdin from /dev/null, all output to the log.
    "${launcher[@]}" dockerd \
        --config-file "$DIR/daemon.json" \
        --data-root "$DIR/data" \
        --exec-root "$DIR/exec" \
        -H "$URL" \
        --pidfile "$PIDFILE" \
        --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
        "$@" </dev/null >>"$LOG" 2>&1 &
    local launched=$!

    for ((i = 0; i < START_TIMEOUT * 4; i++)); do
        if answering; then
            echo "$URL"
            return 0
        fi
        if ! pid_alive "$launched" && ! daemon_pid >/dev/null; then
            echo "dockerd.sh: dockerd '$name' exited during startup; last log lines:" >&2
            tail -n 25 "$LOG" >&2 || true
            cleanup_leftovers || true
            exit 1
        fi
        sleep 0.25
    done
    echo "dockerd.sh: dockerd '$name' did not answer within ${START_TIMEOUT}s; last log lines:" >&2
    tail -n 25 "$LOG" >&2 || true
    do_stop >/dev/null 2>&1 || true
    exit 1
}

# Kill what may survive a dockerd that died hard: its managed containerd and any
# shims (found by pid file / by DIR in their command line), then unmount.
cleanup_leftovers() {
    local pid root id
    # Containers whose shim or dockerd died keep running (their init process is in its
    # own pid namespace and does not name DIR): force-delete them through runc state
    # under DIR, which kills them and removes their cgroups.
    if command -v runc >/dev/null; then
        for root in "$DIR"/exec/runtime-*/*/; do
            [ -d "$root" ] || continue
            for id in $(runc --root "$root" list -q 2>/dev/null); do
                runc --root "$root" delete --force "$id" >/dev/null 2>&1 ||
                    echo "dockerd.sh: runc delete --force $id failed" >&2
            done
        done
    fi
    if pid=$(read_pid "$CTRD_PIDFILE") && pid_alive "$pid" && pid_mentions_dir "$pid"; then
        terminate "$pid" "containerd of '$name'"
    fi
    for pid in $(stray_pids); do
        terminate "$pid" "leftover process of '$name'"
    done
    unmount_all
}

do_stop() {
    local pid
    if pid=$(daemon_pid); then
        terminate "$pid" "dockerd '$name'"
        echo "=== $(date -Is) dockerd.sh stopped $name (pid $pid)" >>"$LOG"
    fi
    [ -d "$DIR" ] || return 0
    cleanup_leftovers
    rm -f "$PIDFILE" "$SOCK"
}

case $cmd in
start) do_start "$@" ;;
stop) [ $# -eq 0 ] || usage; do_stop ;;
status) [ $# -eq 0 ] || usage; do_status ;;
purge) [ $# -eq 0 ] || usage; do_stop; rm -rf "$DIR" ;;
*) usage ;;
esac
