"""[peers] and peer_id: two pgtarn processes send each other the CancelRequests of each
other's clients, as PgBouncer's peering does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgtarn.errors import PgtarnError
from pgtarn.proto import build
from pgtarn.proto.cancelkey import forwarded, peer_of, ttl_of
from tests.support import PgtarnProcess

from ..support import free_port
from .conftest import PgtarnFactory
from .rawpg import AsyncRawClient
from .test_admin import admin, show

pytestmark = pytest.mark.integration

Key = tuple[int, int]


def _peered(
    pgtarn_factory: PgtarnFactory,
    peers_of_1: dict[int, int] | None = None,
    peers_of_2: dict[int, int] | None = None,
) -> tuple[Any, Any]:
    """Instances with peer_id 1 and 2, each naming the other in [peers] (or the peer ids ->
    ports given: None in them stands for the other instance's port)."""
    port1, port2 = free_port(), free_port()
    one = {2: port2} if peers_of_1 is None else peers_of_1
    two = {1: port1} if peers_of_2 is None else peers_of_2
    first = pgtarn_factory(
        settings={"peer_id": 1, "listen_port": port1},
        peers={k: f"host=127.0.0.1 port={v} pool_size=2" for k, v in one.items()},
    )
    second = pgtarn_factory(
        settings={"peer_id": 2, "listen_port": port2},
        peers={k: f"host=127.0.0.1 port={v}" for k, v in two.items()},
    )
    return first, second


async def _send_cancel(proc: PgtarnProcess, key: Key) -> None:
    """A CancelRequest to proc; waits until proc closes the connection."""
    reader, writer = await asyncio.open_connection(proc.host, proc.port)
    writer.write(build.cancel_request(*key))
    await asyncio.wait_for(reader.read(), 10)
    writer.close()


async def _wait_running(pg_dsn: str, text: str) -> None:
    def poll() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if watch.execute(
                    "select 1 from pg_stat_activity where state = 'active'"
                    " and query like %s and pid <> pg_backend_pid()",
                    (f"%{text}%",),
                ).fetchone():
                    return
                time.sleep(0.02)
        raise AssertionError(f"query {text!r} never started")

    await asyncio.to_thread(poll)


async def _query_then_cancel(
    owner: PgtarnProcess,
    via: PgtarnProcess,
    pg_dsn: str,
    seconds: float,
    key_of: Callable[[Key], Key] | None = None,
) -> tuple[str | None, float]:
    """A client of owner runs pg_sleep(seconds); its key (as key_of makes it from the
    client's) is sent to via. (SQLSTATE of the query's error or None, seconds it took)."""
    client = await AsyncRawClient.connect(owner.host, owner.port, "app", "app_pass", "app")
    try:
        tag = f"peer-{time.monotonic_ns()}"
        started = time.monotonic()
        running = asyncio.create_task(client.query(f"select '{tag}' from pg_sleep({seconds})"))
        await _wait_running(pg_dsn, tag)
        key = client.backend_key if key_of is None else key_of(client.backend_key)
        await _send_cancel(via, key)
        try:
            await running
        except PgtarnError as exc:
            return exc.sqlstate, time.monotonic() - started
        return None, time.monotonic() - started
    finally:
        await client.close()


def test_cancel_sent_to_the_other_instance_is_forwarded(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    first, second = _peered(pgtarn_factory)
    # the keys say whose they are
    key = asyncio.run(_login_key(first))
    assert peer_of(key) == 1 and ttl_of(key) == 3
    assert peer_of(asyncio.run(_login_key(second))) == 2

    sqlstate, took = asyncio.run(_query_then_cancel(first, second, pg_dsn, 30))
    assert sqlstate == "57014"
    assert took < 10
    # and the other way round
    sqlstate, took = asyncio.run(_query_then_cancel(second, first, pg_dsn, 30))
    assert sqlstate == "57014"
    assert "cancel request for peer 1 (TTL 3) forwarded" in second.log_text()

    with admin(second) as console:
        assert show(console, "PEERS") == [
            {"peer_id": 1, "host": "127.0.0.1", "port": first.port, "pool_size": 5}
        ]
        assert show(console, "PEER_POOLS") == [
            {
                "peer_id": 1,
                "cl_active_cancel_req": 0,
                "cl_waiting_cancel_req": 0,
                "sv_active_cancel": 0,
                "sv_login": 0,
            }
        ]
        lists = {r["list"]: r["items"] for r in show(console, "LISTS")}
        assert (lists["peers"], lists["peer_pools"]) == (1, 1)
    with admin(first) as console:
        assert show(console, "PEERS") == [
            {"peer_id": 2, "host": "127.0.0.1", "port": second.port, "pool_size": 2}
        ]


async def _login_key(proc: PgtarnProcess) -> Key:
    client = await AsyncRawClient.connect(proc.host, proc.port, "app", "app_pass", "app")
    await client.close()
    return client.backend_key


def test_forwarded_key_with_ttl_left_still_cancels(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    first, second = _peered(pgtarn_factory)
    # a key already forwarded twice: one hop left, forwarded with 0, still its owner's
    sqlstate, _ = asyncio.run(
        _query_then_cancel(first, second, pg_dsn, 30, lambda key: forwarded(forwarded(key)))
    )
    assert sqlstate == "57014"
    assert "cancel request for peer 1 (TTL 1) forwarded" in second.log_text()


def test_ttl_zero_is_not_forwarded(pgtarn_factory: PgtarnFactory, pg_dsn: str) -> None:
    first, second = _peered(pgtarn_factory)
    sqlstate, took = asyncio.run(
        _query_then_cancel(first, second, pg_dsn, 1.5, lambda key: (key[0], key[1] & ~3))
    )
    assert sqlstate is None and took >= 1.5
    assert "cancel request for peer 1 (TTL 0) dropped" in second.log_text()
    # the same key at its owner: found (the TTL is not part of the match)
    sqlstate, _ = asyncio.run(
        _query_then_cancel(first, first, pg_dsn, 30, lambda key: (key[0], key[1] & ~3))
    )
    assert sqlstate == "57014"


def _with_peer(key: Key, peer_id: int) -> Key:
    pid = (key[0] & ~0x00FFFF00) | (peer_id & 0xFF) << 16 | (peer_id >> 8) << 8
    return pid, key[1]


def test_unknown_peer_and_own_unknown_key_dropped(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    first, second = _peered(pgtarn_factory)
    for peer_id in (9, 2):  # not in [peers]; second's own id, a key it never gave

        def via_peer(key: Key, peer: int = peer_id) -> Key:
            return _with_peer(key, peer)

        sqlstate, took = asyncio.run(_query_then_cancel(first, second, pg_dsn, 1, via_peer))
        assert sqlstate is None and took >= 1
        assert f"cancel request for peer {peer_id} (TTL 3) dropped" in second.log_text()


def test_peers_that_disagree_stop_when_the_ttl_runs_out(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    # each believes peer 3 is the other: a key of peer 3 goes back and forth 3 times, no more
    port1, port2 = free_port(), free_port()
    first = pgtarn_factory(
        settings={"peer_id": 1, "listen_port": port1}, peers={3: f"host=127.0.0.1 port={port2}"}
    )
    second = pgtarn_factory(
        settings={"peer_id": 2, "listen_port": port2}, peers={3: f"host=127.0.0.1 port={port1}"}
    )
    key = _with_peer(asyncio.run(_login_key(first)), 3)
    asyncio.run(_send_cancel(second, key))
    deadline = time.monotonic() + 5
    while "(TTL 0) dropped" not in first.log_text() + second.log_text():
        assert time.monotonic() < deadline, "the bounce never ended"
        time.sleep(0.05)
    time.sleep(0.3)
    # (log_text has the logfile and stderr: each line twice)
    lines = {
        line
        for proc in (first, second)
        for line in proc.log_text().splitlines()
        if "cancel request for peer 3" in line
    }
    assert sorted(line.split("DEBUG ")[1] for line in lines) == [
        f"cancel request for peer 3 (TTL {ttl}) {what}"
        for ttl, what in ((0, "dropped"), (1, "forwarded"), (2, "forwarded"), (3, "forwarded"))
    ]
    assert "cancel request for peer 3 (TTL 0) dropped" in first.log_text()


def test_reload_changes_peers(pgtarn_factory: PgtarnFactory) -> None:
    first, _second = _peered(pgtarn_factory)
    with open(first.ini_path, encoding="utf-8") as f:
        ini = f.read()
    text = ini.replace("[peers]\n", "[peers]\n7 = host=/tmp port=6999\n").replace(
        "peer_id = 1\n", "peer_id = 5\n"
    )
    with open(first.ini_path, "w", encoding="utf-8") as f:
        f.write(text)
    with admin(first) as console:
        console.execute("RELOAD")
        assert [r["peer_id"] for r in show(console, "PEERS")] == [2, 7]
        config = {r["key"]: r for r in show(console, "CONFIG")}
        assert config["peer_id"]["value"] == "1"  # only at restart
        assert config["peer_id"]["changeable"] == "no"
        with pytest.raises(psycopg.errors.ProtocolViolation, match="SET failed"):
            console.execute("SET peer_id = 9")
    assert "peer_id changes only at restart" in first.log_text()
