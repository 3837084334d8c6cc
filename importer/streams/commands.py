"""Running engine CLIs without deadlocks: stdout read in chunks, stderr to a temp file,
status checked after the caller is done, the child killed if the caller stops early."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator, Optional, Sequence

from importer.errors import CommandFailed, EngineUnavailable

STDERR_TAIL = 4096


def _tail(f: Any) -> str:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - STDERR_TAIL))
    data: bytes = f.read()
    return data.decode("utf-8", "replace")


def require_binary(name: str, *, hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise EngineUnavailable(f"looking for the `{name}` command: expected it on PATH, found none", hint=hint)
    return path


@dataclass
class Result:
    returncode: int
    stdout: bytes
    stderr: str


def run(argv: Sequence[str], *, what: str, check: bool = True, timeout: Optional[float] = 600,
        limit: int = 256 * 1024 * 1024, hint: Optional[str] = None) -> Result:
    """Run a command to completion, capturing bounded stdout (to a temp file) and stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                  timeout=timeout, check=False)
        except FileNotFoundError as e:
            raise EngineUnavailable(f"{what}: expected `{argv[0]}` on PATH, found none", hint=hint) from e
        except subprocess.TimeoutExpired as e:
            raise CommandFailed(argv, -1, f"timed out after {timeout} s", what=what, hint=hint) from e
        out.seek(0)
        data = out.read(limit + 1)
        if len(data) > limit:
            raise CommandFailed(argv, proc.returncode, f"printed more than {limit} bytes", what=what)
        tail = _tail(err)
        if check and proc.returncode != 0:
            raise CommandFailed(argv, proc.returncode, tail, what=what, hint=hint)
        return Result(proc.returncode, data, tail)


@contextlib.contextmanager
def command_stdout(argv: Sequence[str], *, what: str, hint: Optional[str] = None) -> Iterator[BinaryIO]:
    """Yield the stdout of ``argv`` as a stream (read fixed-size chunks, never lines)."""
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        except FileNotFoundError as e:
            raise EngineUnavailable(f"{what}: expected `{argv[0]}` on PATH, found none", hint=hint) from e
        assert proc.stdout is not None
        ok = False
        try:
            yield proc.stdout  # type: ignore[misc]
            ok = True
        finally:
            if not ok:
                proc.kill()
            proc.stdout.close()
            rc = proc.wait()
        if rc != 0:
            raise CommandFailed(argv, rc, _tail(err), what=what, hint=hint)


class StdinCommand:
    """A running command fed through its stdin; stdout and stderr go to temp files."""

    def __init__(self, argv: Sequence[str], *, what: str, hint: Optional[str] = None) -> None:
        self.argv = list(argv)
        self.what = what
        self.hint = hint
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 - closed in finish()/abort()
        self._err = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=self._out, stderr=self._err)
        except FileNotFoundError as e:
            self._out.close()
            self._err.close()
            raise EngineUnavailable(f"{what}: expected `{argv[0]}` on PATH, found none", hint=hint) from e
        assert self.proc.stdin is not None
        self.stdin: BinaryIO = self.proc.stdin  # type: ignore[assignment]

    def abort(self) -> None:
        """Kill the command before it sees the end of its input (nothing is committed)."""
        self.proc.kill()
        with contextlib.suppress(OSError):
            self.stdin.close()
        self.proc.wait()
        self._out.close()
        self._err.close()

    def finish(self) -> Result:
        """Close stdin, wait, and raise CommandFailed on a non-zero status."""
        with contextlib.suppress(BrokenPipeError):
            self.stdin.close()
        rc = self.proc.wait()
        self._out.seek(0)
        out = self._out.read(1024 * 1024)
        tail = _tail(self._err)
        self._out.close()
        self._err.close()
        if rc != 0:
            raise CommandFailed(self.argv, rc, tail, what=self.what, hint=self.hint)
        return Result(rc, out, tail)


def feed(cmd: Any, write: Callable[[BinaryIO], Any]) -> None:
    """Run ``write(cmd.stdin)``, then finish ``cmd`` (a StdinCommand or dockerapi.ApiLoad). When
    the consumer hangs up early, ``finish`` raises CommandFailed with its own words; any other
    failure aborts the consumer before it sees the end of its input, so it commits nothing."""
    try:
        write(cmd.stdin)
    except (BrokenPipeError, ConnectionResetError):
        cmd.finish()
        raise
    except BaseException:
        cmd.abort()
        raise
    cmd.finish()
