#!/usr/bin/env bash
# Install what the test suite needs on Debian 12 (run as root), then the project
# itself with its dev extra. Idempotent: apt is skipped when every package is
# already installed. Quiet on success; on failure prints the captured output.
#
# Services are NOT started by the packages: a temporary policy-rc.d denies it
# (the system dockerd would create a docker0 bridge and iptables rules; tests run
# their own loopback-only daemons via docker/scripts/dockerd.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

# g++: torch.compile (inductor) on the CPU in the smoke-suite tests.
# golang-github-opencontainers-image-spec-dev: the OCI image-spec's JSON Schemas, which the tests
# validate every exported index, manifest, config and layout against (tests/kit/oci_schemas.py).
# openssl, curl: `serve --tls-self-signed` makes its certificates with openssl, and curl --cacert
# proves a served CA verifies (tests/test_serve_tls.py); registry.sh probes registries with curl.
PACKAGES=(docker.io containerd skopeo zstd busybox-static docker-registry openssh-server podman g++
          golang-github-opencontainers-image-spec-dev openssl curl dosfstools)

log=$(mktemp -t sneakernet-install.XXXXXX)
policy_created=
cleanup() {
    [ -z "$policy_created" ] || rm -f /usr/sbin/policy-rc.d
    rm -f "$log"
}
trap cleanup EXIT

fail() {
    echo "install-deps.sh: $1 failed; output:" >&2
    sed 's/^/  | /' "$log" >&2
    exit 1
}

# (No `dpkg -s | grep -q` pipe: under pipefail grep's early exit SIGPIPEs dpkg.)
installed() {
    local out
    out=$(dpkg -s "$1" 2>/dev/null) || return 1
    grep -qx 'Status: install ok installed' <<<"$out"
}

missing=()
for p in "${PACKAGES[@]}"; do
    installed "$p" || missing+=("$p")
done
# A fresh Debian 12 may lack python3/pip altogether.
python_pkgs=()
command -v python3 >/dev/null || python_pkgs+=(python3)
if ! python3 -m pip --version >/dev/null 2>&1; then
    python_pkgs+=(python3-pip)
fi
missing+=("${python_pkgs[@]}")

