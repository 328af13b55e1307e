"""net.sockets: socket tuning, addresses, host lists, and the CancelRequest sent on a new
connection."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from collections.abc import Callable
from typing import Any, cast

import pytest
import uvloop

from pgtarn.config.settings import Config, DatabaseEntry
from pgtarn.net import sockets
from pgtarn.net.accept import SocketServer
from pgtarn.proto import build

from ..server.fakes import FakeTransport


class FakeSocket:
    def __init__(self, family: int) -> None:
        self.family = family
        self.options: list[tuple[int, int, int]] = []

    def setsockopt(self, level: int, name: int, value: int) -> None:
        self.options.append((level, name, value))


def test_tune_sets_keepalive_on_tcp_only() -> None:
    transport = FakeTransport()
    tcp = FakeSocket(socket.AF_INET)
    transport.extra["socket"] = tcp
    assert sockets.tune(transport, keepalive=True)
    assert tcp.options == [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    quiet = FakeSocket(socket.AF_INET6)
    transport.extra["socket"] = quiet
    assert sockets.tune(transport, keepalive=False)
    assert quiet.options == []
    unix = FakeSocket(socket.AF_UNIX)
    transport.extra["socket"] = unix
    assert not sockets.tune(transport, keepalive=True)
    assert unix.options == []


def _config(**settings: Any) -> Config:
    return dataclasses.replace(Config(), **settings)


def test_tcp_options_of_the_network_settings() -> None:
    assert sockets.tcp_options(Config()) == ()  # every one at 0: the system's values
    tcp, sol = socket.IPPROTO_TCP, socket.SOL_SOCKET
    assert sockets.tcp_options(_config(tcp_keepidle=77, tcp_keepintvl=5, tcp_keepcnt=3)) == (
        (tcp, socket.TCP_KEEPIDLE, 77),
        (tcp, socket.TCP_KEEPINTVL, 5),
        (tcp, socket.TCP_KEEPCNT, 3),
    )
    # without keepalive the keepalive timings mean nothing, as in PgBouncer
    assert sockets.tcp_options(_config(tcp_keepalive=False, tcp_keepidle=77)) == ()
    assert sockets.tcp_options(_config(tcp_user_timeout=2500, tcp_socket_buffer=65536)) == (
        (tcp, socket.TCP_USER_TIMEOUT, 2500),
        (sol, socket.SO_SNDBUF, 65536),
        (sol, socket.SO_RCVBUF, 65536),
    )


def test_tune_sets_the_tcp_options() -> None:
    transport = FakeTransport()
    tcp = FakeSocket(socket.AF_INET)
    transport.extra["socket"] = tcp
    options = sockets.tcp_options(_config(tcp_keepidle=77, tcp_user_timeout=2500))
    assert sockets.tune(transport, True, options)
    assert tcp.options == [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1), *options]
    unix = FakeSocket(socket.AF_UNIX)
    transport.extra["socket"] = unix
    assert not sockets.tune(transport, True, options)
    assert unix.options == []


async def _sockopts(
    level: int, name: int, configure: Callable[[asyncio.AbstractServer], None] = lambda server: None
) -> tuple[int, int]:
    """An option of both ends of a connection the running loop made (accepted, connected),
    its listener first given to configure."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.BaseTransport] = loop.create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.set_result(transport)

    server = await loop.create_server(Accept, "127.0.0.1", 0)
    configure(server)
    port = server.sockets[0].getsockname()[1]
    connected, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    ours = await accepted
    try:
        return tuple(t.get_extra_info("socket").getsockopt(level, name) for t in (ours, connected))
    finally:
        connected.close()
        ours.close()
        server.close()


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_event_loops_set_nodelay_themselves(loop_factory: Callable[[], Any]) -> None:
    """tune leaves TCP_NODELAY to the event loop: both loops pgtarn runs on set it."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        assert all(runner.run(_sockopts(socket.IPPROTO_TCP, socket.TCP_NODELAY)))


def _keepalive_listener(keepalive: bool) -> Callable[[asyncio.AbstractServer], None]:
    def configure(server: asyncio.AbstractServer) -> None:
        # keepalive_listeners reads only a server's sockets, which asyncio's server has too
        listener = cast(SocketServer, server)
        sockets.keepalive_listeners([listener], not keepalive)
        sockets.keepalive_listeners([listener], keepalive)  # as a RELOAD would

    return configure


@pytest.mark.parametrize("keepalive", [True, False])
def test_accepted_sockets_keep_the_listeners_keepalive(keepalive: bool) -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        accepted, _connected = runner.run(
            _sockopts(socket.SOL_SOCKET, socket.SO_KEEPALIVE, _keepalive_listener(keepalive))
        )
        assert accepted == int(keepalive)


def test_address() -> None:
    assert sockets.address(("10.0.0.1", 6432)) == "10.0.0.1:6432"
    assert sockets.address("/tmp/.s.PGSQL.5432") == "/tmp/.s.PGSQL.5432"
    assert sockets.address("") == "unix"
    assert sockets.address(None) == "unix"


class FakePostgres:
    """A listening socket that takes CancelRequests as the postmaster does: reads one, and
    closes once the test lets it (close_now) or never (hang)."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.close_now = asyncio.Event()
        self.port = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.received.append(await reader.read(16))
        await self.close_now.wait()
        writer.close()

    def stop(self) -> None:
        assert self.server is not None
        self.server.close()


