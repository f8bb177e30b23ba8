"""What one connection may take from the server, kept apart from the routes (eaglewire.serve.server):

- a whole-request deadline: the request line, headers and body must all arrive within REQUEST_DEADLINE_S of
  the server starting to wait for them (a per-read timeout lets a client sending a byte every few seconds
  hold its thread forever);
- a per-connection budget: after MAX_REQUESTS_PER_CONNECTION requests or MAX_CONNECTION_BYTES read, the
  connection is closed after its current answer;
- at the connection cap, the connection that has been reading its request the longest is answered 408 and
  closed to make room, so clients that trickle bytes (reconnecting in a loop) cannot lock out ones that send
  whole requests;
- a half-closed client (it shut down its sending side after a complete request) is answered; one that is
  gone (FIN or reset, before or after the answer's head) is told apart by the reset its kernel sends back to a
  harmless probe (an interim `100 Continue`, a stream's SSE comment), while its job still waits (PeerWatch).
"""

from __future__ import annotations

import io
import select
import socket
import threading
import time
from typing import Any

REQUEST_DEADLINE_S = 30.0  # request line + headers + body of one request (a 1 MiB body at 1 Mbit/s: 8 s)
MAX_REQUESTS_PER_CONNECTION = 1000
MAX_CONNECTION_BYTES = 256 << 20  # 256 bodies of the 1 MiB cap
# A full server closes the connection that has been reading one request the longest, if it has been at it this
# long. 0: any. A floor above 0 lets clients that reconnect in a loop keep every slot younger than it, locking
# out whole requests; at 0, the one evicted is the slowest reader (a whole request is read in milliseconds).
EVICT_AFTER_S = 0.0
_TCP_CLOSE = 7  # Linux tcp_info state: the peer answered with a reset (its socket is closed)


class ConnectionTable:
    """The connections now reading a request, oldest first: what the server evicts when it is full."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reading: dict[socket.socket, float] = {}  # socket -> when its current request's read began

    def begin(self, sock: socket.socket) -> None:
        with self.lock:
            self.reading[sock] = time.monotonic()

    def end(self, sock: socket.socket) -> None:
        with self.lock:
            self.reading.pop(sock, None)

    def evict_oldest(self, older_than: float = EVICT_AFTER_S) -> bool:
        """Close the connection that has been reading one request the longest, if over `older_than` seconds."""
        with self.lock:
            if not self.reading:
                return False
            sock, began = min(self.reading.items(), key=lambda kv: kv[1])
            if time.monotonic() - began < older_than:
                return False
            del self.reading[sock]
        try:  # an answer, not a bare reset; never blocking the accepting thread on a client that does not read
            sock.send(
                _response(
                    408, "the request was not complete when the server, full, needed its connection; retry", "timeout"
                ),
                socket.MSG_DONTWAIT,
            )
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_RDWR)  # its blocked read returns: the handler's thread ends
        except OSError:
            pass
        return True


class RequestReader(io.RawIOBase):
    """The socket as the handler's rfile: between `begin()` and `end()` every read waits at most until the
    request's deadline (not a fresh timeout per read); bytes read are counted for the connection's budget."""

    def __init__(self, sock: socket.socket, table: ConnectionTable | None, idle_timeout: float | None) -> None:
        super().__init__()
        self.sock, self.table, self.idle_timeout = sock, table, idle_timeout
        self.deadline: float | None = None
        self.bytes = 0

    def begin(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        if self.table is not None:
            self.table.begin(self.sock)

    def end(self) -> None:
        """The request is read: writes get the ordinary per-operation timeout again."""
        self.deadline = None
        if self.table is not None:
            self.table.end(self.sock)
        try:
            self.sock.settimeout(self.idle_timeout)
        except OSError:
            pass

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request was not received within its deadline")
            self.sock.settimeout(left)
        n = self.sock.recv_into(buf)
        self.bytes += n
        return n


PROBE = b"HTTP/1.1 100 Continue\r\n\r\n"  # an interim answer: HTTP/1.1 clients skip any number before the final one


class PeerWatch:
    """Whether the client of the request being answered is still there, checked while it waits.

    Readable with nothing to read means the client shut down its sending side: a half-close still waiting for
    its answer, or a closed socket (FIN); the two look the same until something is written. So the first time,
    a harmless probe is written: an interim `100 Continue` before the answer (HTTP/1.1), an SSE comment line
    once a stream's head is out (clients skip both). A closed socket answers the probe with a reset, seen at the
    next check; a half-closed client is answered in full. Where no harmless bytes exist (an HTTP/1.0 answer not
    yet started, a plain answer whose head is out), end of input is taken as gone: such a client cannot be told
    apart, and one that left must not hold the queue. A pipelined next request is readable too: that client is
    still there."""

    def __init__(self, sock: socket.socket, interim_ok: bool) -> None:
        self.sock, self.half_closed = sock, False
        self.probe: bytes | None = PROBE if interim_ok else None  # the harmless bytes to write now, if any
        self.probed = False  # a probe went out after the end of input was seen: a reset now means gone

    def answer_started(self, probe: bytes | None = None) -> None:
        """Bytes of the answer went out (they probe a socket closed before them); `probe`: harmless bytes the
        answer may still carry (a stream's SSE comment), None where the answer's next bytes are its body."""
        self.probe = probe

    def gone(self) -> bool:
        try:
            ready, _, _ = select.select([self.sock], [], [], 0)
            if not ready or self.sock.recv(1, socket.MSG_PEEK) != b"":
                return False
            self.half_closed = True  # no next request can come: close after this answer
            if _reset(self.sock):
                return True
            if self.probed:
                return False  # probed, no reset back: a half-closed client still waiting for its answer
            if self.probe is None:
                return True  # nothing harmless to write: a half-close and a FIN look the same, and both are done
            self.probed = True
            self.sock.sendall(self.probe)
            return False
        except OSError:
            return True


SSE_PROBE = b": waiting\n\n"  # an SSE comment line: event-stream clients skip it


def _response(status: int, message: str, kind: str) -> bytes:
    """A whole JSON error answer that closes the connection (written outside the handler's routes)."""
    import json
    from http import HTTPStatus

    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    return (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def refuse_busy(sock: socket.socket) -> None:
    """The 503 a connection over the cap gets (then it is closed), rather than a reset."""
    try:
        sock.sendall(_response(503, "too many open connections; retry later", "server_busy"))
    except OSError:
        pass


def _reset(sock: socket.socket) -> bool:
    """Whether the peer reset the connection (Linux: the TCP state; elsewhere: a pending socket error)."""
    if hasattr(socket, "TCP_INFO"):
        try:
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == _TCP_CLOSE
        except OSError:
            return True
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0
