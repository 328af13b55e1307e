"""A connect storm: 5,000 SCRAM logins at once against max_client_conn 4,000 and pool_size 20.

Every client is accepted or refused with 53300, none hangs, and the accepted ones are
served. The SCRAM iteration count is lowered (scram_iterations = 16) so the test's own
client, which runs in one Python process, is not the bottleneck; bench/storm.py runs the
same storm with 4096 iterations and compares PgBouncer.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import time
from collections import Counter

import pytest

from pgtarn.errors import PgtarnError
from pgtarn.proto import build
from pgtarn.proto.server_login import ServerAuth
from tests.support import PgtarnProcess

from .conftest import PgtarnFactory
from .rawpg import error_fields

pytestmark = pytest.mark.integration

CLIENTS = 5000
MAX_CLIENT_CONN = 4000
HANG = 60.0  # seconds without an answer that count as a hang


async def read_message(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = await reader.readexactly(5)
    return header[0], await reader.readexactly(int.from_bytes(header[1:], "big") - 4)


async def storm_client(
    proc: PgtarnProcess, all_tried: asyncio.Event, tried: list[int]
) -> tuple[str, float]:
    """('ok', login seconds), or ('refused:<sqlstate>' | 'error:<text>', 0)."""
    started = time.monotonic()
    writer = None
    counted = False

    def count() -> None:  # this client has had its answer
        nonlocal counted
        if not counted:
            counted = True
            tried[0] += 1
            if tried[0] == CLIENTS:
                all_tried.set()

    try:
        reader, writer = await asyncio.open_connection(proc.host, proc.port)
        login = ServerAuth("app", "app_pass")
        writer.write(build.startup_message({"user": "app", "database": "app"}))
        try:
            while not login.done:
                reply = login.feed(*await read_message(reader))
                if reply:
                    writer.write(reply)
        except PgtarnError as error:
            return f"refused:{error.sqlstate}", 0.0
        latency = time.monotonic() - started
        writer.write(build.query("select 42"))
        rows = []
        while True:
            msg_type, body = await read_message(reader)
            if msg_type == ord("D"):
                rows.append(body)
            elif msg_type == ord("E"):
                return f"error:{error_fields(body).get('M')}", 0.0
            elif msg_type == ord("Z"):
                break
        if rows != [b"\x00\x01\x00\x00\x00\x0242"]:
            return f"error:rows {rows!r}", 0.0
        count()
        await all_tried.wait()  # hold the connection: the ceiling must really be reached
        writer.write(build.TERMINATE)
        return "ok", latency
    except (OSError, asyncio.IncompleteReadError) as exc:
        return f"error:{exc!r}", 0.0
    finally:
        count()
        if writer is not None:
            writer.close()


def test_connect_storm_is_accepted_or_refused_cleanly(
    pgtarn_factory: PgtarnFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < CLIENTS + 500:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {CLIENTS + 500}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    proc = pgtarn_factory(
        settings={
            "default_pool_size": 20,
            "max_client_conn": MAX_CLIENT_CONN,
            "scram_iterations": 16,
            "log_connections": 0,
            "log_disconnections": 0,
            "log_pooler_errors": 0,
        }
    )

    async def storm() -> list[tuple[str, float]]:
        all_tried = asyncio.Event()
        tried = [0]

        async def bounded() -> tuple[str, float]:
            try:
                return await asyncio.wait_for(storm_client(proc, all_tried, tried), HANG)
            except TimeoutError:
                return "hang", 0.0

        return list(await asyncio.gather(*(bounded() for _ in range(CLIENTS))))

    started = time.monotonic()
    results = asyncio.run(storm())
    elapsed = time.monotonic() - started
    outcomes = Counter(kind for kind, _ in results)
    assert outcomes == {"ok": MAX_CLIENT_CONN, "refused:53300": CLIENTS - MAX_CLIENT_CONN}, outcomes
    latencies = sorted(latency for kind, latency in results if kind == "ok")
    quantiles = statistics.quantiles(latencies, n=100)
    with capsys.disabled():
        print(
            f"\nstorm: {CLIENTS} SCRAM clients, max_client_conn {MAX_CLIENT_CONN}: "
            f"{outcomes['ok']} accepted, {outcomes['refused:53300']} refused, 0 hangs in "
            f"{elapsed:.1f} s; login ms p50 {quantiles[49] * 1000:.0f}, "
            f"p99 {quantiles[98] * 1000:.0f}, max {latencies[-1] * 1000:.0f}"
        )
