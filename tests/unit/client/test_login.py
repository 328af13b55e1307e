"""ClientLoginDriver alone: a login driven for a stand-in of its connection (LoginClient)."""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import Callable
from typing import Any, cast

import pytest

from pgtarn.auth.md5 import md5_response
from pgtarn.client.interfaces import LoginClient
from pgtarn.client.login import ClientLoginDriver, tracked_names
from pgtarn.config.inifile import parse_config
from pgtarn.config.settings import DatabaseEntry
from pgtarn.errors import PgtarnError
from pgtarn.net.tls import TlsTransport
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.runtime import Runtime
from pgtarn.views.protocols import ClientView
from pgtarn.views.states import ClientState

INI = """
[databases]
app = host=127.0.0.1 port=5432 dbname=app
[pgbouncer]
auth_type = {auth_type}
admin_users = alice
stats_users = sam
max_client_conn = {max_client_conn}
log_connections = 0
{extra}
"""


def counted(client: Client) -> ClientView:
    """A login's fake client in the runtime's client table, where the client limits count
    it (by its user and database: all they read of a ClientView)."""
    return cast(ClientView, client)


class Client:
    """What a login needs of its connection, and a record of what the login asked of it."""

    def __init__(
        self, runtime: Runtime, addr: str = "127.0.0.1:40000", same_os_user: bool = False
    ) -> None:
        self.runtime = runtime
        self.state = ClientState.STARTUP
        self.user = self.database = self.replication = self.close_reason = ""
        self.db: DatabaseEntry | None = None
        self.addr = addr
        self.tls: TlsTransport | None = None
        self.transport: Any = object()
        self.login: object = None
        self.out = bytearray()
        self.closed: list[PgtarnError | None] = []
        self.authenticated_with: list[tuple[tuple[bytes, bytes] | None, bytes]] = []
        self.cancels: list[tuple[int, int]] = []
        self._same_os_user = same_os_user

    def write(self, data: bytes) -> None:
        self.out += data

    def close(
        self, error: PgtarnError | None = None, response: bytes | None = None, reason: str = ""
    ) -> None:
        self.state = ClientState.CLOSED
        self.closed.append(error)

    def same_os_user(self) -> bool:
        return self._same_os_user

    def peer_os_user(self) -> str | None:
        return None

    def wrap_tls(
        self,
        context: ssl.SSLContext,
        received: bytes,
        binding: bytes | None,
        on_ready: Callable[[], None],
        on_failed: Callable[[Exception], None],
    ) -> TlsTransport:
        raise AssertionError("no TLS in these tests")

    def authenticated(self, scram_keys: tuple[bytes, bytes] | None, auth_ok: bytes) -> None:
        self.authenticated_with.append((scram_keys, auth_ok))

    def cancel_request(self, key: tuple[int, int]) -> None:
        self.cancels.append(key)

    def taken(self) -> list[tuple[str, bytes]]:
        messages = [(chr(t), body) for t, body in split_messages(bytes(self.out))]
        self.out.clear()
        return messages


def make(
    auth_type: str = "trust", max_client_conn: int = 100, extra: str = "", **client: Any
) -> tuple[ClientLoginDriver, Client]:
    config = parse_config(
        INI.format(auth_type=auth_type, max_client_conn=max_client_conn, extra=extra)
    )
    runtime = Runtime(config, {"alice": "pw", "bob": "pw"})
    fake = Client(runtime, **client)
    checked: LoginClient = fake  # (mypy: the stand-in is a LoginClient)
    login = ClientLoginDriver(checked)
    fake.login = login
    return login, fake


def test_a_trust_login_hands_the_connection_its_authentication_ok() -> None:
    login, client = make()
    login.receive(build.startup_message({"user": "bob", "database": "app"}))
    assert (client.user, client.database, client.state) == ("bob", "app", ClientState.AUTH)
    assert client.db is not None and client.db.name == "app"
    # AuthenticationOk is not written: the connection sends it with the welcome
    assert client.out == b"" and client.authenticated_with == [(None, build.authentication(0))]
    assert not login.admin_login and login.admin_role() is None


def test_a_wrong_md5_password_closes_with_its_error() -> None:
    login, client = make(auth_type="md5")
    login.receive(build.startup_message({"user": "bob", "database": "app"}))
    ((kind, body),) = client.taken()
    assert kind == "R" and struct.unpack("!I", body[:4])[0] == 5
    login.receive(build.password_message(md5_response("nope", "bob", body[4:8]) + b"\x00"))
    (error,) = client.closed
    assert error is not None and error.sqlstate == "28P01"
    assert client.authenticated_with == []


def test_the_right_md5_password_authenticates() -> None:
    login, client = make(auth_type="md5")
    login.receive(build.startup_message({"user": "bob", "database": "app"}))
    ((_kind, body),) = client.taken()
    login.receive(build.password_message(md5_response("pw", "bob", body[4:8]) + b"\x00"))
    assert client.closed == [] and client.authenticated_with == [(None, build.authentication(0))]


