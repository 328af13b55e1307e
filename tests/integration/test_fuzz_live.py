"""Random and mutated client input thrown at a running pgtarn, before, during and after login.

Every connection must end in a defined state: after the junk the client half-closes, and
pgtarn must answer with well-formed messages only (any ErrorResponse with a severity and a
SQLSTATE) and then close, within the socket timeout (no hang). Afterwards no client is
left behind, no server is stuck, and a real driver is served.
"""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgtarn.proto import build

from ..unit.proto.fuzzing import mutated
from .conftest import PgtarnFactory
from .pgstat import wait_until
from .rawpg import RawClient, error_fields
from .test_admin import admin, pool_row, show
from .test_bad_input import still_serves
from .test_timeouts import raw_login

pytestmark = pytest.mark.integration

LIVE = settings(
    max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

BACKEND_TYPES = frozenset(b"RSKZEN123CDTInstAvcdGHWV")
STARTUP = build.startup_message({"user": "app", "database": "app"})
SASL_INITIAL = build.message(
    b"p", b"SCRAM-SHA-256\x00" + struct.pack("!I", 32) + b"n,,n=,r=abcdefghijklmnopqrstuvw"
)
FRONTEND = [
    build.query("select 1"),
    build.query("select 'a'; select 2"),
    build.message(b"P", b"s\x00select $1::int\x00\x00\x01\x00\x00\x00\x17"),
    build.message(b"B", b"\x00s\x00\x00\x00\x00\x01\x00\x00\x00\x013\x00\x00"),
    build.message(b"D", b"Ss\x00"),
    build.message(b"E", b"\x00\x00\x00\x00\x00"),
    build.message(b"C", b"Ss\x00"),
    build.message(b"H", b""),
    build.SYNC,
    build.message(b"d", b"junk"),
    build.message(b"f", b"nope\x00"),
]

junk_bytes = st.binary(max_size=300)


@st.composite
def frontend_stream(draw: st.DrawFn) -> bytes:
    """A few real frontend messages in a row, then maybe mutated."""
    stream = b"".join(draw(st.lists(st.sampled_from(FRONTEND), min_size=1, max_size=6)))
    return draw(st.one_of(st.just(stream), mutated(stream)))


def parse_replies(data: bytes) -> list[tuple[int, bytes]]:
    """pgtarn's answer as messages; single 'N' bytes (SSLRequest refusals) allowed first."""
    for skip in range(4):
        try:
            return _frames(data[skip:])
        except AssertionError:
            if data[skip : skip + 1] != b"N":
                raise
    return _frames(data)


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 5, f"half a header: {data[pos:]!r}"
        msg_type = data[pos]
        length = struct.unpack_from("!I", data, pos + 1)[0]
        assert msg_type in BACKEND_TYPES and length >= 4, data[pos : pos + 16]
        assert pos + 1 + length <= len(data), "half a message"
        out.append((msg_type, data[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    return out


def run_to_end(raw: RawClient, junk: bytes) -> None:
    """Send junk, half-close, read to the end: pgtarn must close, answering sanely."""
    try:
        raw.send(junk)
        raw.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # pgtarn already closed on an early part of the junk: its answer is still read
    received = b""
    try:
        while chunk := raw.sock.recv(65536):  # a hang raises TimeoutError: the test fails
            received += chunk
    except ConnectionResetError:
        pass  # closed with our junk unread: a close all the same
    finally:
        raw.close()
    for msg_type, body in parse_replies(received):
        if msg_type == ord("E"):
            fields = error_fields(body)
            assert fields.get("S") in ("ERROR", "FATAL") and len(fields.get("C", "")) == 5


def test_random_and_mutated_input_at_a_running_pgtarn(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"max_packet_size": 65536, "default_pool_size": 3})

    @LIVE
    @given(junk=st.one_of(junk_bytes, mutated(STARTUP)))
    def before_startup(junk: bytes) -> None:
        run_to_end(RawClient(proc.host, proc.port, timeout=10), junk)

    @LIVE
    @given(junk=st.one_of(junk_bytes, mutated(SASL_INITIAL), frontend_stream()))
    def during_auth(junk: bytes) -> None:
        raw = RawClient(proc.host, proc.port, timeout=10)
        raw.send(STARTUP)
        assert raw.read_message()[0] == "R"
        run_to_end(raw, junk)

    @LIVE
    @given(junk=st.one_of(junk_bytes, frontend_stream()))
    def after_login(junk: bytes) -> None:
        run_to_end(raw_login(proc), junk)

    before_startup()
    during_auth()
    after_login()

    def settled() -> bool:
        with admin(proc) as console:
            row = pool_row(console)
            clients = len(show(console, "CLIENTS")) - 1  # the console itself
        return clients == 0 and row["cl_active"] == 0 and row["sv_active"] == 0

    wait_until(settled, what="no client left and no server stuck")
    still_serves(proc)