def test_a_cancel_is_over_only_when_postgresql_closes_its_connection() -> None:
    async def run() -> None:
        pg = FakePostgres()
        await pg.start()
        cancel = asyncio.ensure_future(
            sockets.send_cancel_request(
                ("127.0.0.1", pg.port), 11, 22, _config(cancel_wait_timeout=10.0), lambda: True
            )
        )
        while not pg.received:
            await asyncio.sleep(0.01)
        assert pg.received == [build.cancel_request(11, 22)]
        for _ in range(5):  # sent, not answered yet: not over
            await asyncio.sleep(0.01)
            assert not cancel.done()
        pg.close_now.set()
        assert await cancel is True
        pg.stop()

    asyncio.run(run())


def test_a_cancel_no_longer_wanted_once_connected_sends_nothing() -> None:
    async def run() -> None:
        pg = FakePostgres()
        pg.close_now.set()
        await pg.start()
        assert (
            await sockets.send_cancel_request(
                ("127.0.0.1", pg.port), 11, 22, _config(), lambda: False
            )
            is True
        )
        while not pg.received:
            await asyncio.sleep(0.01)
        assert pg.received == [b""]  # closed with nothing sent
        pg.stop()

    asyncio.run(run())


def test_a_cancel_sent_and_never_answered_is_not_over(caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> bool:
        pg = FakePostgres()  # never closes
        await pg.start()
        try:
            return await sockets.send_cancel_request(
                ("127.0.0.1", pg.port), 11, 22, _config(cancel_wait_timeout=0.2), lambda: True
            )
        finally:
            pg.close_now.set()
            pg.stop()

    with caplog.at_level(logging.WARNING, logger="pgtarn.server"):
        assert asyncio.run(run()) is False  # it may still land
    assert "failed: cancel_wait_timeout (0.2 s)" in caplog.text


def test_a_cancel_that_cannot_connect_was_never_sent(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # (bound, not listening: refused)
        with caplog.at_level(logging.WARNING, logger="pgtarn.server"):
            assert (
                asyncio.run(
                    sockets.send_cancel_request(
                        ("127.0.0.1", port), 11, 22, _config(), lambda: True
                    )
                )
                is True
            )
    assert "cancel request to 127.0.0.1:" in caplog.text


def test_a_cancel_that_cannot_connect_is_logged_with_its_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    timeouts: list[float] = []

    async def fake_connect(
        target: sockets.Target, factory: Callable[[], asyncio.Protocol], timeout: float
    ) -> None:
        timeouts.append(timeout)
        raise TimeoutError

    monkeypatch.setattr(sockets, "connect_to", fake_connect)
    with caplog.at_level(logging.WARNING, logger="pgtarn.server"):
        assert asyncio.run(
            sockets.send_cancel_request(
                ("127.0.0.1", 5432),
                11,
                22,
                _config(cancel_wait_timeout=0.0, server_connect_timeout=7.0),
                lambda: True,
            )
        )
    assert timeouts == [7.0]
    assert "cancel_wait_timeout (0: server_connect_timeout, 7 s)" in caplog.text


# --- host lists (load_balance_hosts) ------------------------------------------------------------


def _listed(load_balance: str | None = None) -> DatabaseEntry:
    return DatabaseEntry(
        "db",
        host="a",
        hosts=("a", "b", "c"),
        port=5432,
        ports=(5432, 5433, 5434),
        load_balance_hosts=load_balance,
    )


def test_targets_pair_hosts_with_their_ports_and_default_to_the_socket_dir() -> None:
    assert sockets.targets(_listed()) == [("a", 5432), ("b", 5433), ("c", 5434)]
    one_port = DatabaseEntry("db", host="a", hosts=("a", "b"), port=6000)
    assert sockets.targets(one_port) == [("a", 6000), ("b", 6000)]
    assert sockets.targets(DatabaseEntry("db", port=5000), "/run/pg") == [("/run/pg", 5000)]


def test_round_robin_moves_on_after_every_connection() -> None:
    chooser = sockets.HostChooser()
    db = _listed()
    assert chooser.order(db) == [0, 1, 2]
    chooser.used(db, 0, True)
    assert chooser.order(db) == [1, 2, 0]
    chooser.used(db, 2, True)  # 1 was skipped (unreachable), 2 connected
    assert chooser.order(db) == [0, 1, 2]


def test_disable_keeps_the_host_that_worked_until_it_fails() -> None:
    chooser = sockets.HostChooser()
    db = _listed("disable")
    chooser.used(db, 1, True)
    assert chooser.order(db) == [1, 2, 0]
    chooser.used(db, 1, True)
    assert chooser.order(db) == [1, 2, 0]
    chooser.used(db, 1, False)  # none could connect, starting at 1: start at 2 next time
    assert chooser.order(db) == [2, 0, 1]


def test_open_connection_skips_hosts_that_cannot_be_reached() -> None:
    """A refused host and an unresolvable one are skipped; the one that listens connects,
    and the chooser starts after it next time."""

    async def scenario() -> tuple[sockets.Target, list[int]]:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        refused = closed.getsockname()[1]
        closed.close()
        db = DatabaseEntry(
            "db",
            host="127.0.0.1",
            hosts=("127.0.0.1", "no-such-host.invalid", "127.0.0.1"),
            port=refused,
            ports=(refused, 5432, port),
        )
        chooser = sockets.HostChooser()
        transports: list[asyncio.BaseTransport] = []

        class Grab(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                transports.append(transport)
                transport.close()

        target = await sockets.open_connection(db, Grab, 5.0, chooser=chooser)
        server.close()
        return target, chooser.order(db)

    target, order = asyncio.run(scenario())
    assert target[0] == "127.0.0.1" and target[1] != 5432
    assert order == [0, 1, 2]  # after host 2: back to the first


def test_open_connection_raises_the_last_error_when_no_host_connects() -> None:
    async def scenario() -> None:
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        refused = closed.getsockname()[1]
        closed.close()
        db = DatabaseEntry("db", host="127.0.0.1", hosts=("127.0.0.1", "127.0.0.1"), port=refused)
        await sockets.open_connection(db, asyncio.Protocol, 5.0, chooser=sockets.HostChooser())

    with pytest.raises(OSError):
        asyncio.run(scenario())


@pytest.mark.parametrize(
    ("attrs", "standby", "read_only", "fits"),
    [
        ("read-write", "off", "off", True),
        ("read-write", "off", "on", False),
        ("read-write", "on", "off", False),
        ("read-only", "off", "on", True),
        ("read-only", "on", "off", True),
        ("read-only", "off", "off", False),
        ("primary", "off", "on", True),
        ("primary", "on", "off", False),
        ("standby", "on", "off", True),
        ("standby", "off", "off", False),
        ("prefer-standby", "on", "off", True),
        ("prefer-standby", "off", "off", False),
        ("any", "on", "on", True),
    ],
)
def test_role_fits_as_libpq_reads_the_reported_parameters(
    attrs: str, standby: str, read_only: str, fits: bool
) -> None:
    params = {"in_hot_standby": standby, "default_transaction_read_only": read_only}
    assert sockets.role_fits(attrs, params) is fits


def test_a_server_that_reports_no_role_fits_any_attrs() -> None:  # before PostgreSQL 14
    assert sockets.role_fits("read-write", {}) and sockets.role_fits("standby", {})


def test_hosts_that_did_not_fit_are_tried_last_until_they_fit_again() -> None:
    db = DatabaseEntry("db", host="a", hosts=("a", "b", "c"), port=5432)
    chooser = sockets.HostChooser()
    chooser.mark(db, 0, False)
    assert chooser.order(db) == [1, 2, 0]
    chooser.mark(db, 0, True)
    assert chooser.order(db) == [0, 1, 2]
