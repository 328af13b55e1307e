"""Pure-Python cost of pgtarn's transaction-mode hot path, with fake transports (no network).

Runs the steady state of `pgbench -S` through real ClientConnection / ServerConnection / Pool
objects: N clients on a pool of P servers, each client sending one Query and getting one
result. Prints microseconds per transaction; use it to compare hot-path changes (the
interpreter's work only: syscalls and the event loop are not in it). `--profile` runs it under
cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import deque
from typing import Any

from pgtarn.client.connection import ClientConnection
from pgtarn.config import parse_config
from pgtarn.proto import build
from pgtarn.runtime import Runtime
from pgtarn.server.connection import ServerConnection
from pgtarn.server.launch import server_login_for

INI = """
[databases]
bench = host=127.0.0.1 port=5432 dbname=bench
[pgbouncer]
auth_type = trust
pool_mode = transaction
default_pool_size = {pool}
max_client_conn = 100000
log_connections = 0
log_disconnections = 0
"""

QUERY = build.query("SELECT abalance FROM pgbench_accounts WHERE aid = 12345;")
SET_REPLY = build.command_complete("SET") + build.ready_for_query(b"I")
RESULT = (
    build.row_description([("abalance", 23)])
    + build.data_row(["0"])
    + build.command_complete("SELECT 1")
    + build.ready_for_query(b"I")
)


class FakeTransport:
    """Swallows writes; counts them."""

    def __init__(self) -> None:
        self.writes = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def setup(n_clients: int, pool_size: int) -> tuple[list[Any], list[ServerConnection]]:
    runtime = Runtime(parse_config(INI.format(pool=pool_size)), {"bench": ""})
    servers: list[ServerConnection] = []

    def launch(pool: Any, db: Any) -> ServerConnection:
        server = ServerConnection(runtime, pool, db, server_login_for(runtime, pool, db))
        server.connection_made(FakeTransport())  # type: ignore[arg-type]
        servers.append(server)
        return server

    runtime.registry.launch = launch
    clients = []
    for _ in range(n_clients):
        client = ClientConnection(runtime)
        client.connection_made(FakeTransport())  # type: ignore[arg-type]
        client.data_received(build.startup_message(
            {"user": "bench", "database": "bench", "application_name": "pgbench"}))
        log_in(servers)
        clients.append(client)
    return clients, servers


def log_in(servers: list[ServerConnection]) -> None:
    """Answer the login of every server that waits for it."""
    welcome = (
        build.authentication(0)
        + build.parameter_status("server_version", "15.0")
        + build.parameter_status("client_encoding", "UTF8")
        + build.parameter_status("DateStyle", "ISO, MDY")
        + build.parameter_status("TimeZone", "UTC")
        + build.parameter_status("standard_conforming_strings", "on")
        + build.parameter_status("application_name", "")
        + build.backend_key_data(1, 2)
        + build.ready_for_query(b"I")
    )
    for server in servers:
        if server.login is not None:
            server.data_received(welcome)


def run(n_clients: int, pool_size: int, transactions: int) -> float:
    clients, servers = setup(n_clients, pool_size)
    for client in clients:  # everyone sends a query: pool_size are linked, the rest wait
        client.data_received(QUERY)
        log_in(servers)  # the pool grew on demand
    busy = deque(s for s in servers if s.client is not None)
    done = 0
    start = time.perf_counter()
    while done < transactions:
        server = busy.popleft()
        while server.swallow:  # replies to the SETs of tracked parameters
            server.data_received(SET_REPLY)
        client = server.client
        assert client is not None  # busy servers are linked
        server.data_received(RESULT)  # client gets its result; server goes to the next waiter
        client.data_received(QUERY)  # that client asks again (queues)
        busy.append(server)
        done += 1
    return (time.perf_counter() - start) / transactions * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--pool", type=int, default=20)
    parser.add_argument("-n", "--transactions", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(args.clients, args.pool, args.transactions)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(20)
        return 0
    times = sorted(run(args.clients, args.pool, args.transactions) for _ in range(args.repeat))
    print(f"{args.clients} clients, pool {args.pool}: {times[0]:.2f} us/tx best, "
          f"{times[len(times) // 2]:.2f} median of {args.repeat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
