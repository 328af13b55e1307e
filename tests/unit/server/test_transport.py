"""server/transport.py: a server connection writes through the transport it has now."""

from __future__ import annotations

from pgtarn.proto import build

from .fakes import FakeTransport, logged_in_server


class OtherTransport(FakeTransport):
    """A transport of another class (as a TLS transport is to a TCP one)."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += b"<" + bytes(data) + b">"


def test_writes_go_to_the_transport_switched_to() -> None:
    server, plain = logged_in_server()
    server.write(build.SYNC)
    assert plain.take() == build.SYNC
    tls = OtherTransport()
    server._switch_transport(tls)
    server.write(build.SYNC)
    assert plain.take() == b"" and tls.take() == b"<" + build.SYNC + b">"
