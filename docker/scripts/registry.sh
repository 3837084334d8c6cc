#!/usr/bin/env bash
# Private Debian docker-registry (distribution 2.x) on 127.0.0.1:PORT.
#
#   registry.sh start  NAME PORT   prints the registry address (127.0.0.1:PORT)
#   registry.sh stop   NAME        stop by pid (TERM, KILL after 20 s)
#   registry.sh status NAME        exit 0 running+answering, 1 not answering, 3 stopped
#   registry.sh purge  NAME        stop, then rm -rf DIR
#
# State in DIR=${SNEAKERNET_RUN:-/tmp/sneakernet-run}/registry-NAME:
#   config.yml  data/  registry.pid  registry.log
# Plain HTTP on loopback only; blob/manifest deletion enabled.
# SNEAKERNET_REGISTRY_HTPASSWD=FILE at start: require basic auth against that htpasswd (bcrypt).
# SNEAKERNET_REGISTRY_TLS_CERT=PEM and SNEAKERNET_REGISTRY_TLS_KEY=PEM at start: serve HTTPS with that
#   certificate and key (http.tls); the state file DIR/scheme says https, and status/start probe over it.
# SNEAKERNET_REGISTRY_TLS_CLIENT_CA=PEM (with the two above) at start: require a client certificate
#   signed by that CA (http.tls.clientcas, mutual TLS); SNEAKERNET_REGISTRY_TLS_PROBE_CERT and _KEY:
#   the client certificate and key status/start probe with (kept in DIR/probe).
# SNEAKERNET_REGISTRY_TOKEN_REALM=URL at start: require bearer tokens (auth: token) from that realm,
#   with SNEAKERNET_REGISTRY_TOKEN_SERVICE (default sneakernet-test), SNEAKERNET_REGISTRY_TOKEN_ISSUER
#   (default sneakernet-test-issuer) and SNEAKERNET_REGISTRY_TOKEN_ROOTCERTS=FILE (PEM certificates whose
#   keys sign the tokens: rootcertbundle).
set -euo pipefail

die() { echo "registry.sh: $*" >&2; exit 1; }
usage() { echo "usage: $0 start NAME PORT | stop|status|purge NAME" >&2; exit 2; }

