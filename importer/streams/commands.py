"""Running engine CLIs without deadlocks: stdout read in chunks, stderr to a temp file,
status checked after the caller is done, the child killed if the caller stops early."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, ContextManager, Iterator, Optional, Protocol, Sequence, cast

from importer.errors import CommandFailed, EngineUnavailable
from importer.format.digest import CHUNK
from importer.streams.readers import Readable

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
def child_stdout(argv: Sequence[str], *, what: str, on_failure: Callable[[int, str], BaseException],
                 hint: Optional[str] = None, stdin_from: Optional[Readable] = None) -> Iterator[BinaryIO]:
    """The one way a child process is run with a pipe: yield its stdout as a stream (read in
    fixed-size chunks, never lines); its stdin is fed from ``stdin_from`` by a thread (so that
    reader may hash what passes), else empty; stderr goes to a temp file. The child is killed
    when the caller stops early; after a normal end a non-zero status raises
    ``on_failure(status, stderr tail)``."""
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL if stdin_from is None else subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err)
        except FileNotFoundError as e:
            raise EngineUnavailable(f"{what}: expected `{argv[0]}` on PATH, found none", hint=hint) from e
        assert proc.stdout is not None
        feeder: Optional[threading.Thread] = None
        if stdin_from is not None:
            feeder = threading.Thread(target=_feed, args=(stdin_from, proc.stdin), daemon=True)
            feeder.start()
        ok = False
        try:
            yield cast(BinaryIO, proc.stdout)
            ok = True
        finally:
            if not ok:
                proc.kill()
            proc.stdout.close()
            rc = proc.wait()
            if feeder is not None:
                feeder.join()
        if rc != 0:
            raise on_failure(rc, _tail(err))


def _feed(raw: Readable, stdin: Any) -> None:
    try:
        while True:
            chunk = raw.read(CHUNK)
            if not chunk:
                break
            stdin.write(chunk)
    except (BrokenPipeError, ValueError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


def command_stdout(argv: Sequence[str], *, what: str, hint: Optional[str] = None) -> ContextManager[BinaryIO]:
    """Yield the stdout of ``argv`` as a stream; a non-zero status raises CommandFailed."""
    return child_stdout(argv, what=what, hint=hint,
                        on_failure=lambda rc, tail: CommandFailed(argv, rc, tail, what=what, hint=hint))


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
        self.stdin = cast(BinaryIO, self.proc.stdin)  # Popen types its pipes IO[bytes]

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


class FedCommand(Protocol):
    """What :func:`feed` writes into: a :class:`StdinCommand`, or the Docker Engine API's load
    (importer/engines/dockerapi.py ``ApiLoad``)."""

    stdin: BinaryIO

    def abort(self) -> None: ...

    def finish(self) -> Result: ...


def feed(cmd: FedCommand, write: Callable[[BinaryIO], Any]) -> None:
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
