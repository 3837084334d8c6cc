#!/usr/bin/env bash
# The README's first command: install what is needed, then show the whole path once.
# Builds a small image FROM scratch in a private, loopback-only dockerd, exports it into a
# schema-3 bundle, removes it from the engine, imports it with the bundle's own importer
# (python3 -I bundle-import.pyz) and prints the verification table. Stops the dockerd by pid.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$(pwd)

bash docker/scripts/install-deps.sh

export SNEAKERNET_RUN=${SNEAKERNET_RUN:-/tmp/sneakernet-demo}
work=$(mktemp -d /tmp/sneakernet-demo-work.XXXXXX)
cleanup() {
    bash "$repo/docker/scripts/dockerd.sh" stop demo >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

DOCKER_HOST=$(bash docker/scripts/dockerd.sh start demo)
export DOCKER_HOST DOCKER_BUILDKIT=0
echo "== private dockerd at $DOCKER_HOST"

mkdir -p "$work/ctx"
cp /bin/busybox "$work/ctx/busybox"
head -c 32M /dev/urandom >"$work/ctx/weights.bin"
cat >"$work/ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY weights.bin /opt/model/weights.bin
RUN echo "trained on the other side of the gap" > /opt/model/README && ln -s /opt/model /model
DOCKERFILE
docker build -q --network none -t demo/train:1 "$work/ctx" 2>/dev/null
echo "== built demo/train:1 ($(docker image inspect --format '{{.Id}}' demo/train:1))"

echo "== bundle export demo/train:1 --schema 3 -o $work/train.bundle"
bundle export demo/train:1 --schema 3 -o "$work/train.bundle"
(cd "$work/train.bundle" && sha256sum -c --quiet SHA256SUMS && echo "== sha256sum -c SHA256SUMS: OK")

docker image rm demo/train:1 >/dev/null
echo "== removed demo/train:1 from the engine; importing with the bundle's own importer"
python3 -I "$work/train.bundle/bundle-import.pyz" "$work/train.bundle" --verify \
    --receipt "$work/receipt.json"
echo "== the engine holds it again:"
docker run --rm --pull never --network none demo/train:1 cat /model/README
echo "== receipt ($work/receipt.json): result=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["result"])' "$work/receipt.json")"
