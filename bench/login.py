"""Pure-Python cost of one client login (SCRAM-SHA-256 against a stored verifier), no network.

Drives real ClientConnection objects through fake transports the way a connect storm does
(bench/storm.py): connection_made, StartupMessage, SASLInitialResponse, SASLResponse, the
welcome from the pool, then the client leaves (Terminate, connection_lost). The pool's one
server logged in before the clock starts, so every timed login gets the welcome at once.

The client side of SCRAM (pgtarn's own ScramClient with the keys known, so no PBKDF2) is
timed apart and left out: the figures are pgtarn's work per login, in microseconds, by phase
and in total, without syscalls or the event loop. `--profile` runs it under cProfile instead.

    PYTHONPATH=src python3 bench/login.py
    PYTHONPATH=src python3 bench/login.py --profile
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import hmac
import logging
import pstats
import socket
import sys
import time
from typing import Any

from pgtarn.auth.scram import ScramClient, make_verifier
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
auth_type = scram-sha-256
pool_mode = transaction
default_pool_size = 20
max_client_conn = 100000
log_connections = {log}
log_disconnections = {log}
"""
PASSWORD = "bench-password"
STARTUP = build.startup_message({"user": "bench", "database": "bench", "application_name": "storm"})
SERVER_WELCOME = (
    build.AUTH_OK
    + b"".join(build.parameter_status(k, v) for k, v in (
        ("application_name", ""), ("client_encoding", "UTF8"), ("DateStyle", "ISO, MDY"),
        ("default_transaction_read_only", "off"), ("in_hot_standby", "off"),
        ("integer_datetimes", "on"), ("IntervalStyle", "postgres"), ("is_superuser", "off"),
        ("server_encoding", "UTF8"), ("server_version", "15.0"),
        ("session_authorization", "bench"), ("standard_conforming_strings", "on"),
        ("TimeZone", "UTC")))
    + build.backend_key_data(1, 2)
    + build.ready_for_query(b"I")
)  # fmt: skip
#: One real (unconnected) TCP socket: the login's setsockopt calls are real system calls.
_SOCKET = socket.socket(socket.AF_INET, socket.SOCK_STREAM)


class FakeTransport:
    """Keeps what is written; a TCP peer."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            return _SOCKET
        if name == "peername":
            return ("127.0.0.1", 40000)
        if name == "sockname":
            return ("127.0.0.1", 6432)
        return default

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _auth_body(transport: FakeTransport, index: int) -> bytes:
    """The body of the Authentication message written at index (SASLContinue / SASLFinal)."""
    data = transport.written[index]
    length = int.from_bytes(data[1:5], "big")
    return data[9 : 1 + length]


def make_runtime(log_connections: bool) -> tuple[Runtime, bytes, bytes]:
    verifier = make_verifier(PASSWORD)
    salted = hashlib.pbkdf2_hmac("sha256", PASSWORD.encode(), verifier.salt,
                                 verifier.iterations)  # fmt: skip
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    runtime = Runtime(parse_config(INI.format(log=int(log_connections))),
                      {"bench": verifier.to_string()})  # fmt: skip

    def launch(pool: Any, db: Any) -> ServerConnection:
        server = ServerConnection(runtime, pool, db, server_login_for(runtime, pool, db))
        server.connection_made(FakeTransport())  # type: ignore[arg-type]
        server.data_received(SERVER_WELCOME)
        return server

    runtime.registry.launch = launch
    return runtime, client_key, verifier.server_key


class Timer:
    """Seconds spent per phase of the login; "client" is the client's side (subtracted)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.at = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.spent[phase] += now - self.at
        self.at = now


#: connection_made; StartupMessage to AuthenticationSASL (access decision, secret, SCRAM
#: challenge); client-first to server-first; client-final to SASLFinal + welcome; Terminate
#: and connection_lost.
PHASES = ("accept", "startup", "scram first", "scram final + welcome", "leave", "client")


def one_login(runtime: Runtime, client_key: bytes, server_key: bytes, timer: Timer,
              leave: bool = True) -> ClientConnection:  # fmt: skip
    transport = FakeTransport()
    timer.lap("client")
    client = ClientConnection(runtime)
    client.connection_made(transport)  # type: ignore[arg-type]
    timer.lap("accept")
    client.data_received(STARTUP)
    timer.lap("startup")
    scram = ScramClient(client_key=client_key, server_key=server_key)
    first = build.sasl_initial_response("SCRAM-SHA-256", scram.client_first())
    timer.lap("client")
    client.data_received(first)
    timer.lap("scram first")
    final = build.sasl_response(scram.handle_server_first(_auth_body(transport, -1)))
    sent = len(transport.written)
    timer.lap("client")
    client.data_received(final)
    timer.lap("scram final + welcome")
    scram.handle_server_final(_auth_body(transport, sent))  # SASLFinal, then the welcome
    if transport.written[-1][-6:] != build.ready_for_query(b"I"):
        raise RuntimeError(f"login did not end with ReadyForQuery: {transport.written[-1]!r}")
    timer.lap("client")
    if leave:
        client.data_received(build.TERMINATE)
        client.connection_lost(None)
        timer.lap("leave")
    return client


def run(logins: int, log_connections: bool = False) -> dict[str, float]:
    """Microseconds of pgtarn's work per login, by phase ("total": all but the client's)."""
    runtime, client_key, server_key = make_runtime(log_connections)
    one_login(runtime, client_key, server_key, Timer())  # the pool's server logs in here
    timer = Timer()
    for _ in range(logins):
        one_login(runtime, client_key, server_key, timer)
    per_login = {phase: spent / logins * 1e6 for phase, spent in timer.spent.items()}
    del per_login["client"]
    per_login["total"] = sum(per_login.values())
    return per_login


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--logins", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--log-connections",
        action="store_true",
        help="log_connections and log_disconnections on (to /dev/null)",
    )
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime", help="--profile: pstats sort key")
    parser.add_argument("--lines", type=int, default=30, help="--profile: lines shown")
    args = parser.parse_args()
    if args.log_connections:  # the lines are formatted and handled, then thrown away
        logging.basicConfig(level=logging.INFO, stream=open("/dev/null", "w"))  # noqa: SIM115
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(args.logins, args.log_connections)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats(args.sort).print_stats(args.lines)
        return 0
    runs = [run(args.logins, args.log_connections) for _ in range(args.repeat)]
    for phase in (*PHASES[:-1], "total"):
        times = sorted(r[phase] for r in runs)
        print(
            f"{phase:>22}: {times[len(times) // 2]:6.1f} us/login median of {args.repeat} "
            f"(best {times[0]:.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
