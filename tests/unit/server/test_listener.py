"""The listener connection with fake transports: LISTENs sent and confirmed, notifications
handed on, losses and retries."""

from __future__ import annotations

import logging
import time

import pytest

from pgtarn.config.inifile import parse_config
from pgtarn.pool.channels import ChannelBoard
from pgtarn.pool.failing import FIRST_RETRY_DELAY
from pgtarn.pool.pool import PooledServer
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.proto.messages import parse_startup
from pgtarn.server.listener import APPLICATION_NAME, Listener, _ListenerConnection

from ..pool.fakes import FakeSubscriber
from .fakes import INI, WELCOME, CountingRuntime, FakeTransport

HOSTILE = 'a"; drop table x; --'


def listen_reply() -> bytes:
    return build.command_complete("LISTEN") + build.ready_for_query(b"I")


def unlisten_reply() -> bytes:
    return build.command_complete("UNLISTEN") + build.ready_for_query(b"I")


def notification(pid: int, channel: str, payload: str) -> bytes:
    """A NotificationResponse as PostgreSQL sends it."""
    return build.message(b"A", pid.to_bytes(4, "big") + build.cstr(channel) + build.cstr(payload))


class Setup:
    """A pool of a runtime whose listener connections are real Listeners; connecting only
    counts (the test plays the socket)."""

    def __init__(self, extra: str = "") -> None:
        self.runtime = CountingRuntime(
            parse_config(INI.format(mode="transaction", prepared=0) + extra), {}
        )
        registry = self.runtime.registry
        registry.open_listener = lambda pool, db, board: Listener(self.runtime, pool, db, board)
        self.pool = registry.get_pool(self.runtime.config.databases["app"], "u")
        assert self.pool.board is not None
        self.board: ChannelBoard = self.pool.board

    @property
    def connects(self) -> int:
        return self.runtime.connects

    def listen(self, client: FakeSubscriber, *channels: str) -> bool:
        """client now listens to channels (instead of what it listened to)."""
        old = frozenset(
            channel for channel, clients in self.board.subscribers.items() if client in clients
        )
        return self.board.update(client, old, frozenset(channels), time.monotonic())

    @property
    def listener(self) -> Listener:
        link = self.board.link
        assert isinstance(link, Listener)
        return link

    def connection(self) -> tuple[_ListenerConnection, FakeTransport]:
        """The listener's connection now, connected (its StartupMessage taken)."""
        conn = self.listener.conn
        assert conn is not None
        transport = FakeTransport()
        conn.connection_made(transport)
        assert transport.take()[:4] != b""
        return conn, transport

    def logged_in(self) -> tuple[_ListenerConnection, FakeTransport]:
        conn, transport = self.connection()
        conn.data_received(WELCOME)
        assert conn.ready
        return conn, transport


def test_the_first_channel_opens_the_listener_which_logs_in_under_its_own_name() -> None:
    setup = Setup()
    assert setup.board.link is None and setup.connects == 0
    setup.listen(FakeSubscriber("c"), "a")
    assert setup.connects == 1 and setup.board.open_links == 1
    conn = setup.listener.conn
    assert conn is not None and not conn.ready
    transport = FakeTransport()
    conn.connection_made(transport)
    params = parse_startup(transport.take()[4:]).params
    assert params["application_name"] == APPLICATION_NAME
    assert params["user"] == "u" and params["database"] == "appdb"


def test_after_login_each_channel_is_listened_to_in_its_own_query_quoted() -> None:
    setup = Setup()
    setup.listen(FakeSubscriber("c"), HOSTILE, "b")
    conn, transport = setup.connection()
    assert transport.take() == b""  # nothing before the login
    conn.data_received(WELCOME)
    assert transport.take() == (
        build.query('LISTEN "a""; drop table x; --"') + build.query('LISTEN "b"')
    )


def test_each_ready_for_query_confirms_the_oldest_listen_in_flight() -> None:
    setup = Setup()
    early, late = FakeSubscriber("early"), FakeSubscriber("late")
    assert not setup.listen(early, "a")
    conn, transport = setup.logged_in()
    assert not setup.listen(late, "a", "b")
    assert split_messages(transport.take()) == [
        (ord("Q"), b'LISTEN "a"\x00'),
        (ord("Q"), b'LISTEN "b"\x00'),
    ]
    conn.data_received(listen_reply())
    assert setup.board.listened == {"a"}
    assert early.confirmations == [""] and late.confirmations == []
    conn.data_received(listen_reply()[:3])
    assert setup.board.listened == {"a"}
    conn.data_received(listen_reply()[3:])
    assert setup.board.listened == {"a", "b"} and late.confirmations == [""]
    conn.data_received(build.ready_for_query(b"I"))  # nothing in flight: ignored
    assert setup.board.listened == {"a", "b"} and not setup.listener.in_flight


def test_a_channel_no_client_wants_is_unlistened() -> None:
    setup = Setup()
    client = FakeSubscriber("c")
    setup.listen(client, "a", "b")
    conn, transport = setup.logged_in()
    conn.data_received(listen_reply() * 2)
    transport.take()
    setup.listen(client, "b")
    assert transport.take() == build.query('UNLISTEN "a"')
    conn.data_received(unlisten_reply())
    assert setup.board.listened == {"b"} and setup.listener.on_server == {"b"}


