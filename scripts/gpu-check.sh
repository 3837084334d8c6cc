#!/usr/bin/env bash
# Qualify this GPU host with the current Python (from a checkout): the smoke suite of
# `bundle-import smoke --no-container --device cuda`, under 8 minutes. The same as the
# `sneakernet-gpu-check` command that `pip install` puts on PATH (importer/cli/gpucheck.py).
# Exits with the suite's code: 0 pass, 11 a gate failed, 10 a required gate skipped (verdict
# candidate), 2 configuration error.
#
#   bash scripts/gpu-check.sh [RECEIPT_PATH | --receipt PATH] [more smoke flags, e.g. --gpus 0,1]
#
# PYTHON picks the interpreter (default python3); it needs a CUDA build of torch.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m importer.cli.gpucheck "$@"
