"""Bad input from clients, before and after login: a clear error or a close, others served."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from pgtarn.proto import build
from pgtarn.proto.server_login import ServerAuth
from tests.support import PgtarnProcess

from .conftest import PgtarnFactory
from .drivers import connect
from .pgstat import wait_until
from .rawpg import RawClient, error_fields
from .test_admin import admin, show
from .test_timeouts import raw_login

pytestmark = pytest.mark.integration

MAX_PACKET = 65536
V3 = 196608  # protocol 3.0


def client_count(proc: PgtarnProcess) -> int:
    """Clients pgtarn holds, the console's own connection left out."""
    with admin(proc) as console:
        return len(show(console, "CLIENTS")) - 1


def rss_kb(proc: PgtarnProcess) -> int:
    with open(f"/proc/{proc.proc.pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def refused_with(raw: RawClient, sqlstate: str) -> dict[str, str]:
    """The ErrorResponse pgtarn answers with, then the close; its fields."""
    try:
        msg_type, body = raw.read_message()
        assert msg_type == "E", (msg_type, body)
        fields = error_fields(body)
        assert fields["C"] == sqlstate, fields
        with pytest.raises(ConnectionError):
            raw.read_message()
        return fields
    finally:
        raw.close()


def still_serves(proc: PgtarnProcess) -> None:
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("select 42").fetchone() == (42,)


# --- before login -----------------------------------------------------------------------


@pytest.mark.parametrize("length", [0, 4, 7, 0xFFFFFFFF, 0x80000000, MAX_PACKET + 1])
def test_startup_packet_lengths_that_are_impossible_or_too_big(
    pgtarn_factory: PgtarnFactory, length: int
) -> None:
    proc = pgtarn_factory(settings={"max_packet_size": MAX_PACKET})
    raw = RawClient(proc.host, proc.port)
    raw.send(struct.pack("!II", length, V3))
    fields = refused_with(raw, "08P01")
    assert "invalid startup packet length" in fields["M"]
    still_serves(proc)


def test_truncated_startup_packets_leave_nothing_behind(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    baseline = client_count(proc)
    packet = build.startup_message({"user": "app", "database": "app"})
    for cut in (1, 3, 4, 7, len(packet) - 1):
        raw = RawClient(proc.host, proc.port)
        raw.send(packet[:cut])
        raw.close()  # gone before the rest: nothing to answer
    still_serves(proc)
    wait_until(lambda: client_count(proc) == baseline, what="half-started clients forgotten")


def test_unknown_protocol_versions(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    for major, minor in ((2, 0), (4, 0), (0xFFFF, 0xFFFF)):
        raw = RawClient(proc.host, proc.port)
        body = struct.pack("!HH", major, minor) + b"user\x00app\x00\x00"
        raw.send(struct.pack("!I", len(body) + 4) + body)
        fields = refused_with(raw, "0A000")
        assert fields["S"] == "FATAL" and "unsupported frontend protocol" in fields["M"]
    # 3.x with a newer minor version: NegotiateProtocolVersion names 3.0 (the whole version
    # number, as PostgreSQL sends it) and the unknown _pq_ option, first of all, then the
    # login goes on as usual
    raw = RawClient(proc.host, proc.port)
    params = b"user\x00app\x00database\x00app\x00_pq_.future\x00on\x00\x00"
    body = struct.pack("!HH", 3, 7) + params
    raw.send(struct.pack("!I", len(body) + 4) + body)
    assert raw.read_message() == ("v", struct.pack("!II", 3 << 16, 1) + b"_pq_.future\x00")
    login = ServerAuth("app", "app_pass")
    while not login.done:
        msg_type, body = raw.read_message()
        assert msg_type != "v"  # once only
        reply = login.feed(ord(msg_type), body)
        if reply:
            raw.send(reply)
    raw.send(build.query("select 1"))
    assert raw.read_until("Z")[-1] == ("Z", b"I")
    raw.close()


def test_messages_before_authentication_completes(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    for early in (build.query("select 1"), build.SYNC, b"p\x00\x00\x00\x04"):
        raw = RawClient(proc.host, proc.port)
        raw.startup(user="app", database="app")
        assert raw.read_message()[0] == "R"  # asked for SCRAM
        raw.send(early)
        refused_with(raw, "08P01")
    still_serves(proc)


def test_oversized_password_message_is_refused_before_it_is_read(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory()
    raw = RawClient(proc.host, proc.port)
    raw.startup(user="app", database="app")
    assert raw.read_message()[0] == "R"
    raw.send(b"p" + struct.pack("!I", 50_000_000))  # only the header: nothing is waited for
    fields = refused_with(raw, "08P01")
    assert "invalid message length" in fields["M"]


# --- after login -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        b"Q" + struct.pack("!I", MAX_PACKET + 1),
        b"Q" + struct.pack("!I", 2),
        b"Q" + struct.pack("!I", 0xFFFFFFF0),
        b"D" + struct.pack("!I", 0x80000000),
    ],
)
def test_bad_message_lengths_after_login(pgtarn_factory: PgtarnFactory, header: bytes) -> None:
    proc = pgtarn_factory(settings={"max_packet_size": MAX_PACKET, "default_pool_size": 1})
    raw = raw_login(proc)
    raw.send(header)
    fields = refused_with(raw, "08P01")
    assert "invalid message length" in fields["M"]
    still_serves(proc)  # the pool's one server was not left with half a message


def test_message_type_postgresql_does_not_know(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    raw = raw_login(proc)
    raw.send(b"y\x00\x00\x00\x04")
    errors = []
    with pytest.raises(ConnectionError):
        while True:
            msg_type, body = raw.read_message()
            assert msg_type == "E"
            errors.append(error_fields(body))
    raw.close()
    # PostgreSQL's own FATAL, relayed (then maybe pgtarn's 08006 as that server closes)
    assert (errors[0]["S"], errors[0]["C"]) == ("FATAL", "08P01")
    assert "invalid frontend message type" in errors[0]["M"]
    still_serves(proc)  # on a new server: that one was closed


def test_client_that_never_reads_its_results_is_held_back_not_buffered(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    still_serves(proc)
    before = rss_kb(proc)
    raw = raw_login(proc)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # about 400 MB of rows that are never read
    raw.send(build.query("select repeat('x', 1000000) from generate_series(1, 400)"))
    samples = []
    for _ in range(10):
        time.sleep(0.2)
        samples.append(rss_kb(proc))
        still_serves(proc)  # meanwhile everyone else is served, on the other server
    assert max(samples) - before < 40_000, (before, samples)  # KB: bounded, not 400 MB
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()  # gone for good: its server is closed, and the pool has room again
    with connect(proc) as a, connect(proc) as b:  # two transactions at once: both servers
        assert a.execute("select 1").fetchone() == (1,)
        assert b.execute("select 2").fetchone() == (2,)


def test_statement_mode_parse_split_inside_its_name(pgtarn_factory: PgtarnFactory) -> None:
    # The BEGIN pre-check used to raise IndexError on a Parse cut before its name's NUL.
    proc = pgtarn_factory(settings={"pool_mode": "statement"})
    raw = raw_login(proc)
    parse = build.message(b"P", b"named_one\x00select 7\x00\x00\x00")
    bind = build.message(b"B", b"\x00named_one\x00\x00\x00\x00\x00\x00\x00")
    execute = build.message(b"E", b"\x00\x00\x00\x00\x00")
    raw.send(parse[:8])
    time.sleep(0.1)  # its own packet
    raw.send(parse[8:] + bind + execute + build.SYNC)
    replies = raw.read_until("Z")
    assert [t for t, _ in replies] == ["1", "2", "D", "C", "Z"], replies
    assert replies[2][1] == b"\x00\x01\x00\x00\x00\x017"
    raw.close()


@pytest.mark.parametrize(
    "message",
    [
        build.message(b"D", b"Snamed_one"),  # the name has no terminator
        build.message(b"C", b"S"),
        build.message(b"P", b"named_one\x00select 1"),  # nor has the query
        build.message(b"B", b"\x00named_one"),
    ],
)
def test_statement_message_without_its_string_terminator(
    pgtarn_factory: PgtarnFactory, message: bytes
) -> None:
    # Transaction mode rewrites statement messages: a Describe whose name had no NUL used to
    # raise ValueError inside the relay (a traceback, the client cut off without a word).
    proc = pgtarn_factory(settings={"pool_mode": "transaction", "default_pool_size": 1})
    raw = raw_login(proc)
    raw.send(message + build.SYNC)
    fields = refused_with(raw, "08P01")
    assert fields["M"] == "missing string terminator", fields
    still_serves(proc)