def test_a_failed_listen_is_logged_and_the_channel_not_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    setup = Setup()
    setup.listen(FakeSubscriber("c"), "bad", "good")
    conn, _transport = setup.logged_in()
    with caplog.at_level(logging.WARNING, logger="pgtarn.listener"):
        conn.data_received(
            build.error_response("0A000", "cannot execute LISTEN here")
            + build.ready_for_query(b"I")
            + listen_reply()
        )
    assert 'LISTEN "bad" failed: 0A000 cannot execute LISTEN here' in caplog.text
    assert setup.listener.on_server == {"good"}
    assert conn.error == ""  # the next reply is not taken for a failure
    assert "good" in setup.board.listened


def test_a_failed_listen_is_not_confirmed_to_the_board() -> None:
    setup = Setup()
    client = FakeSubscriber("c")
    setup.listen(client, "bad")
    conn, _transport = setup.logged_in()
    conn.data_received(
        build.error_response("0A000", "cannot execute LISTEN here") + build.ready_for_query(b"I")
    )
    assert "bad" not in setup.board.listened
    assert "" not in client.confirmations


def test_a_notification_is_handed_to_the_board_byte_for_byte() -> None:
    setup = Setup()
    on_a, on_b = FakeSubscriber("a"), FakeSubscriber("b")
    setup.listen(on_a, "a")
    setup.listen(on_b, "b")
    conn, _transport = setup.logged_in()
    conn.data_received(listen_reply() * 2)
    first = notification(4242, "a", "héllo\x01")
    second = notification(7, "b", "")
    stream = first + second
    conn.data_received(stream[:9])
    conn.data_received(stream[9:])
    assert on_a.notified == [first] and on_b.notified == [second]
    assert setup.board.received == 2


def test_a_lost_connection_warns_the_clients_and_reconnects_after_the_backoff() -> None:
    setup = Setup()
    client = FakeSubscriber("c")
    setup.listen(client, "a", "b")
    conn, _transport = setup.logged_in()
    conn.data_received(listen_reply() * 2)
    listener = setup.listener
    conn.connection_lost(ConnectionResetError("gone"))
    assert client.losses == 1 and setup.board.reconnects == 1
    assert listener.conn is None and setup.board.listened == set()
    assert listener.on_server == set() and not listener.in_flight
    assert setup.board.open_links == 1  # still counted: it comes back
    assert setup.connects == 1
    setup.board.tick(listener.retry_at - FIRST_RETRY_DELAY / 2, 60.0, 0.0)
    assert setup.connects == 1 and listener.conn is None
    setup.board.tick(listener.retry_at, 60.0, 0.0)
    assert setup.connects == 2
    conn, transport = setup.logged_in()
    assert transport.take() == build.query('LISTEN "a"') + build.query('LISTEN "b"')
    conn.data_received(listen_reply() * 2)
    assert setup.board.listened == {"a", "b"} and not setup.board.lost
    assert client.losses == 1


def test_failed_logins_back_off_longer_each_time() -> None:
    setup = Setup()
    setup.listen(FakeSubscriber("c"), "a")
    listener = setup.listener
    delays = []
    for attempt in range(3):
        conn, transport = setup.connection()
        before = time.monotonic()
        conn.data_received(build.error_response("28P01", "password authentication failed", "FATAL"))
        assert transport.closing and listener.conn is None
        assert listener.failures == attempt + 1
        delays.append(listener.retry_at - before)
        setup.board.tick(listener.retry_at, 60.0, 0.0)
    assert delays[0] < delays[1] < delays[2] <= setup.pool.retry_cap + 0.01
    assert setup.connects == 4


def test_a_login_that_takes_too_long_is_given_up_and_retried() -> None:
    setup = Setup()
    setup.listen(FakeSubscriber("c"), "a")
    listener = setup.listener
    conn, transport = setup.connection()
    setup.board.tick(conn.created_at + setup.pool.connect_timeout + 1, 3600.0, 0.0)
    assert transport.closing and listener.conn is None and listener.failures == 1


def test_restart_reconnects_at_once_and_close_ends_it_for_good() -> None:
    setup = Setup()
    client = FakeSubscriber("c")
    setup.listen(client, "a")
    conn, transport = setup.logged_in()
    assert transport.take() == build.query('LISTEN "a"')
    conn.data_received(listen_reply())
    setup.board.restart("reconnect requested")
    assert transport.take() == build.TERMINATE and transport.closing
    assert client.losses == 1 and setup.connects == 2
    conn, transport = setup.logged_in()
    assert transport.take() == build.query('LISTEN "a"')
    listener = setup.listener
    setup.board.close("shutdown")
    assert transport.take() == build.TERMINATE and transport.closing
    assert listener.closed and listener.conn is None
    listener.tick(time.monotonic() + 3600)
    assert setup.connects == 2


def test_no_connection_at_max_db_connections_until_there_is_room() -> None:
    setup = Setup("max_db_connections = 1\n")
    busy = PooledServer()  # (a server in use: all the limit counts of it)
    setup.pool.active.add(busy)
    setup.listen(FakeSubscriber("c"), "a")
    listener = setup.listener
    assert setup.connects == 0 and listener.conn is None and listener.retry_at > 0
    setup.pool.active.discard(busy)
    setup.board.tick(listener.retry_at, 60.0, 0.0)
    assert setup.connects == 1 and listener.conn is not None
