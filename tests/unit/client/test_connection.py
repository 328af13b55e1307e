"""ClientConnection's login driven through fake transports: no sockets, no PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from typing import Any

from pgtarn.auth.md5 import md5_response, md5_secret
from pgtarn.client.connection import ClientConnection, cancel_by_key
from pgtarn.config.inifile import parse_config
from pgtarn.config.settings import DatabaseEntry
from pgtarn.errors import PgtarnError
from pgtarn.pool.pool import Pool, PooledServer
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.proto.messages import parse_fields
from pgtarn.runtime import Runtime
from pgtarn.views.states import ClientState

INI = """
[databases]
app = host=127.0.0.1 port=5432 dbname=app
[pgbouncer]
listen_addr = 127.0.0.1
auth_type = {auth_type}
admin_users = alice
max_client_conn = {max_client_conn}
log_connections = 1
{extra}
"""


class FakeSocket:
    """What the connection asks of its socket: the family, options, a unix peer's identity."""

    def __init__(self, family: socket.AddressFamily) -> None:
        self.family = family

    def setsockopt(self, *args: Any) -> None:
        pass

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        assert (level, option) == (socket.SOL_SOCKET, socket.SO_PEERCRED)
        return struct.pack("3i", 4321, os.getuid(), os.getgid())


class FakeTransport(asyncio.Transport):
    """Keeps what is written; knows whether it was closed."""

    def __init__(self, family: socket.AddressFamily = socket.AF_INET) -> None:
        super().__init__()
        self.out = bytearray()
        self.closing = False
        self.socket = FakeSocket(family)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closing
        self.out += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            return self.socket
        if self.socket.family == socket.AF_UNIX:
            return default
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 6432)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def taken(self) -> list[tuple[str, bytes]]:
        """The messages written since last asked."""
        messages = [(chr(t), body) for t, body in split_messages(bytes(self.out))]
        self.out.clear()
        return messages


class FakeServer(PooledServer):
    """What a pool needs of a server connection, logging in for ever."""

    def __init__(self, connstr: str) -> None:
        self.connstr = connstr
        self.created_at = self.last_used = 0.0
        self.close_needed = False
        self.closed: list[str] = []

    def close(self, reason: str, wait: bool = False) -> None:
        self.closed.append(reason)

    def start_check(self) -> None:
        pass


def make_runtime(
    auth_type: str = "trust",
    users: dict[str, str] | None = None,
    max_client_conn: int = 100,
    extra: str = "",
) -> Runtime:
    config = parse_config(
        INI.format(auth_type=auth_type, max_client_conn=max_client_conn, extra=extra)
    )
    runtime = Runtime(config, dict(users if users is not None else {"alice": "pw", "bob": "pw"}))
    launched: list[FakeServer] = []

    def launch(pool: Pool[PooledServer], db: DatabaseEntry) -> FakeServer:
        server = FakeServer(pool.connstr)
        launched.append(server)
        return server

    runtime.registry.launch = launch
    return runtime


def connect(
    runtime: Runtime, family: socket.AddressFamily = socket.AF_INET
) -> tuple[ClientConnection, FakeTransport]:
    client = ClientConnection(runtime)
    transport = FakeTransport(family)
    client.connection_made(transport)
    return client, transport


def error_fields(messages: list[tuple[str, bytes]]) -> dict[str, str]:
    assert messages[-1][0] == "E", messages
    return parse_fields(messages[-1][1])


def auth_codes(messages: list[tuple[str, bytes]]) -> list[int]:
    return [struct.unpack("!I", body[:4])[0] for kind, body in messages if kind == "R"]


# --- the admin console ----------------------------------------------------------------------


def test_trust_login_into_the_admin_console() -> None:
    runtime = make_runtime()
    client, transport = connect(runtime)
    assert client.addr == "127.0.0.1:40000"
    client.data_received(
        build.startup_message(
            {"user": "alice", "database": "pgbouncer", "application_name": "psql"}
        )
    )
    messages = transport.taken()
    assert [kind for kind, _ in messages] == ["R"] + ["S"] * 9 + ["K", "Z"]
    assert auth_codes(messages) == [0]
    statuses = dict(body.rstrip(b"\x00").split(b"\x00") for kind, body in messages if kind == "S")
    assert statuses[b"server_version"].endswith(b"/pgtarn")
    assert statuses[b"application_name"] == b"psql"
    assert messages[-2][1] == struct.pack("!II", *client.cancel_key)
    assert client.state is ClientState.ADMIN and client.login is None
    assert client in runtime.admin_clients and client not in runtime.logins
    assert runtime.client_by_key(client.cancel_key) is client
    assert cancel_by_key(runtime, client.cancel_key)  # one of ours: nothing to cancel
    assert client.server is None
    assert client.params == {"application_name": "psql"}
    client.data_received(build.query("SHOW VERSION;"))
    assert [kind for kind, _ in transport.taken()] == ["T", "D", "C", "Z"]


