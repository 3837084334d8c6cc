# Shared by the daemon helpers (dockerd.sh, containerd.sh, registry.sh, sshd.sh): process and
# mount handling by pid and by path, never by name. The caller sets SCRIPT (for messages), DIR
# (the instance's state folder), PIDFILE, STOP_TIMEOUT, STRAY_EXES (globs of executables a
# hard-killed instance may leave behind) and defines die().
# shellcheck shell=bash

# pid_alive PID: true when PID exists and is not a zombie.
pid_alive() {
    local pid=$1 state
    [ -n "$pid" ] && [ -e "/proc/$pid" ] || return 1
    state=$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$pid/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# pid_mentions_dir PID: PID's command line contains DIR (guards against pid reuse).
pid_mentions_dir() {
    local pid=$1 args
    args=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    grep -qF -- "$DIR/" <<<"$args"
}

read_pid() {
    local f=$1 pid
    [ -s "$f" ] || return 1
    pid=$(tr -dc '0-9' <"$f")
    [ -n "$pid" ] || return 1
    echo "$pid"
}

# Current daemon pid for this instance, if it is alive and really ours.
daemon_pid() {
    local pid
    pid=$(read_pid "$PIDFILE") || return 1
    pid_alive "$pid" && pid_mentions_dir "$pid" || return 1
    echo "$pid"
}

# terminate PID LABEL: TERM, wait STOP_TIMEOUT s, then KILL and wait.
terminate() {
    local pid=$1 label=$2 i
    pid_alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    echo "$SCRIPT: $label (pid $pid) ignored TERM for ${STOP_TIMEOUT}s; sending KILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        pid_alive "$pid" || return 0
        sleep 0.1
    done
    die "$label (pid $pid) did not exit after KILL"
}

# Engine processes (executables matching one of the globs in STRAY_EXES) whose command line
# names DIR: what a hard-killed daemon can leave behind. Other processes that merely mention
# DIR (a shell, `tail -f DIR/...log`) are never touched.
stray_pids() {
    local p pid exe
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        exe=$(readlink "$p/exe" 2>/dev/null) || continue
        is_stray_exe "${exe##*/}" || continue
        pid_alive "$pid" && pid_mentions_dir "$pid" && echo "$pid"
    done
    return 0
}

# Mount points at or below DIR, innermost/most recent first.
mounts_under_dir() {
    local target
    awk '{ print $5 }' /proc/self/mountinfo | tac | while IFS= read -r target; do
        target=$(printf '%b' "$target")   # mountinfo escapes space etc. as \040
        case $target in "$DIR" | "$DIR"/*) printf '%s\n' "$target" ;; esac
    done
}

unmount_all() {
    local target pass left
    for pass in 1 2 3; do
        left=0
        while IFS= read -r target; do
            [ -n "$target" ] || continue
            left=1
            umount "$target" 2>/dev/null || { [ "$pass" -ge 2 ] && umount -l "$target" 2>/dev/null; } || true
        done < <(mounts_under_dir)
        [ "$left" = 1 ] || return 0
    done
    if [ -n "$(mounts_under_dir)" ]; then
        echo "$SCRIPT: still mounted under $DIR:" >&2
        mounts_under_dir >&2
        return 1
    fi
}

is_stray_exe() {
    local name=$1 pattern
    for pattern in ${STRAY_EXES:-}; do
        # shellcheck disable=SC2254
        case $name in $pattern) return 0 ;; esac
    done
    return 1
}

port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}
