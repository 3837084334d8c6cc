#!/usr/bin/env bash
# Private OpenSSH server on 127.0.0.1:PORT for the `bundle push --ssh` tests. It has its own host
# key, one authorized client key, and allows only local forwarding to PERMITOPEN. The machine's
# own sshd and /etc/ssh are never touched.
#
#   sshd.sh start  NAME PORT PERMITOPEN   prints 127.0.0.1:PORT (PERMITOPEN: HOST:PORT, e.g. 127.0.0.1:5000)
#   sshd.sh stop   NAME                   stop by pid (TERM, KILL after 20 s)
#   sshd.sh status NAME                   exit 0 running+answering, 1 not answering, 3 stopped
#   sshd.sh purge  NAME                   stop, then rm -rf DIR
#
# State in DIR=${SNEAKERNET_RUN:-/tmp/sneakernet-run}/sshd-NAME:
#   sshd_config  ssh_host_ed25519_key(.pub)  id_ed25519(.pub): the client key  authorized_keys
#   known_hosts: the line a client needs ([127.0.0.1]:PORT + host key)  sshd.pid  sshd.log
# Client: ssh -p PORT -i DIR/id_ed25519 -o UserKnownHostsFile=DIR/known_hosts USER@127.0.0.1
set -euo pipefail

die() { echo "sshd.sh: $*" >&2; exit 1; }
usage() { echo "usage: $0 start NAME PORT PERMITOPEN | stop|status|purge NAME" >&2; exit 2; }