def test_the_admin_console_refuses_others_after_their_password() -> None:
    runtime = make_runtime(auth_type="md5")
    client, transport = connect(runtime)
    client.data_received(build.startup_message({"user": "bob", "database": "pgbouncer"}))
    ((kind, body),) = transport.taken()
    assert auth_codes([(kind, body)]) == [5]
    response = md5_response("pw", "bob", body[4:8]) + b"\x00"
    client.data_received(build.password_message(response))
    messages = transport.taken()
    assert auth_codes(messages) == [0]
    assert error_fields(messages)["C"] == "28000"
    assert error_fields(messages)["M"] == "not allowed: not in admin_users or stats_users"
    assert transport.closing


def test_the_pooler_os_user_over_the_unix_socket_needs_no_password() -> None:
    runtime = make_runtime(auth_type="md5", users={})
    client, transport = connect(runtime, socket.AF_UNIX)
    assert client.addr == "unix"
    client.data_received(build.startup_message({"user": "pgbouncer", "database": "pgbouncer"}))
    messages = transport.taken()
    assert auth_codes(messages) == [0] and messages[-1] == ("Z", b"I")
    assert client.state is ClientState.ADMIN and client.login is None  # (its role: admin)
    assert client.admin is not None and client.admin.admin
    assert client.peer_pid == 4321


# --- pools ----------------------------------------------------------------------------------


def test_trust_login_into_a_pool_waits_for_its_first_server() -> None:
    runtime = make_runtime()
    client, transport = connect(runtime)
    client.data_received(
        build.startup_message({"user": "bob", "database": "app", "TimeZone": "Europe/Paris"})
    )
    assert auth_codes(transport.taken()) == [0]
    welcome = client.state  # (read once: mypy would keep client.state narrowed to it)
    assert welcome is ClientState.WELCOME and client not in runtime.logins
    pool = client.pool
    assert pool is not None and pool.welcome_waiters == [client]
    (server,) = pool.login
    pool.server_ready(server, {"server_version": "16.2", "TimeZone": "UTC"})
    messages = transport.taken()
    assert [kind for kind, _ in messages] == ["S", "S", "K", "Z"]
    assert messages[1][1] == b"TimeZone\x00Europe/Paris\x00"
    assert client.state is ClientState.READY and client.login is None
    assert runtime.client_by_key(client.cancel_key) is client
    assert client.params == {"TimeZone": "Europe/Paris"}
    assert client.joined and pool.logged_in == 1 and pool.stats.client_logins == 1


def test_bytes_before_the_welcome_are_refused() -> None:
    runtime = make_runtime()
    client, transport = connect(runtime)
    client.data_received(build.startup_message({"user": "bob", "database": "app"}))
    transport.taken()
    client.data_received(build.query("SELECT 1"))
    assert error_fields(transport.taken())["M"] == "message received before ReadyForQuery"
    assert transport.closing


def test_md5_login_into_a_pool_and_a_wrong_password() -> None:
    runtime = make_runtime(auth_type="md5", users={"bob": md5_secret("pw", "bob")})
    for password, expected in (("pw", [0]), ("nope", [])):
        client, transport = connect(runtime)
        client.data_received(build.startup_message({"user": "bob", "database": "app"}))
        ((_, body),) = transport.taken()
        client.data_received(
            build.password_message(md5_response(password, "bob", body[4:8]) + b"\x00")
        )
        messages = transport.taken()
        assert auth_codes(messages) == expected
        if not expected:
            assert error_fields(messages) == {
                "S": "FATAL",
                "V": "FATAL",
                "C": "28P01",
                "M": "password authentication failed",
            }
            assert transport.closing and client not in runtime.clients.values()


def test_unknown_database() -> None:
    runtime = make_runtime()
    client, transport = connect(runtime)
    client.data_received(build.startup_message({"user": "bob", "database": "nowhere"}))
    assert error_fields(transport.taken())["C"] == "3D000"


# --- first packets --------------------------------------------------------------------------


def test_a_bad_first_packet() -> None:
    runtime = make_runtime()
    client, transport = connect(runtime)
    body = struct.pack("!HH", 2, 0) + b"bob\x00" + b"\x00" * 60
    client.data_received(struct.pack("!I", len(body) + 4) + body)
    fields = error_fields(transport.taken())
    assert fields["C"] == "0A000"
    assert fields["M"] == "unsupported frontend protocol 2.0: server supports 3.0 to 3.0"
    assert transport.closing and client not in runtime.clients.values()
    assert client.close_reason == fields["M"]


def test_ssl_request_without_tls_then_startup() -> None:
    runtime = make_runtime()
    client, transport = connect(runtime)
    client.data_received(build.SSL_REQUEST)
    assert bytes(transport.out) == b"N"
    transport.out.clear()
    client.data_received(build.startup_message({"user": "alice", "database": "pgbouncer"}))
    assert client.state is ClientState.ADMIN and auth_codes(transport.taken()) == [0]


