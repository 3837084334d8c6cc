"""``--json`` output of both CLIs: exactly one JSON object on stdout, success or failure.

Every document has ``"ok"``: true exactly when the command exits 0. A command that stopped on an
error prints ``{"ok": false, "error": {"id", "exitCode", "message", "context", "hint"}}`` (plus
what it knows, e.g. verification ``problems``, or the whole import receipt). Shapes:
``schemas/cli/*.schema.json``; docs/errors.md, "JSON output"."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, NoReturn

from importer.errors import BundleError, UsageError


def emit(doc: Dict[str, Any]) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    sys.stdout.flush()


def success(doc: Dict[str, Any]) -> Dict[str, Any]:
    """``doc`` with ``"ok": true`` first."""
    return {"ok": True, **{k: v for k, v in doc.items() if k != "ok"}}


def failure(err: BundleError, **extra: Any) -> Dict[str, Any]:
    return {"ok": False, "error": err.to_dict(), **extra}


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` (after the usage line on stderr) instead of
    exiting, so that a bad command line is reported like every other error, as JSON too."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(f"reading the command line of {self.prog}: {message}", hint=f"{self.prog} --help")
