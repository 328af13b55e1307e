"""LISTEN/NOTIFY in transaction and statement mode: pgtarn answers a client's LISTEN and UNLISTEN
itself and relays notifications from one listening server connection per (database, user)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtarn.proto import build
from pgtarn.proto.server_login import ServerAuth
from tests.support import PgtarnProcess, TempCluster, free_port

from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .pgstat import PeakBackends, superuser_connect, wait_for
from .rawpg import RawClient, error_fields
from .test_admin import admin, show
from .test_metrics import scrape
from .test_reload import edit_ini

Conn = psycopg.Connection[Any]
Notification = tuple[str, str]
"""(channel, payload)"""

WAIT = 10.0
"""Deadline (seconds) for what should arrive: a notification, a notice, a changed SHOW row."""

QUERY_WAIT = 5
"""query_wait_timeout: where the only server is held by a listener (no feature), the next client
gets an error after this many seconds instead of hanging the test."""

LISTENER_APP = "pgtarn listener"
"""application_name of pgtarn's listening server connection."""


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def start(pgtarn_factory: PgtarnFactory, **settings: object) -> Any:
    """pgtarn in transaction mode with a pool of one server."""
    base: dict[str, object] = {
        "pool_mode": "transaction",
        "default_pool_size": 1,
        "query_wait_timeout": QUERY_WAIT,
    }
    return pgtarn_factory(settings={**base, **settings})


def client(proc: PgtarnProcess, **kw: Any) -> Conn:
    """An autocommit psycopg client that never prepares on its own (plain Query messages)."""
    return connect(proc, autocommit=True, prepare_threshold=None, **kw)


def listen(conn: Conn, *channels: str) -> None:
    for channel in channels:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def notify(conn: Conn, channel: str, payload: str) -> None:
    conn.execute("select pg_notify(%s, %s)", (channel, payload))


def collect(
    conn: Conn, enough: Callable[[list[psycopg.Notify]], bool], timeout: float = WAIT
) -> list[psycopg.Notify]:
    """The notifications conn receives until enough(received) or the deadline."""
    got: list[psycopg.Notify] = []
    deadline = time.monotonic() + timeout
    while not enough(got):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        got.extend(conn.notifies(timeout=min(left, 0.5), stop_after=1))
    return got


def receive(conn: Conn, count: int, timeout: float = WAIT) -> list[Notification]:
    """(channel, payload) of the notifications received, until count of them or the deadline."""
    return [(n.channel, n.payload) for n in collect(conn, lambda got: len(got) >= count, timeout)]


def receive_until(conn: Conn, last: Notification, timeout: float = WAIT) -> list[Notification]:
    """Every notification received up to and including last (a sentinel sent after the others:
    one listening connection delivers in commit order, so anything that should not have come
    would be in the list before it)."""
    got = [
        (n.channel, n.payload)
        for n in collect(
            conn, lambda got: any((n.channel, n.payload) == last for n in got), timeout
        )
    ]
    assert last in got, f"{last} not received within {timeout}s; got {got}"
    return got


def listening(console: Conn, database: str = "app", user: str = "app") -> dict[str, int]:
    """SHOW LISTENERS for this database and user: channel -> clients."""
    return {
        row["channel"]: int(row["clients"])
        for row in show(console, "LISTENERS")
        if (row["database"], row["user"]) == (database, user)
    }


def listener_backends(cluster: TempCluster, user: str = "app") -> list[int]:
    """Pids of pgtarn's listening server connections of this user in the app database."""
    with superuser_connect(cluster) as su:
        rows = su.execute(
            "select pid from pg_stat_activity where application_name = %s"
            " and datname = 'app' and usename = %s",
            (LISTENER_APP, user),
        ).fetchall()
    return [int(row[0]) for row in rows]


def metric(port: int, name: str, database: str = "app", user: str = "app") -> float:
    samples = scrape(port)
    key = (name, tuple(sorted({"database": database, "user": user}.items())))
    assert key in samples, f"{name}{{database={database}, user={user}}} not in the metrics"
    return samples[key]


@contextlib.contextmanager
def clients(proc: PgtarnProcess, count: int, **kw: Any) -> Iterator[list[Conn]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(client(proc, **kw)) for _ in range(count)]


class Busy(threading.Thread):
    """A client that keeps the pool's only server busy with a stream of short transactions."""

    def __init__(self, proc: PgtarnProcess) -> None:
        super().__init__(daemon=True)
        self.conn = client(proc)
        self.stop = threading.Event()
        self.transactions = 0
        self.error: psycopg.Error | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                with self.conn.transaction():
                    self.conn.execute("select 1")
                self.transactions += 1
        except psycopg.Error as exc:
            self.error = exc

    def finish(self) -> None:
        self.stop.set()
        self.join(WAIT)
        self.conn.close()


