"""A minimal blocking protocol client for tests that need to see raw messages."""

from __future__ import annotations

import socket
import struct

from pgtarn.proto import build


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
