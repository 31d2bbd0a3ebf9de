"""A lean HTTP/1.1 keep-alive connection pool: the transport of
:class:`~agentrl.engine_client.client.EngineClient`.

Why not aiohttp's client: at thousands of episodes per rollout worker, every LLM call is one
request, and aiohttp spends about 90 µs of CPU on each (request and response objects, a
payload writer, a stream reader, its timers) against about 25 µs here, measured side by side
on one core (``bench/rollout_concurrency.py`` shows what that buys end to end). The engines
speak plain HTTP/1.1 with JSON bodies, so the subset needed is small:

* one request at a time per connection (no pipelining); connections are reused, most recently
  used first, and at most ``max_connections`` are open at once (no hidden cap: the caller sizes
  it from the spec);
* responses framed by ``Content-Length``, ``Transfer-Encoding: chunked`` or the end of the
  connection; ``Connection: close`` honoured; ``1xx`` interim responses skipped;
* ``http`` and ``https`` (system trust store); the host is resolved once per pool and again
  after a failed connect (an engine pod that restarts may come back on another address);
* a request on a *reused* connection that the server closed before sending a single byte of
  the answer (it timed the idle connection out as we sent) is sent once more on a new
  connection. A server that closes the connection without answering has not produced a
  result, so nothing is received twice.

Errors: :class:`TimeoutError` (the whole request, connect included, outlived ``timeout``),
:class:`OSError` (connect refused/reset, connection lost) and :class:`HttpProtocolError` (not
HTTP/1.x, or cut mid-response). The client turns them into its own error classes. A timed out or
cancelled request closes its connection (an answer may still be on its way).

Callers: :mod:`agentrl.engine_client.client` only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

#: Longest response head accepted (status line and headers), bytes.
MAX_HEAD_BYTES = 64 * 1024


class HttpProtocolError(Exception):
    """The peer did not answer in HTTP/1.x, or the connection ended mid-response."""


class _Stale(ConnectionError):
    """The server closed the connection before any byte of the answer arrived."""


class _Connection(asyncio.Protocol):
    """One connection; parses one response per :meth:`roundtrip`."""

    def __init__(self, on_close: Any) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._on_close = on_close
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._received = False
        # The response being read: status, Content-Length (None: chunked or until EOF),
        # chunked, keep the connection afterwards.
        self._status = 0
        self._length: int | None = None
        self._chunked = False
        self._keep = True
        self._in_body = False
        self._body = bytearray()  # de-chunked body so far

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self._on_close()
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            return
        if self._in_body and self._length is None and not self._chunked:
            waiter.set_result((self._status, bytes(self._buffer)))  # framed by EOF
        elif not self._received:
            waiter.set_exception(_Stale("the server closed the connection"))
        else:
            waiter.set_exception(HttpProtocolError("the connection ended mid-response"))

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # nothing asked: a confused server; do not reuse
            self.close()
            return
        self._received = True
        self._buffer += data
        try:
            done = self._parse()
        except (HttpProtocolError, ValueError) as exc:
            self._fail(HttpProtocolError(f"malformed HTTP response: {exc}"))
            return
        if done is not None:
            waiter, self._waiter = self._waiter, None
            if self._buffer or not self._keep:
                self.close()  # bytes nobody asked for, or the server said close
            if not waiter.done():
                waiter.set_result(done)

    # -- one exchange --------------------------------------------------------------------------

    async def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        if self.closed or self.transport is None:
            raise _Stale("the connection is closed")
        self._waiter = asyncio.get_running_loop().create_future()
        self._received = False
        self._in_body = False
        self._body.clear()
        self.transport.write(request)
        return await self._waiter

    @property
    def reusable(self) -> bool:
        return not self.closed and self._waiter is None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if not self.closed:
            self.closed = True
            self._on_close()

    def _fail(self, exc: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    # -- parsing -------------------------------------------------------------------------------

    def _parse(self) -> tuple[int, bytes] | None:
        buffer = self._buffer
        while not self._in_body:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise HttpProtocolError("response head too large")
                return None
            head = bytes(buffer[:end])
            del buffer[: end + 4]
            self._read_head(head)
        if self._chunked:
            return self._read_chunks()
        if self._length is None:
            return None  # until the server closes the connection
        if len(buffer) < self._length:
            return None
        body = bytes(buffer[: self._length])
        del buffer[: self._length]
        return self._status, body

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        if not version.startswith(b"HTTP/1."):
            raise HttpProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(rest[:3])
        if 100 <= status < 200:
            return  # an interim response; the real one follows
        length: int | None = None
        chunked = False
        keep = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                token = value.strip().lower()
                keep = token != b"close" and (keep or token == b"keep-alive")
        if status in (204, 304):
            length = 0
        if chunked:
            length = None
        elif length is None:
            keep = False  # framed by the end of the connection
        self._status, self._length, self._chunked, self._keep = status, length, chunked, keep
        self._in_body = True

    def _read_chunks(self) -> tuple[int, bytes] | None:
        buffer = self._buffer
        while True:
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                return None
            size = int(bytes(buffer[:line_end]).split(b";", 1)[0].strip(), 16)
            if size == 0:
                # The last chunk; trailers (ignored) follow and end with an empty line.
                rest = line_end + 2
                if len(buffer) < rest + 2:
                    return None
                if buffer[rest : rest + 2] == b"\r\n":
                    end = rest + 2
                else:
                    found = buffer.find(b"\r\n\r\n", rest)
                    if found < 0:
                        return None
                    end = found + 4
                del buffer[:end]
                return self._status, bytes(self._body)
            if len(buffer) < line_end + 2 + size + 2:
                return None
            self._body += buffer[line_end + 2 : line_end + 2 + size]
            del buffer[: line_end + 2 + size + 2]


class HttpPool:
    """Keep-alive connections to one HTTP origin.

    Args:
        base_url: ``http://host:port`` or ``https://host:port``, optionally with a path prefix
            that every request path is appended to.
        max_connections: most connections open at once (requests beyond wait for one).
        headers: sent with every request (``Authorization``).
    """

    def __init__(
        self, base_url: str, *, max_connections: int, headers: dict[str, str] | None = None
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        split = urlsplit(base_url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.max_connections = max_connections
        self.open_connections = 0
        """Connections open right now (in use or idle)."""
        self._tls = split.scheme == "https"
        self._host = split.hostname
        self._port = split.port or (443 if self._tls else 80)
        self._prefix = split.path.rstrip("/").encode()
        host_header = split.hostname if split.port is None else f"{split.hostname}:{split.port}"
        if ":" in split.hostname:  # an IPv6 literal
            host_header = f"[{split.hostname}]" + (f":{split.port}" if split.port else "")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head_tail = (
            f"Host: {host_header}\r\nUser-Agent: agentrl\r\nAccept: */*\r\n{extra}"
        ).encode()
        self._slots: asyncio.Semaphore | None = None
        self._idle: list[_Connection] = []
        self._addresses: list[tuple[int, tuple[Any, ...]]] = []
        self._resolving: asyncio.Future[list[tuple[int, tuple[Any, ...]]]] | None = None
        self._ssl: ssl.SSLContext | None = None
        self._closed = False

    async def request(
        self, method: str, path: str, body: bytes | None = None, *, timeout: float
    ) -> tuple[int, bytes]:
        """Send one request; ``(status, body)`` of the answer. ``body`` is sent as JSON."""
        if self._closed:
            raise ConnectionError("the pool is closed")
        if body is None:
            # A POST without a body still says so (some servers answer 411 otherwise).
            framing = b"\r\n" if method in ("GET", "HEAD") else b"Content-Length: 0\r\n\r\n"
            payload = b""
        else:
            framing = b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            payload = body
        message = b"".join(
            (
                method.encode(),
                b" ",
                self._prefix,
                path.encode(),
                b" HTTP/1.1\r\n",
                self._head_tail,
                framing,
                payload,
            )
        )
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        async with asyncio.timeout(timeout), self._slots:
            conn, reused = self._take(), True
            while True:
                if conn is None:
                    conn, reused = await self._connect(), False
                try:
                    result = await conn.roundtrip(message)
                except _Stale:
                    conn.close()
                    if reused:  # timed out while idle: once more on a new connection
                        conn = None
                        continue
                    raise ConnectionResetError("the server closed the connection") from None
                except BaseException:
                    conn.close()  # timed out, cancelled or broken: an answer may still come
                    raise
                if conn.reusable and not self._closed:
                    self._idle.append(conn)
                else:
                    conn.close()
                return result

    async def close(self) -> None:
        """Close idle connections now and the others as their requests end."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable:
                return conn
        return None

    def _closed_one(self) -> None:
        self.open_connections -= 1

    async def _resolve(self) -> list[tuple[int, tuple[Any, ...]]]:
        """The engine's addresses, ``(family, sockaddr)`` in the resolver's order: an IP
        literal as it is, a name looked up once for all the connections waiting for it (a
        worker opens hundreds at once when it starts)."""
        if self._addresses:
            return self._addresses
        if self._resolving is None or self._resolving.done():
            self._resolving = asyncio.ensure_future(self._lookup())
        # shield: one waiter cancelled must not cancel the lookup the others wait for.
        return await asyncio.shield(self._resolving)

    async def _lookup(self) -> list[tuple[int, tuple[Any, ...]]]:
        try:
            literal = ipaddress.ip_address(self._host)
        except ValueError:
            loop = asyncio.get_running_loop()
            infos = await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
            addresses: list[tuple[int, tuple[Any, ...]]] = [
                (family, tuple(sockaddr)) for family, _, _, _, sockaddr in infos
            ]
            if not addresses:
                raise OSError(f"cannot resolve {self._host}") from None
        else:
            family = socket.AF_INET if literal.version == 4 else socket.AF_INET6
            addresses = [(family, (self._host, self._port))]
        self._addresses = addresses
        return addresses

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        addresses = await self._resolve()
        if self._tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        for tried, (family, address) in enumerate(addresses, 1):
            try:
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._closed_one),
                    address[0],
                    address[1],
                    family=family,
                    ssl=self._ssl,
                    server_hostname=self._host if self._tls else None,
                )
            except OSError:
                if tried < len(addresses):
                    continue  # the next address of the name (IPv6 first, then IPv4, ...)
                self._addresses = []  # resolve again next time: the engine may have moved
                raise
            if tried > 1:  # put the address that answered first
                self._addresses = [(family, address), *addresses[: tried - 1], *addresses[tried:]]
            self.open_connections += 1
            return conn
        raise OSError(f"no address for {self._host}")  # pragma: no cover - lookups return some
