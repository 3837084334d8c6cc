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
# validate every exported index, manifest, config and layout against (tests/oci_schemas.py).
PACKAGES=(docker.io containerd skopeo zstd busybox-static docker-registry openssh-server podman g++
          golang-github-opencontainers-image-spec-dev)

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
echo "install-deps.sh: ok ($(python3 --version), $(dockerd --version 2>/dev/null | cut -d, -f1))"