[ $# -ge 2 ] || usage
cmd=$1 name=$2
shift 2
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "bad NAME '$name' (use [A-Za-z0-9._-])"

RUN=${SNEAKERNET_RUN:-/tmp/sneakernet-run}
case $RUN in /*) ;; *) RUN=$PWD/$RUN ;; esac
DIR=$RUN/registry-$name
PIDFILE=$DIR/registry.pid
LOG=$DIR/registry.log
CONFIG=$DIR/config.yml
REGISTRY_BIN=${SNEAKERNET_REGISTRY_BIN:-/usr/bin/docker-registry}
START_TIMEOUT=30
STOP_TIMEOUT=20

SCRIPT=registry.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/procs.sh"

# Running registry pid, checked against its command line (pid reuse guard).
registry_pid() {
    local pid args
    [ -s "$PIDFILE" ] || return 1
    pid=$(tr -dc '0-9' <"$PIDFILE")
    pid_alive "$pid" || return 1
    args=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    grep -qxF -- "$CONFIG" <<<"$args" || return 1
    echo "$pid"
}

configured_port() {
    sed -n 's/^  addr: 127\.0\.0\.1:\([0-9][0-9]*\)$/\1/p' "$CONFIG" 2>/dev/null
}

configured_scheme() {
    cat "$DIR/scheme" 2>/dev/null || echo http
}

# answering PORT: GET /v2/ returns 200 (or 401); over https (certificate not checked) for a TLS registry.
answering() {
    local port=$1 code scheme
    scheme=$(configured_scheme)
    local probe=() pair=()
    [ -f "$DIR/probe" ] && mapfile -t pair <"$DIR/probe" && probe=(--cert "${pair[0]}" --key "${pair[1]}")
    if command -v curl >/dev/null; then
        code=$(curl -sk "${probe[@]}" -o /dev/null -m 5 -w '%{http_code}' "$scheme://127.0.0.1:$port/v2/") || return 1
    else
        code=$(python3 - "$port" "$scheme" "${pair[@]}" <<'EOF'
import ssl, sys, urllib.error, urllib.request
try:
    ctx = ssl._create_unverified_context()
    if len(sys.argv) > 4:
        ctx.load_cert_chain(sys.argv[3], sys.argv[4])
    with urllib.request.urlopen(f"{sys.argv[2]}://127.0.0.1:{sys.argv[1]}/v2/", timeout=5, context=ctx) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print(0)
EOF
)
    fi
    [ "$code" = 200 ] || [ "$code" = 401 ]  # 401: it answers, and wants a login (htpasswd)
}

do_start() {
    [ $# -eq 1 ] || usage
    local port=$1 pid i
    [[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] || die "bad PORT '$port'"

    if pid=$(registry_pid); then
        [ "$(configured_port)" = "$port" ] ||
            die "registry '$name' (pid $pid) already runs on port $(configured_port); stop it first"
        for ((i = 0; i < START_TIMEOUT * 4; i++)); do
            if answering "$port"; then echo "127.0.0.1:$port"; return 0; fi
            sleep 0.25
        done
        die "registry '$name' (pid $pid) runs but does not answer on 127.0.0.1:$port; see $LOG"
    fi
    [ -x "$REGISTRY_BIN" ] || die "$REGISTRY_BIN not found (apt-get install docker-registry)"
    port_in_use "$port" && die "127.0.0.1:$port is already in use by something else"

    mkdir -p "$DIR/data"
    rm -f "$PIDFILE" "$DIR/scheme" "$DIR/probe"
    cat >"$CONFIG" <<EOF
version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $DIR/data
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
  redirect:
    disable: true
http:
  addr: 127.0.0.1:$port
EOF
    if [ -n "${SNEAKERNET_REGISTRY_TLS_CERT:-}${SNEAKERNET_REGISTRY_TLS_KEY:-}" ]; then
        [ -f "${SNEAKERNET_REGISTRY_TLS_CERT:-}" ] && [ -f "${SNEAKERNET_REGISTRY_TLS_KEY:-}" ] ||
            die "SNEAKERNET_REGISTRY_TLS_CERT and _TLS_KEY: expected two PEM files, found '${SNEAKERNET_REGISTRY_TLS_CERT:-}' '${SNEAKERNET_REGISTRY_TLS_KEY:-}'"
        printf '  tls:\n    certificate: %s\n    key: %s\n' "$SNEAKERNET_REGISTRY_TLS_CERT" \
            "$SNEAKERNET_REGISTRY_TLS_KEY" >>"$CONFIG"
        if [ -n "${SNEAKERNET_REGISTRY_TLS_CLIENT_CA:-}" ]; then
            [ -f "$SNEAKERNET_REGISTRY_TLS_CLIENT_CA" ] && [ -f "${SNEAKERNET_REGISTRY_TLS_PROBE_CERT:-}" ] &&
                [ -f "${SNEAKERNET_REGISTRY_TLS_PROBE_KEY:-}" ] ||
                die "SNEAKERNET_REGISTRY_TLS_CLIENT_CA, _PROBE_CERT and _PROBE_KEY: expected three PEM files"
            printf '    clientcas:\n      - %s\n' "$SNEAKERNET_REGISTRY_TLS_CLIENT_CA" >>"$CONFIG"
            printf '%s\n%s\n' "$SNEAKERNET_REGISTRY_TLS_PROBE_CERT" "$SNEAKERNET_REGISTRY_TLS_PROBE_KEY" >"$DIR/probe"
        fi
        echo https >"$DIR/scheme"
    fi
    if [ -n "${SNEAKERNET_REGISTRY_HTPASSWD:-}" ]; then
        [ -f "$SNEAKERNET_REGISTRY_HTPASSWD" ] || die "SNEAKERNET_REGISTRY_HTPASSWD: no file $SNEAKERNET_REGISTRY_HTPASSWD"
        printf 'auth:\n  htpasswd:\n    realm: sneakernet-test\n    path: %s\n' "$SNEAKERNET_REGISTRY_HTPASSWD" >>"$CONFIG"
    fi
    if [ -n "${SNEAKERNET_REGISTRY_TOKEN_REALM:-}" ]; then
        [ -z "${SNEAKERNET_REGISTRY_HTPASSWD:-}" ] || die "SNEAKERNET_REGISTRY_HTPASSWD and _TOKEN_REALM: pick one auth"
        local certs=${SNEAKERNET_REGISTRY_TOKEN_ROOTCERTS:-}
        [ -n "$certs" ] && [ -f "$certs" ] || die "SNEAKERNET_REGISTRY_TOKEN_ROOTCERTS: no file '$certs'"
        printf 'auth:\n  token:\n    realm: "%s"\n    service: "%s"\n    issuer: "%s"\n    rootcertbundle: "%s"\n' \
            "$SNEAKERNET_REGISTRY_TOKEN_REALM" "${SNEAKERNET_REGISTRY_TOKEN_SERVICE:-sneakernet-test}" \
            "${SNEAKERNET_REGISTRY_TOKEN_ISSUER:-sneakernet-test-issuer}" "$certs" >>"$CONFIG"
    fi
    echo "=== $(date -Is) registry.sh start $name $port" >>"$LOG"
    local launcher=()
    command -v setsid >/dev/null && launcher=(setsid)
    # REGISTRY_* variables in the environment would override the config file.
    env $(env | sed -n 's/^\(REGISTRY_[A-Za-z0-9_]*\)=.*/-u \1/p') \
        "${launcher[@]}" "$REGISTRY_BIN" serve "$CONFIG" </dev/null >>"$LOG" 2>&1 &
    pid=$!
    echo "$pid" >"$PIDFILE"
    for ((i = 0; i < START_TIMEOUT * 4; i++)); do
        if answering "$port"; then echo "127.0.0.1:$port"; return 0; fi
        if ! pid_alive "$pid"; then
            echo "registry.sh: registry '$name' exited during startup; last log lines:" >&2
            tail -n 20 "$LOG" >&2 || true
            rm -f "$PIDFILE"
            exit 1
        fi
        sleep 0.25
    done
    echo "registry.sh: registry '$name' did not answer within ${START_TIMEOUT}s:" >&2
    tail -n 20 "$LOG" >&2 || true
    do_stop
    exit 1
}

do_stop() {
    local pid i
    if pid=$(registry_pid); then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
            pid_alive "$pid" || break
            sleep 0.1
        done
        if pid_alive "$pid"; then
            echo "registry.sh: registry '$name' (pid $pid) ignored TERM; sending KILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 100; i++)); do
                pid_alive "$pid" || break
                sleep 0.1
            done
            pid_alive "$pid" && die "registry '$name' (pid $pid) did not exit after KILL"
        fi
        echo "=== $(date -Is) registry.sh stopped $name (pid $pid)" >>"$LOG"
    fi
    rm -f "$PIDFILE"
}

do_status() {
    local pid port
    if pid=$(registry_pid); then
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
