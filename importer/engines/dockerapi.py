"""The Docker Engine API over its unix socket, for the two bulk streams (``docker load`` and
``docker save``), so the layers do not pass through a ``docker`` CLI process as well.

The CLI copies every byte between its stdin/stdout and the daemon's socket: about 9 CPU-seconds
for a 2.6 GiB ``docker load`` on the benchmark machine, on a 2-core host the same CPU the daemon
needs to untar (docs/benchmarks.md). Talking to the socket directly removes that copy. Used only
when the daemon is named by a ``unix://`` address (``--docker-host`` or ``$DOCKER_HOST``); any
other address (tcp with TLS, ssh, a CLI context) keeps using the ``docker`` CLI, which knows how
to reach it. ``SNEAKERNET_DOCKER_TRANSPORT=cli`` forces the CLI everywhere.

Endpoints (Docker Engine API, unversioned paths = the daemon's own version):
``POST /images/load?quiet=1`` with the docker-archive as a chunked ``application/x-tar`` body,
answered by a JSON message stream (``{"stream": ...}`` or ``{"error": ..., "errorDetail": ...}``);
``GET /images/get?names=...`` answered by the docker-archive."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import socket
import threading
from typing import BinaryIO, Iterator, List, Optional, Sequence, Tuple, cast
from urllib.parse import quote, urlencode

from importer.errors import CommandFailed, EngineUnavailable
from importer.streams.commands import Result

TRANSPORT_ENV = "SNEAKERNET_DOCKER_TRANSPORT"
_BUFFER = 256 * 1024  # small writes (tar headers, padding) are gathered up to this size
_MAX_RESPONSE = 4 * 1024 * 1024
_DEPTH = 8  # chunks (up to 1 MiB each) waiting for the sending thread


def socket_path(host: Optional[str]) -> Optional[str]:
    """The socket to use for the bulk streams of ``host``, or None to use the CLI."""
    if os.environ.get(TRANSPORT_ENV, "").lower() == "cli":
        return None
    if host and host.startswith("unix://") and len(host) > len("unix://"):
        return host[len("unix://"):]
    return None


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float] = None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _connect(path: str, what: str, hint: Optional[str]) -> UnixHTTPConnection:
    conn = UnixHTTPConnection(path)
    try:
        conn.connect()
    except OSError as e:
        conn.close()
        raise EngineUnavailable(f"{what}: expected the Docker API at unix://{path}, found none ({e})",
                                hint=hint) from e
    return conn


class _ChunkedBody:
    """A write-only file object sending HTTP/1.1 chunks: large writes go out as they are, small
    ones are gathered first. A thread of its own sends them (a bounded queue of ``_DEPTH`` chunks
    between the two), so reading, hashing and decompressing the next chunk overlaps the send of
    the last one; an error of the send is raised, as it was, by the next write or by close."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()
        self.closed = False
        self._queue: queue.Queue[Optional[bytes]] = queue.Queue(maxsize=_DEPTH)
        self._error: Optional[BaseException] = None
        self._stopped = False
        self._thread = threading.Thread(target=self._send_loop, name="docker load body", daemon=True)
        self._thread.start()

    def _send_loop(self) -> None:
        while True:
            data = self._queue.get()
            if data is None:
                return
            if self._error is not None:
                continue  # failed: take what is queued so the writer never blocks
            try:
                self._sock.sendall(b"%x\r\n" % len(data))
                self._sock.sendall(data)
                self._sock.sendall(b"\r\n")
            except BaseException as e:  # handed to the writer by the next write or by close
                self._error = e

    def _send_chunk(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(bytes(data))  # bytes(a bytes object) is that object: no copy

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = len(data)
        if not n:
            return 0
        if n >= _BUFFER:
            self.flush()
            self._send_chunk(data)
        else:
            self._buf += data
            if len(self._buf) >= _BUFFER:
                self.flush()
        return n

    def flush(self) -> None:
        if self._buf:
            self._send_chunk(self._buf)
            self._buf = bytearray()

    def stop(self) -> None:
        """Let the sending thread end (after what is queued, or at once after a failure)."""
        if not self._stopped:
            self._stopped = True
            self._queue.put(None)
        self._thread.join()

    def close(self) -> None:
        """Send what is left, then the last chunk: the body is complete."""
        if not self.closed:
            self.flush()
            self.stop()
            if self._error is not None:
                raise self._error
            self._sock.sendall(b"0\r\n\r\n")
            self.closed = True


def api_errors(raw: bytes) -> List[str]:
    """The ``error`` messages of a Docker JSON message stream (one object per line)."""
    found: List[str] = []
    for line in raw.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            found.append(line[:500])
            continue
        if isinstance(msg, dict) and (msg.get("error") or msg.get("errorDetail")):
            detail = msg.get("errorDetail")
            text = msg.get("error") or (detail.get("message") if isinstance(detail, dict) else None)
            found.append(str(text)[:500])
    return found


class ApiLoad:
    """``POST /images/load``: the same interface as engines.StdinCommand (``stdin``, ``abort``,
    ``finish``), so the docker sink streams its archive into either."""

    ARGV = ("docker-engine-api", "POST /images/load")

    def __init__(self, path: str, *, what: str, hint: Optional[str] = None) -> None:
        self.what = what
        self.hint = hint
        self.path = path
        self.conn = _connect(path, what, hint)
        self.conn.putrequest("POST", "/images/load?quiet=1", skip_accept_encoding=True)
        self.conn.putheader("Content-Type", "application/x-tar")
        self.conn.putheader("Transfer-Encoding", "chunked")
        self.conn.endheaders()
        assert self.conn.sock is not None
        self.body = _ChunkedBody(self.conn.sock)
        self.stdin = cast(BinaryIO, self.body)

    def abort(self) -> None:
        """Drop the connection before the body's last chunk: the daemon sees a cut archive
        (``manifest.json``, its last member, never arrives) and loads nothing."""
        with contextlib.suppress(OSError):
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)  # a send in progress fails at once
        self.body.stop()
        self.conn.close()

    def finish(self) -> Result:
        """End the body, read the daemon's answer; raise CommandFailed on any error in it."""
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.body.close()
            resp = self.conn.getresponse()
            raw = resp.read(_MAX_RESPONSE)
            status = resp.status
        except (OSError, http.client.HTTPException) as e:
            self.conn.close()
            raise CommandFailed(list(self.ARGV), 1, f"the connection to unix://{self.path} broke: {e}",
                                what=self.what, hint=self.hint) from e
        self.conn.close()
        errors = api_errors(raw)
        if status != 200 or errors:
            raise CommandFailed(list(self.ARGV), status if status != 200 else 1,
                                "\n".join(errors) or raw.decode("utf-8", "replace")[-2000:],
                                what=self.what, hint=self.hint)
        return Result(0, raw, "")


