"""A minimal blocking protocol client for tests that need to see raw messages."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct

from pgtarn.errors import PgtarnError
from pgtarn.proto import build
from pgtarn.proto.server_login import ServerAuth


class RawClient:
    """Speaks just enough of the protocol to inspect what pgtarn sends."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)

    @classmethod
    def unix(cls, path: str, timeout: float = 10.0) -> RawClient:
        self = cls.__new__(cls)
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        return self

    @classmethod
    def direct_tls(
        cls,
        host: str,
        port: int,
        context: ssl.SSLContext,
        server_hostname: str = "localhost",
        timeout: float = 10.0,
    ) -> RawClient:
        """Connected with TLS from the first byte (PostgreSQL 17's direct TLS)."""
        self = cls.__new__(cls)
        sock = socket.create_connection((host, port), timeout=timeout)
        self.sock = context.wrap_socket(sock, server_hostname=server_hostname)
        return self

    def start_tls(self, context: ssl.SSLContext, server_hostname: str = "localhost") -> None:
        """SSLRequest; on 'S', go on over TLS."""
        self.send(build.SSL_REQUEST)
        answer = self.recv_exact(1)
        if answer != b"S":
            raise ConnectionError(f"TLS refused: {answer!r}")
        self.sock = context.wrap_socket(self.sock, server_hostname=server_hostname)

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("connection closed")
            out += chunk
        return out

    def read_message(self) -> tuple[str, bytes]:
        header = self.recv_exact(5)
        length = struct.unpack("!I", header[1:])[0]
        return chr(header[0]), self.recv_exact(length - 4)

    def startup(self, **params: str) -> None:
        self.send(build.startup_message(params))

    def read_until(self, msg_type: str) -> list[tuple[str, bytes]]:
        """Messages up to and including the first of msg_type (or an ErrorResponse)."""
        out = []
        while True:
            msg = self.read_message()
            out.append(msg)
            if msg[0] in (msg_type, "E"):
                return out


def error_fields(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.split(b"\x00"):
        if part:
            fields[chr(part[0])] = part[1:].decode()
    return fields


class AsyncRawClient:
    """A light asyncio client for tests that open thousands of connections.

    Logs in with pgtarn's own client-side login (ServerAuth speaks the frontend side of a
    PostgreSQL login) and runs simple queries, returning rows as text.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.backend_key: tuple[int, int] = (0, 0)

    @classmethod
    async def connect(
        cls, host: str, port: int, user: str, password: str, dbname: str
    ) -> AsyncRawClient:
        reader, writer = await asyncio.open_connection(host, port)
        self = cls(reader, writer)
        login = ServerAuth(user, password)
        writer.write(build.startup_message({"user": user, "database": dbname}))
        while not login.done:
            msg_type, body = await self.read_message()
            reply = login.feed(msg_type, body)
            if reply:
                writer.write(reply)
        self.backend_key = login.backend_key
        return self

    async def read_message(self) -> tuple[int, bytes]:
        header = await self.reader.readexactly(5)
        length = struct.unpack("!I", header[1:])[0]
        return header[0], await self.reader.readexactly(length - 4)

    async def query(self, sql: str) -> list[list[str | None]]:
        """Run one simple query; rows as text; raise PgtarnError on an ErrorResponse."""
        self.writer.write(build.query(sql))
        rows: list[list[str | None]] = []
        error: PgtarnError | None = None
        while True:
            msg_type, body = await self.read_message()
            if msg_type == 0x44:  # DataRow
                rows.append(_data_row(body))
            elif msg_type == 0x45:
                fields = error_fields(body)
                error = PgtarnError(fields.get("M", ""), sqlstate=fields.get("C", ""))
            elif msg_type == 0x5A:
                if error is not None:
                    raise error
                return rows

    async def close(self) -> None:
        self.writer.write(build.TERMINATE)
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def _data_row(body: bytes) -> list[str | None]:
    count = struct.unpack("!H", body[:2])[0]
    pos = 2
    out: list[str | None] = []
    for _ in range(count):
        size = struct.unpack("!i", body[pos : pos + 4])[0]
        pos += 4
        if size < 0:
            out.append(None)
        else:
            out.append(body[pos : pos + size].decode())
            pos += size
    return out
