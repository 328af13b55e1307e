"""Pure-Python cost of pgtarn's transaction-mode hot path, with fake transports (no network).

Runs the steady state of `pgbench -S` through real ClientConnection / ServerConnection / Pool
objects: N clients on a pool of P servers, each client sending one Query and getting one
result. `--prepared` sends Bind/Execute/Sync of a named prepared statement instead (its Parse
comes first, once per client), through the statement rewriting of transaction mode.

Prints microseconds per transaction; use it to compare hot-path changes (the interpreter's
work only: syscalls and the event loop are not in it). `--profile` runs it under cProfile.
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
from pgtarn.config.inifile import parse_config
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
PARSE = build.parse("s1", "SELECT abalance FROM pgbench_accounts WHERE aid = $1")
EXECUTE = build.bind("", "s1", ["12345"]) + build.execute() + build.SYNC
PARSE_COMPLETE = build.message(b"1")
BOUND_RESULT = (
    build.message(b"2")
    + build.data_row(["0"])
    + build.command_complete("SELECT 1")
    + build.ready_for_query(b"I")
)


class FakeTransport:
    """Swallows writes; counts them and keeps the last."""

    def __init__(self) -> None:
        self.writes = 0
        self.last = b""
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.last = data

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
        client.data_received(
            build.startup_message(
                {"user": "bench", "database": "bench", "application_name": "pgbench"}
            )
        )
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


def bound_result(server: ServerConnection) -> bytes:
    """The reply to what the server was sent last: a ParseComplete first if it got a Parse."""
    transport = server.transport
    assert isinstance(transport, FakeTransport)
    sent = transport.last
    return PARSE_COMPLETE + BOUND_RESULT if sent[:1] == b"P" else BOUND_RESULT


#: --literals: pgbench -S's query with a different aid each time (more than any cache holds).
LITERAL_QUERIES = [
    build.query(f"SELECT abalance FROM pgbench_accounts WHERE aid = {aid};")
    for aid in range(10_007, 30_007)
]


def run(
    n_clients: int,
    pool_size: int,
    transactions: int,
    prepared: bool = False,
    literals: bool = False,
) -> float:
    clients, servers = setup(n_clients, pool_size)
    query = EXECUTE if prepared else QUERY
    varied = LITERAL_QUERIES if literals else [query]
    for client in clients:  # everyone sends a query: pool_size are linked, the rest wait
        client.data_received(PARSE + query if prepared else query)
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
        # client gets its result; server goes to the next waiter
        server.data_received(bound_result(server) if prepared else RESULT)
        client.data_received(varied[done % len(varied)])  # that client asks again (queues)
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
    parser.add_argument(
        "--prepared",
        action="store_true",
        help="a named prepared statement (Bind/Execute/Sync) per transaction",
    )
    parser.add_argument(
        "--literals",
        action="store_true",
        help="a different literal in each simple query, as pgbench -S sends",
    )
    args = parser.parse_args()
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(args.clients, args.pool, args.transactions, args.prepared, args.literals)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(20)
        return 0
    times = sorted(
        run(args.clients, args.pool, args.transactions, args.prepared, args.literals)
        for _ in range(args.repeat)
    )
    kind = "prepared" if args.prepared else "simple query"
    if args.literals:
        kind += ", a new literal each time"
    print(
        f"{args.clients} clients, pool {args.pool}, {kind}: {times[0]:.2f} us/tx best, "
        f"{times[len(times) // 2]:.2f} median of {args.repeat}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