[ $# -ge 2 ] || usage
cmd=$1 name=$2
shift 2
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "bad NAME '$name' (use [A-Za-z0-9._-])"

RUN=${SNEAKERNET_RUN:-/tmp/sneakernet-run}
case $RUN in /*) ;; *) RUN=$PWD/$RUN ;; esac
DIR=$RUN/sshd-$name
PIDFILE=$DIR/sshd.pid
LOG=$DIR/sshd.log
CONFIG=$DIR/sshd_config
SSHD_BIN=${SNEAKERNET_SSHD_BIN:-/usr/sbin/sshd}
START_TIMEOUT=20
STOP_TIMEOUT=20

SCRIPT=sshd.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/procs.sh"

# Running sshd pid, checked against its command line (pid reuse guard).
sshd_pid() {
    local pid args
    [ -s "$PIDFILE" ] || return 1
    pid=$(tr -dc '0-9' <"$PIDFILE")
    pid_alive "$pid" || return 1
    # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -f CONFIG ... [listener]"): match a substring
    args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ "$args " == *" -f $CONFIG "* ]] || return 1
    echo "$pid"
}

configured_port() {
    sed -n 's/^ListenAddress 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$CONFIG" 2>/dev/null
}

# answering PORT: the server sends its SSH banner.
answering() {
    local port=$1 banner
    banner=$(timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port && head -c 4 <&3" 2>/dev/null) || return 1
    [ "$banner" = "SSH-" ]
}

do_start() {
    [ $# -eq 2 ] || usage
    local port=$1 permit=$2 pid i user
    [[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "bad PORT '$port'"
    [[ $permit =~ ^[^[:space:]]+:[0-9]+$ ]] || die "bad PERMITOPEN '$permit' (HOST:PORT)"

    if pid=$(sshd_pid); then
        [ "$(configured_port)" = "$port" ] ||
            die "sshd '$name' (pid $pid) already runs on port $(configured_port); stop it first"
        answering "$port" && { echo "127.0.0.1:$port"; return 0; }
        die "sshd '$name' (pid $pid) runs but does not answer on 127.0.0.1:$port; see $LOG"
    fi
    [ -x "$SSHD_BIN" ] || die "$SSHD_BIN not found (apt-get install openssh-server)"
    command -v ssh-keygen >/dev/null || die "ssh-keygen not found (apt-get install openssh-client)"
    port_in_use "$port" && die "127.0.0.1:$port is already in use by something else"

    mkdir -p "$DIR"
    chmod 700 "$DIR"
    rm -f "$PIDFILE"
    [ -f "$DIR/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C "sneakernet-test-host" -f "$DIR/ssh_host_ed25519_key"
    [ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "sneakernet-test-client" -f "$DIR/id_ed25519"
    cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
    chmod 600 "$DIR/authorized_keys"
    echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$DIR/ssh_host_ed25519_key.pub")" >"$DIR/known_hosts"
    user=$(id -un)
    cat >"$CONFIG" <<EOF
# written by docker/scripts/sshd.sh for the tests: loopback only, key only, local forwarding
# to $permit only
ListenAddress 127.0.0.1:$port
HostKey $DIR/ssh_host_ed25519_key
PidFile $PIDFILE
AuthorizedKeysFile $DIR/authorized_keys
AllowUsers $user
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding local
PermitOpen $permit
GatewayPorts no
AllowAgentForwarding no
AllowStreamLocalForwarding no
X11Forwarding no
PermitTunnel no
PermitTTY no
PermitUserRC no
PrintMotd no
LogLevel VERBOSE
EOF
    # Debian's sshd needs its privilege separation directory (its service unit creates it).
    [ -d /run/sshd ] || mkdir -m 0755 -p /run/sshd
    "$SSHD_BIN" -t -f "$CONFIG" 2>>"$LOG" || { tail -n 5 "$LOG" >&2; die "sshd rejected $CONFIG"; }
    echo "=== $(date -Is) sshd.sh start $name $port $permit" >>"$LOG"
    local launcher=()
    command -v setsid >/dev/null && launcher=(setsid)
    "${launcher[@]}" "$SSHD_BIN" -D -f "$CONFIG" -E "$LOG" </dev/null >>"$LOG" 2>&1 &
    pid=$!
    for ((i = 0; i < START_TIMEOUT * 4; i++)); do
        if answering "$port"; then
            [ -s "$PIDFILE" ] || echo "$pid" >"$PIDFILE"
            echo "127.0.0.1:$port"
            return 0
        fi
        if ! pid_alive "$pid"; then
            echo "sshd.sh: sshd '$name' exited during startup; last log lines:" >&2
            tail -n 20 "$LOG" >&2 || true
            rm -f "$PIDFILE"
            exit 1
        fi
        sleep 0.25
    done
    echo "sshd.sh: sshd '$name' did not answer within ${START_TIMEOUT}s:" >&2
    tail -n 20 "$LOG" >&2 || true
    echo "$pid" >"$PIDFILE"
    do_stop
    exit 1
}

do_stop() {
    local pid i
    if pid=$(sshd_pid); then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
            pid_alive "$pid" || break
            sleep 0.1
        done
        if pid_alive "$pid"; then
            echo "sshd.sh: sshd '$name' (pid $pid) ignored TERM; sending KILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 100; i++)); do
                pid_alive "$pid" || break
                sleep 0.1
            done
            pid_alive "$pid" && die "sshd '$name' (pid $pid) did not exit after KILL"
        fi
        echo "=== $(date -Is) sshd.sh stopped $name (pid $pid)" >>"$LOG"
    fi
    rm -f "$PIDFILE"
}

do_status() {
    local pid port
    if pid=$(sshd_pid); then
        port=$(configured_port)
        if answering "$port"; then
            echo "running pid=$pid 127.0.0.1:$port"
            return 0
        fi
        echo "running pid=$pid but not answering on 127.0.0.1:$port"
        return 1
    fi
    echo "stopped"
    return 3
}

case $cmd in
start) do_start "$@" ;;
stop) [ $# -eq 0 ] || usage; do_stop ;;
status) [ $# -eq 0 ] || usage; do_status ;;
purge) [ $# -eq 0 ] || usage; do_stop; rm -rf "$DIR" ;;
*) usage ;;
esac