def api_call(path: str, method: str, url: str, *, what: str, hint: Optional[str] = None,
             limit: int = _MAX_RESPONSE) -> Tuple[int, bytes]:
    """One small request (inspect, tag, remove, list, info): (HTTP status, body read within ``limit``)."""
    conn = _connect(path, what, hint)
    try:
        conn.request(method, url)
        resp = conn.getresponse()
        return resp.status, resp.read(limit)
    except (OSError, http.client.HTTPException) as e:
        raise CommandFailed(["docker-engine-api", f"{method} {url}"], 1,
                            f"the connection to unix://{path} broke: {e}", what=what, hint=hint) from e
    finally:
        conn.close()


def api_failed(method: str, url: str, status: int, raw: bytes, *, what: str,
               hint: Optional[str] = None) -> CommandFailed:
    """The daemon's answer to a request that did not succeed, as the CLI would report it."""
    body = raw.decode("utf-8", "replace")
    try:
        message = str(json.loads(body).get("message", body))
    except (ValueError, AttributeError):
        message = body
    return CommandFailed(["docker-engine-api", f"{method} {url}"], status, message[-2000:], what=what, hint=hint)


def image_url(name: str, tail: str = "") -> str:
    """``/images/NAME[/tail]`` with NAME quoted (a reference keeps its ``/``, ``:`` and ``@``)."""
    return f"/images/{quote(name, safe='/:@')}{tail}"


@contextlib.contextmanager
def api_save(path: str, names: Sequence[str], *, what: str,
             hint: Optional[str] = None) -> Iterator[http.client.HTTPResponse]:
    """``GET /images/get?names=...``: yields the docker-archive stream. A daemon error before
    the stream starts raises CommandFailed with its message."""
    conn = _connect(path, what, hint)
    try:
        conn.request("GET", "/images/get?" + urlencode([("names", n) for n in names]))
        resp = conn.getresponse()
        if resp.status != 200:
            body = resp.read(_MAX_RESPONSE).decode("utf-8", "replace")
            try:
                message = str(json.loads(body).get("message", body))
            except (ValueError, AttributeError):
                message = body
            raise CommandFailed(["docker-engine-api", "GET /images/get", *names], resp.status, message[-2000:],
                                what=what, hint=hint)
        yield resp
    finally:
        conn.close()