class RawSession(RawClient):
    """A logged-in raw protocol client (app/app_pass on app): shows every message pgtarn sends,
    and can stop reading (with a small SO_RCVBUF, pgtarn's writes to it soon block)."""

    def __init__(self, proc: PgtarnProcess, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        self.sock.connect((proc.host, proc.port))
        login = ServerAuth("app", "app_pass")
        self.startup(user="app", database="app")
        while not login.done:
            kind, body = self.read_message()
            reply = login.feed(ord(kind), body)
            if reply:
                self.send(reply)

    def query(self, text: str) -> list[tuple[str, bytes]]:
        """Send one Query; every message up to and including its ReadyForQuery."""
        self.send(build.query(text))
        out = []
        while True:
            out.append(self.read_message())
            if out[-1][0] == "Z":
                return out


def kinds(messages: list[tuple[str, bytes]]) -> str:
    return "".join(kind for kind, _ in messages)


def notification(body: bytes) -> tuple[int, str, str]:
    """NotificationResponse: (pid, channel, payload)."""
    channel, payload, _ = body[4:].split(b"\x00")
    return struct.unpack("!i", body[:4])[0], channel.decode(), payload.decode()


# -- drivers ------------------------------------------------------------------------------


def test_psycopg_notifies_without_holding_a_server(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """A psycopg client LISTENs, another NOTIFYs through the same pool of one server: the
    listener gets both notifications in order, and holds no server (a listening server
    connection named 'pgtarn listener' does the listening)."""
    port = free_port()
    proc = start(pgtarn_factory, metrics_port=port)
    channel = unique("psy")
    with client(proc) as listener, client(proc) as notifier:
        listen(listener, channel)
        notifier.execute(sql.SQL("NOTIFY {}, 'one'").format(sql.Identifier(channel)))
        notify(notifier, channel, "two")
        assert receive(listener, 2) == [(channel, "one"), (channel, "two")]
        assert len(listener_backends(pg_cluster)) == 1
        assert notifier.execute("select 3").fetchone() == (3,)
        assert wait_for(
            lambda: metric(port, "pgtarn_notifications_delivered_total") == 2, timeout=WAIT
        )


def test_asyncpg_add_listener(pgtarn_factory: PgtarnFactory) -> None:
    """asyncpg's add_listener (its LISTEN goes as Parse/Bind/Execute of an unnamed statement)
    receives what another asyncpg client notifies through the pool of one server, and
    remove_listener stops it."""
    proc = start(pgtarn_factory)
    channel = unique("apg")

    async def scenario() -> tuple[list[tuple[int, str, str]], int, dict[str, int]]:
        queue: asyncio.Queue[tuple[int, str, str]] = asyncio.Queue()
        listener = await aconnect(proc)
        notifier = await aconnect(proc)
        try:

            def on_notification(_conn: Any, pid: int, chan: str, payload: str) -> None:
                queue.put_nowait((pid, chan, payload))

            await listener.add_listener(channel, on_notification)
            async with notifier.transaction():
                pid = await notifier.fetchval("select pg_backend_pid()")
                await notifier.execute(f"NOTIFY {channel}, 'one'")
            await notifier.execute(f"select pg_notify('{channel}', 'two')")
            got = [await asyncio.wait_for(queue.get(), WAIT) for _ in range(2)]
            await listener.remove_listener(channel, on_notification)
            with admin(proc) as console:
                after = listening(console)
            return got, pid, after
        finally:
            await listener.close()
            await notifier.close()

    got, pid, after = asyncio.run(scenario())
    assert [(chan, payload) for _, chan, payload in got] == [(channel, "one"), (channel, "two")]
    assert got[0][0] == pid
    assert after == {}


# -- many listeners while the only server is busy -------------------------------------------


def test_fifty_listeners_while_the_only_server_is_busy(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """50 idle listeners on 10 channels (5 each) while another client keeps the only pooled
    server busy: each gets exactly its channel's notifications, in order, and PostgreSQL never
    sees more than the pooled server and the one listening connection."""
    proc = start(pgtarn_factory)
    channels = [unique(f"ch{i}") for i in range(10)]
    rounds = 5
    busy = Busy(proc)
    busy.start()
    try:
        with (
            PeakBackends(pg_cluster, ("app",), "app") as peak,
            clients(proc, 50) as listeners,
            client(proc) as notifier,
        ):
            for i, conn in enumerate(listeners):
                listen(conn, channels[i % 10])
            for seq in range(rounds):
                for channel in channels:
                    notify(notifier, channel, f"{channel}:{seq}")
            for channel in channels:
                notify(notifier, channel, "end")
            for i, conn in enumerate(listeners):
                channel = channels[i % 10]
                expected = [(channel, f"{channel}:{seq}") for seq in range(rounds)]
                assert receive_until(conn, (channel, "end")) == [*expected, (channel, "end")]
            assert peak.samples > 0
            assert peak.peak <= 2, f"{peak.peak} backends for 1 pooled server + 1 listener"
            assert len(listener_backends(pg_cluster)) == 1
            with admin(proc) as console:
                assert listening(console) == dict.fromkeys(channels, 5)
    finally:
        busy.finish()
    assert busy.error is None, busy.error
    assert busy.transactions > 0


# -- transactional LISTEN / UNLISTEN ----------------------------------------------------------


def test_listen_in_a_rolled_back_transaction_does_nothing(pgtarn_factory: PgtarnFactory) -> None:
    """LISTEN in a rolled-back (or failed) transaction never listens; UNLISTEN in one never
    stops listening; LISTEN in a failed transaction is refused like PostgreSQL does (25P02)."""
    proc = start(pgtarn_factory)
    base, gone, failed = unique("base"), unique("gone"), unique("failed")
    with client(proc) as conn, client(proc) as notifier, admin(proc) as console:
        listen(conn, base)
        conn.execute("begin")
        listen(conn, gone)
        conn.execute("rollback")
        conn.execute("begin")
        conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(base)))
        conn.execute("rollback")
        conn.execute("begin")
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("select 1/0")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            listen(conn, failed)
        conn.execute("rollback")
        assert listening(console) == {base: 1}
        notify(notifier, gone, "lost")
        notify(notifier, failed, "lost")
        notify(notifier, base, "end")
        assert receive_until(conn, (base, "end")) == [(base, "end")]


def test_listen_in_a_committed_transaction_takes_effect_at_commit(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """LISTEN inside BEGIN..COMMIT is not a listen before COMMIT, and is one after."""
    proc = start(pgtarn_factory)
    channel = unique("commit")
    with client(proc) as conn, client(proc) as notifier, admin(proc) as console:
        conn.execute("begin")
        listen(conn, channel)
        assert listening(console) == {}
        conn.execute("commit")
        assert listening(console) == {channel: 1}
        notify(notifier, channel, "after commit")
        assert receive(conn, 1) == [(channel, "after commit")]


def test_rollback_to_savepoint_drops_the_listens_after_it(pgtarn_factory: PgtarnFactory) -> None:
    """ROLLBACK TO SAVEPOINT drops the LISTENs made after the savepoint and keeps the others;
    a released savepoint's LISTEN counts at COMMIT."""
    proc = start(pgtarn_factory)
    kept, gone, released = unique("kept"), unique("gone"), unique("released")
    with client(proc) as conn, client(proc) as notifier, admin(proc) as console:
        conn.execute("begin")
        listen(conn, kept)
        conn.execute("savepoint s")
        listen(conn, gone)
        conn.execute("rollback to savepoint s")
        conn.execute("savepoint t")
        listen(conn, released)
        conn.execute("release savepoint t")
        conn.execute("commit")
        assert listening(console) == {kept: 1, released: 1}
        notify(notifier, gone, "lost")
        notify(notifier, released, "r")
        notify(notifier, kept, "end")
        assert receive_until(conn, (kept, "end")) == [(released, "r"), (kept, "end")]


def test_unlisten_channel_and_unlisten_all(pgtarn_factory: PgtarnFactory) -> None:
    """UNLISTEN ch stops that channel only; UNLISTEN * stops all; several LISTENs in one Query
    all count."""
    proc = start(pgtarn_factory)
    one, two, three, last = (unique(n) for n in ("one", "two", "three", "last"))
    with client(proc) as conn, client(proc) as notifier, admin(proc) as console:
        conn.execute(f"LISTEN {one}; LISTEN {two}; LISTEN {three}")
        assert listening(console) == {one: 1, two: 1, three: 1}
        conn.execute(f"UNLISTEN {one}")
        notify(notifier, one, "lost")
        notify(notifier, two, "kept")
        assert receive_until(conn, (two, "kept")) == [(two, "kept")]
        conn.execute("UNLISTEN *")
        assert listening(console) == {}
        listen(conn, last)
        for channel in (one, two, three):
            notify(notifier, channel, "lost")
        notify(notifier, last, "end")
        assert receive_until(conn, (last, "end")) == [(last, "end")]


# -- listeners that leave, a listening connection that dies -----------------------------------


def test_listener_that_disconnects(pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster) -> None:
    """A listener that leaves: the others still receive, SHOW LISTENERS stops counting it, and
    when a channel's last listener leaves the listening connection UNLISTENs it (a later
    listener of that channel still receives)."""
    proc = start(pgtarn_factory)
    shared, alone = unique("shared"), unique("alone")
    with client(proc) as notifier, admin(proc) as console:
        with clients(proc, 4) as (first, second, third, only):
            for conn in (first, second, third):
                listen(conn, shared)
            listen(only, alone)
            assert listening(console) == {shared: 3, alone: 1}
            first.close()
            assert wait_for(lambda: listening(console) == {shared: 2, alone: 1}, timeout=WAIT)
            notify(notifier, shared, "still")
            for conn in (second, third):
                assert receive(conn, 1) == [(shared, "still")]
            only.close()
            assert wait_for(lambda: listening(console) == {shared: 2}, timeout=WAIT)
            (pid,) = listener_backends(pg_cluster)
            with superuser_connect(pg_cluster) as su:

                def last_query() -> str:
                    row = su.execute(
                        "select query from pg_stat_activity where pid = %s", (pid,)
                    ).fetchone()
                    return "" if row is None else str(row[0])

                assert wait_for(lambda: "unlisten" in last_query().lower(), timeout=WAIT), (
                    last_query()
                )
            with client(proc) as later:
                listen(later, alone)
                notify(notifier, alone, "again")
                assert receive(later, 1) == [(alone, "again")]


def test_listening_connection_killed(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """pg_terminate_backend on the listening connection: pgtarn reconnects and LISTENs again,
    its clients get a WARNING that notifications may have been lost, and new notifications
    arrive again."""
    port = free_port()
    proc = start(pgtarn_factory, metrics_port=port)
    ch_a, ch_b = unique("ka"), unique("kb")
    with client(proc) as a, client(proc) as b, client(proc) as notifier:
        notices: dict[str, list[tuple[str | None, str | None]]] = {ch_a: [], ch_b: []}
        for conn, channel in ((a, ch_a), (b, ch_b)):
            listen(conn, channel)

            def on_notice(diag: psycopg.errors.Diagnostic, ch: str = channel) -> None:
                notices[ch].append((diag.severity, diag.message_primary))

            conn.add_notice_handler(on_notice)
        (old_pid,) = listener_backends(pg_cluster)
        with superuser_connect(pg_cluster) as su:
            su.execute("select pg_terminate_backend(%s)", (old_pid,))

        def warned(channel: str) -> bool:
            return any(
                severity == "WARNING" and "notifications may have been lost" in (text or "")
                for severity, text in notices[channel]
            )

        deadline = time.monotonic() + WAIT
        for conn, channel in ((a, ch_a), (b, ch_b)):
            while not warned(channel):  # reading the socket runs the notice handler
                assert time.monotonic() < deadline, f"no lost-notifications warning: {notices}"
                list(conn.notifies(timeout=0.2))
        got: dict[str, list[Notification]] = {ch_a: [], ch_b: []}
        deadline = time.monotonic() + WAIT
        attempt = 0
        while not (got[ch_a] and got[ch_b]):  # the listening connection may still be away
            assert time.monotonic() < deadline, f"no notification after the reconnect: {got}"
            for conn, channel in ((a, ch_a), (b, ch_b)):
                notify(notifier, channel, f"again-{attempt}")
                got[channel] += receive(conn, 1, timeout=0.3)
            attempt += 1
        for conn, channel in ((a, ch_a), (b, ch_b)):
            notify(notifier, channel, "end")
            got[channel] += receive_until(conn, (channel, "end"))
            assert all(
                chan == channel and (payload == "end" or payload.startswith("again-"))
                for chan, payload in got[channel]
            ), got[channel]
        assert wait_for(lambda: len(listener_backends(pg_cluster)) == 1, timeout=WAIT)
        assert listener_backends(pg_cluster) != [old_pid]
        assert metric(port, "pgtarn_listener_reconnects_total") >= 1


def test_client_that_never_reads_is_closed(pgtarn_factory: PgtarnFactory) -> None:
    """A listener that never reads (small receive buffer, big payloads) is closed with a FATAL
    53400 'notification queue full' once its queue passes listen_queue_size; another listener
    of the same channel keeps receiving every notification."""
    port = free_port()
    proc = start(pgtarn_factory, listen_queue_size=10, metrics_port=port)
    channel = unique("flood")
    batch, most = 20, 3000
    flood = (
        "select pg_notify(%s, g::text || '|' || repeat('x', 7000))"
        " from generate_series(%s::int, %s::int) g"
    )
    stuck = RawSession(proc, rcvbuf=4096)
    try:
        assert kinds(stuck.query(f"LISTEN {channel}")) == "CZ"
        with client(proc) as reader, client(proc) as notifier, admin(proc) as console:
            listen(reader, channel)
            received: list[str] = []
            stop = threading.Event()

            def read() -> None:
                while not stop.is_set() and "end" not in received:
                    received.extend(n.payload.split("|")[0] for n in reader.notifies(timeout=0.5))

            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            try:
                sent = 0
                while listening(console).get(channel) == 2:
                    assert sent < most, f"{sent} notifications sent and the stuck client is open"
                    notifier.execute(flood, (channel, sent, sent + batch - 1))
                    sent += batch
                assert listening(console) == {channel: 1}
                notify(notifier, channel, "end")
                thread.join(WAIT * 3)
            finally:
                stop.set()
                thread.join(WAIT)
            assert received == [*(str(i) for i in range(sent)), "end"]
        messages = []
        while True:
            try:
                messages.append(stuck.read_message())
            except ConnectionError:  # the end of the connection (closed or reset)
                break
    finally:
        stuck.close()
    assert messages, "the stuck client got nothing at all"
    kind, body = messages[-1]
    assert kind == "E", [k for k, _ in messages[-3:]]
    fields = error_fields(body)
    assert (fields["S"], fields["C"]) == ("FATAL", "53400")
    assert fields["M"].startswith("notification queue full"), fields["M"]
    assert sum(1 for k, _ in messages if k == "A") < sent
    assert metric(port, "pgtarn_notifications_dropped_total") >= 1


# -- what pgtarn answers, and when it delivers ------------------------------------------------


def test_replies_and_delivery_after_the_transaction(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """pgtarn answers LISTEN/UNLISTEN with their CommandComplete and the right ReadyForQuery
    status, and holds a notification for a client inside a transaction block until the block
    ends: none comes with the replies inside it, and it comes with its COMMIT's (after the
    CommandComplete; the spec says right after the ReadyForQuery, PostgreSQL itself sends it
    just before), with the notifying backend's pid."""
    port = free_port()
    proc = start(pgtarn_factory, metrics_port=port)
    channel, other = unique("wt"), unique("wt_other")
    raw = RawSession(proc)
    try:
        replies = raw.query(f"LISTEN {channel}")
        assert replies == [("C", b"LISTEN\x00"), ("Z", b"I")]
        with client(proc) as watcher, psycopg.connect(pg_dsn, autocommit=True) as direct:
            listen(watcher, channel)
            assert raw.query("BEGIN")[-1] == ("Z", b"T")
            row = direct.execute("select pg_backend_pid()").fetchone()
            assert row is not None
            direct_pid = int(row[0])
            direct.execute(f"NOTIFY {channel}, 'inside'")
            assert receive(watcher, 1) == [(channel, "inside")]  # pgtarn has it now
            assert wait_for(lambda: metric(port, "pgtarn_notifications_queued") == 1, timeout=WAIT)
            replies = raw.query("SELECT 1")
            assert "A" not in kinds(replies) and replies[-1] == ("Z", b"T")
            replies = raw.query(f"LISTEN {other}")
            assert replies == [("C", b"LISTEN\x00"), ("Z", b"T")]
            replies = raw.query("COMMIT")
            if "A" not in kinds(replies):  # not before the ReadyForQuery: right after it
                replies.append(raw.read_message())
            assert kinds(replies) in ("CAZ", "CZA"), kinds(replies)
            assert ("Z", b"I") in replies
            (body,) = [body for kind, body in replies if kind == "A"]
            assert notification(body) == (direct_pid, channel, "inside")
        assert wait_for(lambda: metric(port, "pgtarn_notifications_queued") == 0, timeout=WAIT)
        replies = raw.query(f"LISTEN x{channel}; UNLISTEN {other}")
        assert replies == [("C", b"LISTEN\x00"), ("C", b"UNLISTEN\x00"), ("Z", b"I")]
        replies = raw.query("UNLISTEN *")
        assert replies == [("C", b"UNLISTEN\x00"), ("Z", b"I")]
        assert raw.query("BEGIN")[-1] == ("Z", b"T")
        assert kinds(raw.query("SELECT 1/0")) == "EZ"
        replies = raw.query(f"LISTEN {channel}")
        assert kinds(replies) == "EZ" and replies[-1] == ("Z", b"E")
        assert error_fields(replies[0][1])["C"] == "25P02"
        assert raw.query("ROLLBACK")[-1] == ("Z", b"I")
    finally:
        raw.close()


def test_hostile_channel_names(pgtarn_factory: PgtarnFactory) -> None:
    """Channel names are identifiers: a quoted name with a quote, a semicolon and a comment is
    one plain channel; an unquoted name folds to lower case, a quoted one keeps its case."""
    proc = start(pgtarn_factory)
    hostile = 'a"; select pg_sleep(1); --'
    mixed = unique("MixedCase")
    with client(proc) as conn, client(proc) as notifier, admin(proc) as console:
        assert conn.execute('LISTEN "a""; select pg_sleep(1); --"').statusmessage == "LISTEN"
        conn.execute(f"LISTEN {mixed}")
        conn.execute(f'LISTEN "{mixed}"')
        assert listening(console) == {hostile: 1, mixed.lower(): 1, mixed: 1}
        notifier.execute(sql.SQL("NOTIFY {}, 'by notify'").format(sql.Identifier(hostile)))
        notify(notifier, hostile, "by pg_notify")
        notify(notifier, mixed.lower(), "folded")
        notify(notifier, mixed, "kept case")
        assert receive(conn, 4) == [
            (hostile, "by notify"),
            (hostile, "by pg_notify"),
            (mixed.lower(), "folded"),
            (mixed, "kept case"),
        ]


def test_client_notifying_its_own_channel_receives_it(pgtarn_factory: PgtarnFactory) -> None:
    proc = start(pgtarn_factory)
    channel = unique("self")
    with client(proc) as conn:
        listen(conn, channel)
        conn.execute(f"NOTIFY {channel}, 'mine'")
        assert receive(conn, 1) == [(channel, "mine")]


def test_notification_pid_is_the_notifying_pooled_backend(pgtarn_factory: PgtarnFactory) -> None:
    proc = start(pgtarn_factory)
    channel = unique("pid")
    with client(proc) as conn, client(proc) as notifier:
        listen(conn, channel)
        with notifier.transaction():
            row = notifier.execute("select pg_backend_pid()").fetchone()
            assert row is not None
            notifier.execute(f"NOTIFY {channel}, 'who'")
        (got,) = collect(conn, lambda got: len(got) >= 1)
        assert (got.channel, got.payload, got.pid) == (channel, "who", row[0])


def test_pause_holds_delivery_until_resume(pgtarn_factory: PgtarnFactory, pg_dsn: str) -> None:
    """While the database is paused nothing is delivered; RESUME sends what was held."""
    proc = start(pgtarn_factory)
    channel = unique("paused")
    with (
        client(proc) as conn,
        admin(proc) as console,
        psycopg.connect(pg_dsn, autocommit=True) as direct,
    ):
        listen(conn, channel)
        assert listening(console) == {channel: 1}
        console.execute("PAUSE app")
        direct.execute(f"NOTIFY {channel}, 'held'")
        assert receive(conn, 1, timeout=1.0) == []
        console.execute("RESUME app")
        assert receive(conn, 1) == [(channel, "held")]


def test_show_listeners(pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster) -> None:
    """SHOW LISTENERS: database, user, channel, clients; one listening connection per
    (database, user); rows go when their clients leave."""
    proc = start(pgtarn_factory)
    ch_a, ch_b = unique("sa"), unique("sb")
    with admin(proc) as console:
        with (
            client(proc) as one,
            client(proc) as two,
            client(proc, user="scram_user", password="scram_pass") as three,
        ):
            one.execute(f"LISTEN {ch_a}; LISTEN {ch_b}")
            listen(two, ch_a)
            listen(three, ch_a)
            cur = console.execute("SHOW LISTENERS")
            assert cur.description is not None
            assert [d.name for d in cur.description] == ["database", "user", "channel", "clients"]
            rows = {(r[0], r[1], r[2]): int(r[3]) for r in cur.fetchall()}
            assert rows == {
                ("app", "app", ch_a): 2,
                ("app", "app", ch_b): 1,
                ("app", "scram_user", ch_a): 1,
            }
            assert len(listener_backends(pg_cluster)) == 1
            assert len(listener_backends(pg_cluster, "scram_user")) == 1
        assert wait_for(lambda: show(console, "LISTENERS") == [], timeout=WAIT)


# -- other modes, and what passes through ---------------------------------------------------


def test_statement_mode_listen(pgtarn_factory: PgtarnFactory) -> None:
    proc = start(pgtarn_factory, pool_mode="statement")
    channel = unique("stmt")
    with client(proc) as conn, client(proc) as notifier:
        listen(conn, channel)
        notify(notifier, channel, "statement mode")
        assert receive(conn, 1) == [(channel, "statement mode")]


def test_session_mode_listen_runs_on_the_clients_server(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """Session mode is unchanged: LISTEN runs on the client's own server."""
    proc = start(pgtarn_factory, pool_mode="session", default_pool_size=2)
    channel = unique("session")
    with client(proc) as conn, client(proc) as notifier:
        listen(conn, channel)
        assert conn.execute("select pg_listening_channels()").fetchall() == [(channel,)]
        notify(notifier, channel, "session mode")
        assert receive(conn, 1) == [(channel, "session mode")]
        assert listener_backends(pg_cluster) == []


def test_notify_passes_through(pgtarn_factory: PgtarnFactory, pg_dsn: str) -> None:
    """NOTIFY, pg_notify() and a NOTIFY inside a function run on the pooled server as sent:
    a session straight to PostgreSQL receives them from that server's pid."""
    proc = start(pgtarn_factory)
    channel = unique("through")
    with psycopg.connect(pg_dsn, autocommit=True) as direct, client(proc) as notifier:
        listen(direct, channel)
        with notifier.transaction():
            row = notifier.execute("select pg_backend_pid()").fetchone()
            assert row is not None
            notifier.execute(f"NOTIFY {channel}, 'a'")
            notify(notifier, channel, "b")
            notifier.execute(f"DO $$ BEGIN PERFORM pg_notify('{channel}', 'c'); END $$")
        got = collect(direct, lambda got: len(got) >= 3)
        assert [(n.channel, n.payload, n.pid) for n in got] == [
            (channel, payload, row[0]) for payload in ("a", "b", "c")
        ]


def test_listen_inside_a_function_runs_on_the_pooled_server(pgtarn_factory: PgtarnFactory) -> None:
    """A LISTEN inside a DO block is not seen by pgtarn: it runs on the pooled server (whose
    pg_listening_channels() then lists it), and no listener connection is opened for it."""
    proc = start(pgtarn_factory)
    channel = unique("in_do")
    with client(proc) as conn, admin(proc) as console:
        conn.execute(f"DO $$ BEGIN EXECUTE 'LISTEN {channel}'; END $$")
        # pool of one: the next query runs on that same server
        rows = conn.execute("select pg_listening_channels()").fetchall()
        assert rows == [(channel,)]
        assert listening(console) == {}


# -- the listener connection moved: RELOAD with new connection settings, RECONNECT -----------


def watch_notices(conn: Conn) -> list[tuple[str | None, str | None]]:
    """(severity, message) of every notice conn gets from now on (as its socket is read)."""
    notices: list[tuple[str | None, str | None]] = []
    conn.add_notice_handler(lambda diag: notices.append((diag.severity, diag.message_primary)))
    return notices


def await_lost_warning(conn: Conn, notices: list[tuple[str | None, str | None]]) -> None:
    """Read conn until it has the WARNING that notifications may have been lost (none is
    sent meanwhile: any notification read here fails the test)."""
    deadline = time.monotonic() + WAIT
    while not any(
        severity == "WARNING" and "notifications may have been lost" in (text or "")
        for severity, text in notices
    ):
        assert time.monotonic() < deadline, f"no lost-notifications warning: {notices}"
        assert list(conn.notifies(timeout=0.2)) == []


def listener_listening(cluster: TempCluster, channel: str, old_pid: int) -> bool:
    """Whether the only listening server connection is a new one (not old_pid), idle after
    its LISTEN of channel (PostgreSQL has committed it: a NOTIFY from now on reaches it)."""
    with superuser_connect(cluster) as su:
        rows = su.execute(
            "select pid, state, query from pg_stat_activity where application_name = %s"
            " and datname = 'app' and usename = 'app'",
            (LISTENER_APP,),
        ).fetchall()
    if len(rows) != 1:
        return False
    pid, state, query = rows[0]
    return (
        pid != old_pid
        and state == "idle"
        and channel in str(query)
        and str(query).upper().startswith("LISTEN")
    )


@pytest.mark.parametrize("move", ["reload", "reconnect"])
def test_listener_moved_by_reload_or_reconnect(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, move: str
) -> None:
    """A RELOAD that changes the app entry's connection settings (application_name=moved),
    or RECONNECT: the listening connection is replaced (a new backend, the old one gone),
    the listening client gets the lost-notifications WARNING, and what is notified once the
    new connection listens arrives (nothing else before it)."""
    proc = start(pgtarn_factory)
    channel = unique(move)
    with client(proc) as conn, client(proc) as notifier, admin(proc) as console:
        notices = watch_notices(conn)
        listen(conn, channel)
        notify(notifier, channel, "before")
        assert receive(conn, 1) == [(channel, "before")]
        (old_pid,) = listener_backends(pg_cluster)
        if move == "reload":
            ini = edit_ini(proc, " dbname=app\n", " dbname=app application_name=moved\n")
            Path(proc.ini_path).write_text(ini, encoding="utf-8")
            console.execute("RELOAD")
        else:
            console.execute("RECONNECT app")
        await_lost_warning(conn, notices)
        assert wait_for(lambda: listener_listening(pg_cluster, channel, old_pid), timeout=WAIT), (
            listener_backends(pg_cluster)
        )
        notify(notifier, channel, "after")
        assert receive_until(conn, (channel, "after")) == [(channel, "after")]
        assert listener_backends(pg_cluster) != [old_pid]
        assert listening(console) == {channel: 1}


# -- SUSPEND, PAUSE ------------------------------------------------------------------------------


def test_suspend_holds_delivery_until_resume(pgtarn_factory: PgtarnFactory, pg_dsn: str) -> None:
    """SUSPEND: a NOTIFY straight to PostgreSQL is not delivered while suspended; RESUME
    delivers it."""
    proc = start(pgtarn_factory)
    channel = unique("suspended")
    with (
        client(proc) as conn,
        admin(proc) as console,
        psycopg.connect(pg_dsn, autocommit=True) as direct,
    ):
        listen(conn, channel)
        console.execute("SUSPEND")
        try:
            direct.execute(f"NOTIFY {channel}, 'held'")
            assert receive(conn, 1, timeout=1.0) == []
        finally:
            console.execute("RESUME")
        assert receive(conn, 1) == [(channel, "held")]
        assert conn.execute("select 1").fetchone() == (1,)


def test_pause_with_more_notifications_than_listen_queue_size(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """20 notifications while paused with listen_queue_size = 5: they wait in PostgreSQL (the
    listening connection stops reading), not in the client's bounded queue; after RESUME
    the client gets all 20, in order, and is still open."""
    proc = start(pgtarn_factory, listen_queue_size=5)
    channel = unique("pausedmany")
    with (
        client(proc) as conn,
        admin(proc) as console,
        psycopg.connect(pg_dsn, autocommit=True) as direct,
    ):
        listen(conn, channel)
        console.execute("PAUSE app")
        try:
            for i in range(20):
                direct.execute(f"NOTIFY {channel}, '{i}'")
            assert receive(conn, 1, timeout=1.0) == []
        finally:
            console.execute("RESUME app")
        assert receive(conn, 20) == [(channel, str(i)) for i in range(20)]
        assert conn.execute("select 1").fetchone() == (1,)
        assert listening(console) == {channel: 1}


# -- max_db_connections --------------------------------------------------------------------------


def current_connections(console: Conn) -> int:
    (row,) = [r for r in show(console, "DATABASES") if r["name"] == "app"]
    return int(row["current_connections"])


def test_max_db_connections_counts_the_listener(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """max_db_connections = 2, default_pool_size = 2, a listening client: SHOW DATABASES
    counts the listener connection (1 once the pooled server that logins opened has idled
    out), two clients under load are both served by the one server left to the pool, and
    PostgreSQL never sees more than 2 backends of the database."""
    proc = start(pgtarn_factory, max_db_connections=2, default_pool_size=2, server_idle_timeout=1)
    channel = unique("maxdb")
    with client(proc) as conn, client(proc) as holder, admin(proc) as console:
        listen(conn, channel)
        assert wait_for(lambda: current_connections(console) == 1, timeout=WAIT), show(
            console, "SERVERS"
        )
        assert show(console, "SERVERS") == []
        assert len(listener_backends(pg_cluster)) == 1
        errors: list[psycopg.Error] = []
        done = [0, 0]

        def load(index: int) -> None:
            try:
                with client(proc) as worker:
                    for _ in range(10):
                        with worker.transaction():
                            worker.execute("select pg_sleep(0.02)")
                        done[index] += 1
            except psycopg.Error as exc:
                errors.append(exc)

        with PeakBackends(pg_cluster, ("app",), "app") as peak:
            workers = [threading.Thread(target=load, args=(i,), daemon=True) for i in (0, 1)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(WAIT * 2)
        assert errors == []
        assert done == [10, 10]
        assert peak.samples > 0
        assert peak.peak <= 2, f"{peak.peak} backends with max_db_connections = 2"
        with holder.transaction():  # holds the pool's server while SHOW looks
            holder.execute("select 1")
            assert len(show(console, "SERVERS")) == 1
            assert current_connections(console) == 2
        notify(holder, channel, "served")
        assert receive(conn, 1) == [(channel, "served")]


# -- LISTEN through the extended protocol, LISTEN mixed with other statements, DISCARD ALL -----


def test_psycopg_extended_protocol_listen(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """psycopg's prepared LISTEN (a named statement: Parse+Sync, then Bind/Describe/Execute/
    Sync) and its binary LISTEN (unnamed: Parse/Bind/Describe/Execute/Sync) are answered by
    pgtarn: no pooled server is held (another client runs queries in a pool of one), and
    notifications arrive."""
    proc = start(pgtarn_factory)
    named, unnamed = unique("prepared"), unique("binary")
    with client(proc) as conn, client(proc) as other, admin(proc) as console:
        assert conn.execute(f"LISTEN {named}", prepare=True).statusmessage == "LISTEN"
        assert conn.execute(f"LISTEN {unnamed}", binary=True).statusmessage == "LISTEN"
        assert listening(console) == {named: 1, unnamed: 1}
        assert other.execute("select 2").fetchone() == (2,)
        assert [r["pinned"] for r in show(console, "CLIENTS") if r["pinned"]] == []
        assert len(listener_backends(pg_cluster)) == 1
        notify(other, named, "n")
        notify(other, unnamed, "u")
        assert receive(conn, 2) == [(named, "n"), (unnamed, "u")]


def test_raw_extended_protocol_listen(pgtarn_factory: PgtarnFactory) -> None:
    """Parse/Bind/Describe/Execute/Sync of a LISTEN, named and unnamed, by hand: pgtarn
    replies ParseComplete, BindComplete, NoData, CommandComplete LISTEN, ReadyForQuery, holds
    no server (another client runs a query in the pool of one) and delivers notifications."""
    proc = start(pgtarn_factory)
    named, unnamed = unique("rawnamed"), unique("rawunnamed")
    raw = RawSession(proc)
    try:
        describe_portal = build.message(b"D", b"P\x00")
        for statement, channel in (("s1", named), ("", unnamed)):
            raw.send(
                build.parse(statement, f"LISTEN {channel}")
                + build.bind("", statement, [])
                + describe_portal
                + build.execute()
                + build.SYNC
            )
            replies = raw.read_until("Z")
            assert replies == [
                ("1", b""),
                ("2", b""),
                ("n", b""),
                ("C", b"LISTEN\x00"),
                ("Z", b"I"),
            ]
        with client(proc) as other, admin(proc) as console:
            assert listening(console) == {named: 1, unnamed: 1}
            assert other.execute("select 2").fetchone() == (2,)
            notify(other, named, "n")
            notify(other, unnamed, "u")
        got = [raw.read_message() for _ in range(2)]
        assert [kind for kind, _ in got] == ["A", "A"], got
        assert [notification(body)[1:] for _, body in got] == [(named, "n"), (unnamed, "u")]
    finally:
        raw.close()


@pytest.mark.parametrize("cut", ["between messages", "inside a message"])
def test_extended_protocol_listen_split_across_reads(
    pgtarn_factory: PgtarnFactory, cut: str
) -> None:
    """A LISTEN batch that reaches pgtarn in two reads (TCP may cut it anywhere) is answered
    by pgtarn as a whole one is: no server is held for it (another client runs a query in the
    pool of one) and the channel is listened to."""
    proc = start(pgtarn_factory)
    channel = unique("split")
    raw = RawSession(proc)
    try:
        batch = (
            build.parse("s1", f"LISTEN {channel}")
            + build.bind("", "s1", [])
            + build.execute()
            + build.SYNC
        )
        at = len(build.parse("s1", f"LISTEN {channel}"))
        if cut == "inside a message":
            at += 3  # in the Bind's length
        raw.send(batch[:at])
        time.sleep(0.3)  # the first part is read alone
        raw.send(batch[at:])
        assert raw.read_until("Z") == [("1", b""), ("2", b""), ("C", b"LISTEN\x00"), ("Z", b"I")]
        with client(proc) as other, admin(proc) as console:
            assert listening(console) == {channel: 1}
            assert other.execute("select 2").fetchone() == (2,)
            notify(other, channel, "n")
        kind, body = raw.read_message()
        assert kind == "A" and notification(body)[1:] == (channel, "n")
    finally:
        raw.close()


def test_listen_mixed_with_a_select_runs_on_the_server_and_pins(
    pgtarn_factory: PgtarnFactory,
    pg_cluster: TempCluster,
    pg_dsn: str,
) -> None:
    """LISTEN a; SELECT 1 runs on the pooled server and pins the client (SHOW CLIENTS
    pinned: listen); its later LISTEN goes to that server too; notifications come through
    it, and no listening connection is opened."""
    proc = start(pgtarn_factory)
    first, later = unique("mixed"), unique("mixed_later")
    with (
        client(proc) as conn,
        admin(proc) as console,
        psycopg.connect(pg_dsn, autocommit=True) as direct,
    ):
        conn.execute(f"LISTEN {first}; SELECT 1")
        listen(conn, later)
        rows = [r for r in show(console, "CLIENTS") if r["pinned"]]
        assert [r["pinned"] for r in rows] == ["listen"], rows
        assert sorted(r[0] for r in conn.execute("select pg_listening_channels()")) == sorted(
            [first, later]
        )
        assert listening(console) == {}
        assert listener_backends(pg_cluster) == []
        direct.execute(f"NOTIFY {first}, 'one'")
        direct.execute(f"NOTIFY {later}, 'two'")
        assert receive(conn, 2) == [(first, "one"), (later, "two")]


def test_discard_all_ends_the_listeners_channels(pgtarn_factory: PgtarnFactory) -> None:
    """DISCARD ALL in a Query ends the channels the client listened to through the listening
    connection: SHOW LISTENERS drops them and their notifications no longer arrive."""
    proc = start(pgtarn_factory)
    gone, after = unique("discarded"), unique("after_discard")
    with client(proc) as conn, client(proc) as notifier, admin(proc) as console:
        listen(conn, gone)
        assert listening(console) == {gone: 1}
        conn.execute("DISCARD ALL")
        assert wait_for(lambda: listening(console) == {}, timeout=WAIT), listening(console)
        listen(conn, after)
        notify(notifier, gone, "lost")
        notify(notifier, after, "end")
        assert receive_until(conn, (after, "end")) == [(after, "end")]


def test_session_mode_own_notification_names_the_clients_backend_pid(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """A client that tells its own notifications apart by pid (psycopg's docs show how)
    sees its backend_pid, pgtarn's key, in them, as on a direct connection."""
    proc = pgtarn_factory(settings={"pool_mode": "session"})
    with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
        seen: list[psycopg.Notify] = []
        conn.add_notify_handler(seen.append)
        conn.execute("LISTEN own_pid")
        conn.execute("NOTIFY own_pid, 'mine'")
        other.execute("NOTIFY own_pid, 'theirs'")
        conn.execute("SELECT 1")  # the other's notification comes with this reply
        assert [(n.payload, n.pid) for n in seen] == [
            ("mine", conn.info.backend_pid),
            ("theirs", seen[1].pid),
        ]
        assert seen[1].pid not in (conn.info.backend_pid, other.info.backend_pid)