if [ ${#missing[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "install-deps.sh: must run as root to install: ${missing[*]}" >&2; exit 1; }
    echo "install-deps.sh: apt-get install ${missing[*]}"
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        policy_created=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >"$log" 2>&1 || fail "apt-get update"
    apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" "${python_pkgs[@]}" \
        >"$log" 2>&1 || fail "apt-get install"
    for p in "${PACKAGES[@]}"; do
        installed "$p" || { echo "install-deps.sh: $p still not installed" >&2; exit 1; }
    done
fi

# Docker with the containerd image store (docs/engines.md): Debian 13's docker.io (dockerd 26.x)
# and containerd (1.7.x) run on Debian 12 (they need glibc 2.34; Debian 12's runc stays, Debian
# 13's needs glibc 2.38). Fetched with `apt-get download` through a trixie sources list kept in a
# folder of its own (the system's apt lists, cache and sources are untouched) and unpacked with
# `dpkg -x` into $TRIXIE_DOCKER; skipped when already there at these versions.
TRIXIE_DOCKER=${SNEAKERNET_TRIXIE_DOCKER:-/opt/sneakernet/trixie-docker}
TRIXIE_PACKAGES=(docker.io containerd)
TRIXIE_WANT="docker.io=26.1.5 containerd=1.7.24"

# The Debian archive the system's apt already uses (a `deb` line or a deb822 `URIs:` field of a
# bookworm main-archive entry), so no other host is contacted.
debian_mirror() {
    local f line uri
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        while read -r line; do
            # deb [options] URI SUITE COMPONENTS...
            [[ $line =~ ^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+bookworm[[:space:]] ]] || continue
            echo "${BASH_REMATCH[2]}"; return 0
        done <"$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # One stanza per paragraph: a URIs field in the stanza whose Suites name bookworm.
        uri=$(awk 'BEGIN { RS = ""; FS = "\n" }
            { u = ""; s = 0
              for (i = 1; i <= NF; i++) {
                if ($i ~ /^URIs:/) { u = $i; sub(/^URIs:[ \t]*/, "", u); sub(/[ \t].*$/, "", u) }
                if ($i ~ /^Suites:/ && $i ~ /(^|[ \t])bookworm([ \t]|$)/) s = 1
              }
              if (s && u != "") { print u; exit } }' "$f")
        [ -n "$uri" ] && { echo "$uri"; return 0; }
    done
    return 1
}

trixie_have() {
    local v1 v2
    v1=$("$TRIXIE_DOCKER/usr/sbin/dockerd" --version 2>/dev/null) || return 1
    v2=$("$TRIXIE_DOCKER/usr/bin/containerd" --version 2>/dev/null) || return 1
    [[ $v1 == *"version 26.1.5"* ]] && [[ $v2 == *" 1.7.24"* ]]
}

# fetch_trixie DEST CHECK PACKAGE...: Debian 13's PACKAGEs unpacked into DEST (apt-get download
# through a private trixie sources list, then dpkg -x), unless the command CHECK already succeeds;
# CHECK must succeed afterwards.
fetch_trixie() {
    local dest=$1 check=$2 mirror work deb
    shift 2
    "$check" && return 0
    [ "$(id -u)" = 0 ] || { echo "install-deps.sh: must run as root to fetch Debian 13's $*" >&2; exit 1; }
    mirror=$(debian_mirror) || { echo "install-deps.sh: no bookworm entry in /etc/apt/sources.list* to find the Debian mirror" >&2; exit 1; }
    echo "install-deps.sh: fetching Debian 13 $* into $dest"
    work="$dest.apt"
    rm -rf "$work" "$dest.new"
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs" "$dest.new"
    printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$mirror" >"$work/trixie.sources"
    local apt_opts=(-q -o "Dir::Etc::sourcelist=$work/trixie.sources" -o Dir::Etc::sourceparts=-
                    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
                    -o APT::Sandbox::User=root)
    apt-get "${apt_opts[@]}" update >"$log" 2>&1 || fail "apt-get update (trixie, private lists)"
    (cd "$work/debs" && apt-get "${apt_opts[@]}" download "$@") >"$log" 2>&1 || fail "apt-get download $* (trixie)"
    for deb in "$work"/debs/*.deb; do
        dpkg -x "$deb" "$dest.new" >"$log" 2>&1 || fail "dpkg -x $deb"
    done
    rm -rf "$dest"
    mv "$dest.new" "$dest"
    rm -rf "$work"
    "$check" || { echo "install-deps.sh: $dest does not hold working $* after unpacking" >&2; exit 1; }
}
fetch_trixie "$TRIXIE_DOCKER" trixie_have "${TRIXIE_PACKAGES[@]}"

# Debian 13's cosign (2.5) and oras (1.2; neither in Debian 12): the supply-chain tests sign images
# in a loopback registry with the real cosign (docs/supply-chain.md), the files tests pull carried
# files with the real oras from serve, a registry and an OCI layout (docs/files.md). Fetched the
# same way, into a folder of their own (both at once: the folder is replaced whole).
TRIXIE_TOOLS=${SNEAKERNET_TRIXIE_TOOLS:-/opt/sneakernet/trixie-tools}
tools_have() {
    "$TRIXIE_TOOLS/usr/bin/cosign" version >/dev/null 2>&1 && "$TRIXIE_TOOLS/usr/bin/oras" version >/dev/null 2>&1
}
fetch_trixie "$TRIXIE_TOOLS" tools_have cosign oras

pip_args=(-q --disable-pip-version-check --root-user-action=ignore)
# Debian's own python3 is "externally managed" (PEP 668); this script is meant for
# throwaway CI machines, so install into it anyway.
if python3 -c 'import sys, sysconfig, os; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    pip_args+=(--break-system-packages)
fi
python3 -m pip install "${pip_args[@]}" -e '.[dev]' >"$log" 2>&1 || fail "pip install -e .[dev]"
# torch for the smoke-suite tests (docs/qualification.md): the CPU wheel, skipped when present.
TORCH_VERSION=2.13.0
if ! python3 -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" >/dev/null 2>&1; then
    python3 -m pip install "${pip_args[@]}" "torch==$TORCH_VERSION" >"$log" 2>&1 || fail "pip install torch==$TORCH_VERSION"
fi
echo "install-deps.sh: ok ($(python3 --version), $(dockerd --version 2>/dev/null | cut -d, -f1)," \
     "containerd store: $("$TRIXIE_DOCKER/usr/sbin/dockerd" --version 2>/dev/null | cut -d, -f1))"
