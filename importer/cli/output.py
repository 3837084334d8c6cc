"""What both CLIs (``bundle``, ``bundle-import``) print: ``--json`` output (exactly one JSON object
on stdout, success or failure) and errors on stderr (:func:`render_error`, :func:`fail`).

Every document has ``"ok"``: true exactly when the command exits 0. A command that stopped on an
error prints ``{"ok": false, "error": {"id", "exitCode", "message", "context", "hint"}}`` (plus
what it knows, e.g. verification ``problems``, or the whole import receipt). Shapes:
``schemas/cli/*.schema.json``; docs/errors.md, "JSON output"."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import textwrap
from typing import Any, Callable, Dict, Iterator, NoReturn, Optional, TextIO

from importer.errors import BundleError, InternalError, UsageError, os_error
from importer.format.text import printable, printable_block


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


def docs_folder() -> str:
    """Where the docs that --help and hints name (docs/*.md) are: installed beside a pip install
    (pyproject's shared-data), else the source tree's."""
    installed = os.path.join(sys.prefix, "share", "doc", "sneakernet", "docs")
    if os.path.isdir(installed):
        return installed
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs")
    return here if os.path.isdir(here) else "the docs/ folder of the sneakernet source (not inside bundle-import.pyz)"


def with_examples(parser: argparse.ArgumentParser, *examples: str) -> argparse.ArgumentParser:
    """``--help`` ends with ``examples:`` (each line as written) and where the docs named in it
    are, before any epilog there was."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    block = "examples:\n" + "\n".join(f"  {line}" for line in examples) + f"\n\ndocs/*.md: {docs_folder()}"
    parser.epilog = block + (f"\n\n{parser.epilog}" if parser.epilog else "")
    return parser


def problem_dict(p: object) -> Any:
    """A verification finding as JSON (a :class:`Problem`), or its text."""
    to_dict = getattr(p, "to_dict", None)
    return to_dict() if callable(to_dict) else str(p)


def render_error(e: BundleError) -> None:
    """``error[ID]: message``, the context indented, ``hint: ...`` on stderr, all escaped."""
    lines = [f"error[{e.reference}]: {printable(e.message)}"]
    if e.context:
        lines.append(textwrap.indent(printable_block(e.context), "  "))
    if e.hint:
        lines.append(f"hint: {printable(e.hint)}")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def fail(args: argparse.Namespace, e: BundleError) -> int:
    """The error on stderr and, with --json (unless the command already printed its one JSON
    document, ``args.json_done``), as the one JSON document on stdout; returns the exit code."""
    if getattr(args, "json", False) and not getattr(args, "json_done", False):
        problems = [problem_dict(p) for p in getattr(e, "problems", [])]
        emit(failure(e, **({"problems": problems} if problems else {})))
    render_error(e)
    return e.exit_code


class KeptStderr(io.TextIOBase):
    """stderr that never stops a run: a write to a closed stderr (``2>&-``) or to a pipe whose
    reader went away (EPIPE, ``| head``) is dropped, and from then on ``gone`` is true (progress
    stops: :func:`importer.streams.progress.stderr_progress`); the work, stdout and ``--json`` go on."""

    def __init__(self, inner: TextIO, gone: bool = False) -> None:
        super().__init__()
        self.inner = inner
        self.gone = gone

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.inner.write(text)
            except (OSError, ValueError):
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.inner.flush()
            except (OSError, ValueError):
                self.gone = True

    def isatty(self) -> bool:
        return not self.gone and self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()


@contextlib.contextmanager
def kept_stderr() -> Iterator[None]:
    """Run a CLI with :class:`KeptStderr` as ``sys.stderr``. A closed fd 2 gets /dev/null first:
    the next file opened would take fd 2 otherwise, and stderr lines would land in it."""
    if isinstance(sys.stderr, KeptStderr):
        yield
        return
    gone = False
    try:
        os.fstat(2)
    except OSError:
        gone = True
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 2:
            os.dup2(fd, 2)
            os.close(fd)
    before = sys.stderr
    sys.stderr = KeptStderr(before if before is not None else io.StringIO(), gone=gone or before is None)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = before


def guarded(args: argparse.Namespace, body: Callable[[], int], *, what: str,
            path: Callable[[], Optional[str]] = lambda: None,
            interrupted: Optional[Callable[[KeyboardInterrupt], BundleError]] = None) -> int:
    """Every CLI's one error boundary around ``body`` (which parses into ``args`` and runs): an
    OSError becomes the typed error naming its file (``path()``: the bundle or source), a typed
    error is printed (and with --json emitted) with its exit code, a stop (SIGINT/SIGTERM) is
    ``interrupted`` (default: stopped while ``what``), anything else an internal error; never a
    bare traceback unless --debug. A closed or broken stderr stops nothing (:func:`kept_stderr`)."""
    from importer.streams.signals import stop_error

    with kept_stderr():
        return _guarded(args, body, what, path, interrupted, stop_error)


def _guarded(args: argparse.Namespace, body: Callable[[], int], what: str, path: Callable[[], Optional[str]],
             interrupted: Optional[Callable[[KeyboardInterrupt], BundleError]],
             stop_error: Callable[[KeyboardInterrupt, str], BundleError]) -> int:
    try:
        try:
            return body()
        except OSError as e:  # a file that could not be read or written: typed, naming it
            if getattr(args, "debug", False):
                raise
            raise os_error(e, path()) from e
    except BundleError as e:
        if getattr(args, "debug", False):
            raise
        return fail(args, e)
    except KeyboardInterrupt as e:
        return fail(args, interrupted(e) if interrupted is not None else stop_error(e, what))
    except Exception as e:  # the last resort: never a bare traceback for users
        if getattr(args, "debug", False):
            raise
        return fail(args, InternalError.of(e, what))
