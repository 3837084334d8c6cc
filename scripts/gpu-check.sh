#!/usr/bin/env bash
# Qualify this GPU host with the current Python: the smoke suite of `bundle-import smoke`
# with --no-container --device cuda (host/NVML, compat, torch, bf16 matmul, torch.compile,
# fused AdamW, NCCL all-reduce over every visible GPU, clean shutdown). Prints the receipt,
# then a one-line summary; exits with the suite's code (0 pass, 1 a gate failed, 10 a required
# gate skipped: verdict candidate, 2 configuration error). Bounded to under 8 minutes.
#
#   bash scripts/gpu-check.sh [RECEIPT_PATH] [more smoke flags, e.g. --gpus 0,1 --env NCCL_NVLS_ENABLE=0]
#
# Needs python3 (3.8+) with a CUDA build of torch; the host gate reads NVML through
# nvidia-ml-py (pynvml) when installed, else through nvidia-smi. Nothing is installed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

receipt=${1:-$(mktemp -d -t sneakernet-gpu-check.XXXXXX)/qualification.json}
[ $# -gt 0 ] && shift
PYTHON=${PYTHON:-python3}

echo "gpu-check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)" >&2
command -v nvidia-smi >/dev/null && nvidia-smi -L >&2 || echo "gpu-check: no nvidia-smi on PATH" >&2

rc=0
# --timeout bounds the suite (its children are killed past it); `timeout` is the last resort.
timeout -k 10 470 "$PYTHON" -m importer smoke --no-container --device cuda --timeout 400 --rank-timeout 240 \
    --receipt "$receipt" "$@" >&2 || rc=$?

if [ -s "$receipt" ]; then
    cat "$receipt"
    "$PYTHON" - "$receipt" <<'PY' >&2
import json, sys
r = json.load(open(sys.argv[1]))
gpus = ", ".join(g["name"] for g in r["host"]["gpus"]) or "no GPU"
print(f"gpu-check: verdict {r['verdict']} (exit {r['exitCode']}); driver {r['host']['driverVersion']} "
      f"(CUDA {r['host']['cudaDriverVersion']}); {gpus}")
for g in r["gates"]:
    print(f"  {g['name']:<10} {g['status']:<5} {g['error'] or g['detail']}")
PY
else
    echo "gpu-check: no receipt was written (exit $rc); see the errors above" >&2
fi
exit "$rc"