def test_max_client_conn_counts_the_runtime_clients() -> None:
    login, client = make(max_client_conn=0)
    client.runtime.clients[1] = counted(client)
    with pytest.raises(PgtarnError) as refused:
        login.receive(build.startup_message({"user": "bob", "database": "app"}))
    assert refused.value.message == "no more connections allowed (max_client_conn)"


def test_the_pooler_os_user_gets_the_admin_console_without_a_password() -> None:
    login, client = make(auth_type="md5", addr="unix", same_os_user=True)
    login.receive(build.startup_message({"user": "pgbouncer", "database": "pgbouncer"}))
    assert login.local_admin and login.admin_login and login.admin_role() == "admin"
    assert client.db is None and client.authenticated_with == [(None, build.authentication(0))]


def test_admin_roles() -> None:
    login, client = make()
    for user, role in (("alice", "admin"), ("sam", "stats"), ("bob", None)):
        client.user = user
        assert login.admin_role() == role


def test_tls_is_refused_over_a_unix_socket() -> None:
    login, client = make(addr="unix")
    login.receive(build.SSL_REQUEST)
    assert bytes(client.out) == b"N"


def test_a_cancel_request_goes_to_the_connection() -> None:
    login, client = make()
    login.receive(build.cancel_request(7, 8))
    assert client.cancels == [(7, 8)]


def test_the_client_limits() -> None:
    login, client = make(extra="max_user_client_connections = 1")
    other = Client(client.runtime)
    other.user = "bob"
    client.runtime.clients[1] = counted(other)
    client.runtime.clients[2] = counted(client)
    client.user = "bob"
    with pytest.raises(PgtarnError) as refused:
        login.receive(build.startup_message({"user": "bob", "database": "app"}))
    assert refused.value.message == "client connections exceeded (max_user_client_connections)"


def test_a_database_s_own_client_limit_counts_without_a_global_one() -> None:
    # (the login reads its settings once per Config: a database's own limit must be seen)
    login, client = make()
    runtime = client.runtime
    runtime.config = parse_config(
        INI.replace("dbname=app", "dbname=app max_db_client_connections=1").format(
            auth_type="trust", max_client_conn=100, extra=""
        )
    )
    other = Client(runtime)
    other.database = "app"
    runtime.clients[1] = counted(other)
    runtime.clients[2] = counted(client)
    with pytest.raises(PgtarnError) as refused:
        login.receive(build.startup_message({"user": "bob", "database": "app"}))
    assert refused.value.message == "client connections exceeded (max_db_client_connections)"


def test_a_login_reads_the_configuration_in_force() -> None:
    first, client = make(max_client_conn=5)
    first.receive(build.startup_message({"user": "bob", "database": "app"}))
    assert client.authenticated_with  # (5 allowed)
    login, client = make(max_client_conn=5)
    client.runtime.clients[1] = counted(client)
    client.runtime.config = parse_config(
        INI.format(auth_type="trust", max_client_conn=0, extra="")
    )  # as RELOAD or SET puts a new Config in force
    with pytest.raises(PgtarnError) as refused:
        login.receive(build.startup_message({"user": "bob", "database": "app"}))
    assert refused.value.message == "no more connections allowed (max_client_conn)"


def test_waiting_while_authenticating_and_still_held() -> None:
    login, client = make(auth_type="md5")
    assert not login.waiting()  # not authenticating yet
    login.receive(build.startup_message({"user": "bob", "database": "app"}))
    assert login.waiting()
    client.login = None  # the connection dropped it (closed)
    assert not login.waiting()


def test_auth_query_answers_no_such_user() -> None:
    class Lookup:
        async def secret(self, user: str) -> str | None:
            return None

        def forget(self, user: str) -> None:
            self.forgotten = user

        def retire(self) -> None:
            pass

        def close(self) -> None:
            pass

    async def scenario() -> None:
        login, client = make(auth_type="md5", extra="auth_user = lookup")
        lookup = Lookup()
        client.runtime.make_lookup = lambda *args: lookup
        login.receive(build.startup_message({"user": "carol", "database": "app"}))
        assert login.looked_up and client.state is ClientState.AUTH and client.out == b""
        for _ in range(3):
            await asyncio.sleep(0)
        (error,) = client.closed
        assert error is not None and (error.sqlstate, error.message) == ("28000", "no such user")
        assert lookup.forgotten == "carol"

    asyncio.run(scenario())


def test_tracked_names_add_track_extra_parameters() -> None:
    _login, client = make(extra="track_extra_parameters = search_path")
    names = tracked_names(client.runtime.config)
    assert names[0] == "client_encoding" and names[-1] == "search_path"


def test_a_startup_without_a_user_is_refused_by_the_machine() -> None:
    login, client = make()
    login.receive(build.startup_message({"database": "app"}))
    (error,) = client.closed
    assert error is not None and error.sqlstate == "28000"
    assert client.user == "" and client.authenticated_with == []