def test_direct_tls_without_tls_is_closed_quietly() -> None:
    runtime = make_runtime()
    client, transport = connect(runtime)
    client.data_received(b"\x16\x03\x01\x00\xa0\x01")
    assert transport.out == b"" and transport.closing
    assert client.close_reason == "direct TLS connection, but client TLS is disabled"


def test_max_client_conn_is_checked_before_the_startup_itself() -> None:
    runtime = make_runtime(max_client_conn=1)
    connect(runtime)
    client, transport = connect(runtime)
    client.data_received(build.startup_message({"database": "app"}))  # no user either
    fields = error_fields(transport.taken())
    assert (fields["C"], fields["M"]) == ("53300", "no more connections allowed (max_client_conn)")


def test_missing_user() -> None:
    runtime = make_runtime()
    client, transport = connect(runtime)
    client.data_received(build.startup_message({"database": "app"}))
    assert error_fields(transport.taken())["C"] == "28000"


def test_cancel_request_with_an_unknown_key_just_closes() -> None:
    runtime = make_runtime()
    client, transport = connect(runtime)
    client.data_received(build.cancel_request(1, 2))
    assert transport.out == b"" and transport.closing
    assert client.state is ClientState.CLOSED and client not in runtime.clients.values()
    client.connection_lost(None)
    assert client not in runtime.logins  # SHOW LISTS' login_clients does not grow


def test_terminate_while_asked_for_a_password() -> None:
    runtime = make_runtime(auth_type="md5")
    client, transport = connect(runtime)
    client.data_received(build.startup_message({"user": "bob", "database": "app"}))
    transport.taken()
    client.data_received(build.TERMINATE)
    assert transport.out == b"" and transport.closing


# --- auth_query -----------------------------------------------------------------------------


class FakeLookup:
    """auth_query's lookup: answers when released, remembers what it was told to forget."""

    def __init__(self, secret: str | None) -> None:
        self.answer = secret
        self.release = asyncio.Event()
        self.forgotten: list[str] = []

    async def secret(self, user: str) -> str | None:
        await self.release.wait()
        return self.answer

    def forget(self, user: str) -> None:
        self.forgotten.append(user)

    def retire(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_auth_query_secret_then_a_wrong_password() -> None:
    async def scenario() -> None:
        runtime = make_runtime(auth_type="plain", users={}, extra="auth_user = lookup")
        lookup = FakeLookup("pw")
        runtime.make_lookup = lambda runtime, db, user, query: lookup
        client, transport = connect(runtime)
        client.data_received(build.startup_message({"user": "carol", "database": "app"}))
        assert transport.out == b"" and client.state is ClientState.AUTH  # waits for it
        lookup.release.set()
        for _ in range(3):
            await asyncio.sleep(0)
        assert auth_codes(transport.taken()) == [3]
        client.data_received(build.password_message(b"nope\x00"))
        assert error_fields(transport.taken())["C"] == "28P01"
        assert lookup.forgotten == ["carol"]  # maybe changed since: asked again next time
        assert client.runtime.found_secrets  # kept for the servers' logins

    asyncio.run(scenario())


def test_auth_query_refuses_messages_before_the_challenge() -> None:
    async def scenario() -> None:
        runtime = make_runtime(auth_type="plain", users={}, extra="auth_user = lookup")
        lookup = FakeLookup("pw")
        runtime.make_lookup = lambda runtime, db, user, query: lookup
        client, transport = connect(runtime)
        client.data_received(
            build.startup_message({"user": "carol", "database": "app"})
            + build.password_message(b"pw\x00")
        )
        fields = error_fields(transport.taken())
        assert fields["M"] == "message received before an authentication request"
        lookup.release.set()
        for _ in range(3):
            await asyncio.sleep(0)
        assert transport.out == b""  # the lookup's answer came too late: nothing more

    asyncio.run(scenario())


def test_a_closing_client_leaves_every_container_at_once() -> None:
    # Its socket may still flush an error for a while; until connection_lost it must be
    # counted nowhere (SHOW POOLS, SHOW LISTS, max_client_conn) and get no server.
    runtime = make_runtime()
    client, transport = connect(runtime)
    client.data_received(build.startup_message({"user": "bob", "database": "app"}))
    pool = client.pool
    assert pool is not None
    (server,) = pool.login
    pool.server_ready(server, {"server_version": "16.2"})
    client.data_received(build.query("SELECT 1"))  # the one server is logging in: it waits
    assert client.joined and pool.logged_in == 1 and client in pool.waiting
    client.close(PgtarnError("query_wait_timeout", sqlstate="08P01"))
    assert not client.joined and pool.logged_in == 0 and client not in pool.waiting
    assert client not in runtime.clients.values() and client not in runtime.logins
    assert (pool.client_count, pool.waiting_client_count) == (0, 0)
    assert transport.closing
    client.connection_lost(None)  # the rest of the cleanup, and nothing twice
    assert not client.joined and pool.logged_in == 0
