"""runtime.py: what the running pooler shares between connections."""

from __future__ import annotations

import asyncio
import os
from typing import cast

import pytest

from pgtarn.config.inifile import parse_config
from pgtarn.config.settings import DatabaseEntry
from pgtarn.errors import PgtarnError
from pgtarn.pool.pool import Pool
from pgtarn.runtime import SHARED_PARAMS, HandOffSteps, Runtime
from pgtarn.views.protocols import ClientView

from .pool.test_pool import FakeClient, FakeServer, make_pool

INI = """
[databases]
app = host=127.0.0.1 dbname=app
[pgbouncer]
auth_type = trust
"""


def test_clients_with_the_same_parameters_share_one_dict() -> None:
    runtime = Runtime(parse_config(INI), {})
    first = runtime.shared_params({"TimeZone": "UTC", "DateStyle": "ISO, MDY"})
    assert runtime.shared_params({"DateStyle": "ISO, MDY", "TimeZone": "UTC"}) is first
    other = runtime.shared_params({"TimeZone": "UTC", "DateStyle": "German"})
    assert other is not first and other == {"TimeZone": "UTC", "DateStyle": "German"}


def test_the_shared_dicts_are_bounded() -> None:
    runtime = Runtime(parse_config(INI), {})
    for n in range(SHARED_PARAMS * 3):
        params = {"application_name": f"app{n}"}
        assert runtime.shared_params(params) is params
        assert len(runtime.params_forms) <= SHARED_PARAMS


class _Keyed:
    """What the runtime's index reads of a client: its key."""

    def __init__(self, key: tuple[int, int]) -> None:
        self.cancel_key = key


def keyed(key: tuple[int, int]) -> ClientView:
    """A client that is only its key: add_client, client_by_key, remove_client and has_client
    read nothing else of a ClientView."""
    return cast(ClientView, _Keyed(key))


#: Two keys that fold into one index (cancelkey.index_of): the pid's top bits differ by the
#: secret's low bit.
KEY = ((1 << 30) | 5, 76)  # (every pid handed out has bit 30 set: cancelkey.make_key)
SAME_INDEX = ((1 << 30) | (1 << 28) | 5, 77)


def test_a_new_key_has_an_index_no_client_here_has(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = Runtime(parse_config(INI), {})
    assert runtime.add_client(KEY, keyed(KEY))
    # make_key's random bytes: first SAME_INDEX's (taken), then (12, 78)'s
    made = iter([b"".join(n.to_bytes(4, "big") for n in key) for key in (SAME_INDEX, (12, 78))])
    monkeypatch.setattr(os, "urandom", lambda size: next(made))
    assert runtime.new_key() == ((1 << 30) | 12, 78)


def test_a_client_is_found_by_its_whole_key_only() -> None:
    runtime = Runtime(parse_config(INI), {})
    client = keyed(KEY)
    assert runtime.add_client(KEY, client)
    assert runtime.client_by_key(KEY) is client
    assert runtime.client_by_key(SAME_INDEX) is None  # the same index is not enough
    assert runtime.client_by_key((6, 76)) is None
    assert runtime.client_by_key((KEY[0], 77)) is None
    same_secret = keyed((6, 76))
    assert runtime.add_client((6, 76), same_secret)  # (a secret is not a key)
    assert runtime.client_by_key((6, 76)) is same_secret
    other = keyed(SAME_INDEX)
    assert runtime.key_taken(SAME_INDEX)
    assert not runtime.add_client(SAME_INDEX, other)  # its index is taken
    assert runtime.client_by_key(KEY) is client
    assert not runtime.remove_client(SAME_INDEX, other)  # not the one there
    assert runtime.has_client(client)
    assert runtime.remove_client(KEY, client)
    assert not runtime.has_client(client)
    assert list(runtime.clients.values()) == [same_secret]


class Lookup:
    """An auth_query lookup that records what it was told to forget."""

    def __init__(self) -> None:
        self.forgotten: list[str] = []

    async def secret(self, user: str) -> str | None:
        raise AssertionError("these tests look no secret up")

    def forget(self, user: str) -> None:
        self.forgotten.append(user)

    def retire(self) -> None:
        pass

    def close(self) -> None:
        pass


def _lookups(ini: str) -> tuple[Runtime, list[tuple[str, str, str]]]:
    """A Runtime on ini whose lookups record (target database, auth_user, query)."""
    runtime = Runtime(parse_config(ini), {})
    made: list[tuple[str, str, str]] = []

    def make(_runtime: Runtime, target: DatabaseEntry, auth_user: str, query: str) -> Lookup:
        made.append((target.name, auth_user, query))
        return Lookup()

    runtime.make_lookup = make
    return runtime, made


def test_a_failed_password_forgets_a_looked_up_secret_and_never_raises() -> None:
    with_auth_db = INI + "auth_user = auth\nauth_dbname = authdb\n"
    runtime, made = _lookups(with_auth_db + "[databases]\nauthdb = host=127.0.0.1\n")
    db = runtime.config.find_database("app")
    assert db is not None
    lookup = runtime.secret_lookup(db)
    assert isinstance(lookup, Lookup)
    runtime.forget_secret("alice")
    assert len(made) == 1 and lookup.forgotten == ["alice"]
    runtime.lookups.clear()
    runtime.config = parse_config(with_auth_db)  # a RELOAD took authdb away
    runtime.forget_secret("alice")
    assert runtime.lookups == {} and len(made) == 1
    with pytest.raises(PgtarnError, match="bouncer config error"):  # the next login's lookup
        runtime.secret_lookup(db)


def test_where_auth_query_looks_users_up() -> None:
    """As PgBouncer: the entry's auth_dbname, else the global one, else the client's own
    database; the admin console has only the global one."""
    ini = (
        INI + "auth_user = auth\n[databases]\nlookups = host=127.0.0.1 dbname=postgres\n"
        "own = host=127.0.0.1 auth_dbname=lookups auth_user=own_auth\n"
    )
    runtime, made = _lookups(ini)
    app, own = runtime.config.find_database("app"), runtime.config.find_database("own")
    assert app is not None and own is not None
    assert runtime.secret_lookup(app) is not None and runtime.secret_lookup(own) is not None
    assert [(name, user) for name, user, _query in made] == [
        ("app", "auth"),
        ("lookups", "own_auth"),
    ]
    with pytest.raises(PgtarnError, match="bouncer config error"):
        runtime.secret_lookup(None)  # the console: no auth_dbname, nowhere to look
    runtime.config = parse_config(ini + "[pgbouncer]\nauth_dbname = lookups\n")
    assert runtime.secret_lookup(None) is not None
    assert made[-1][:2] == ("lookups", "auth")
    assert runtime.secret_lookup(None) is runtime.secret_lookup(app)  # the same target
    runtime.registry.disabled.add("lookups")
    with pytest.raises(PgtarnError, match='authentication database "lookups" is disabled'):
        runtime.secret_lookup(app)
    runtime.config = parse_config(INI)  # no auth_user: no lookup
    assert runtime.secret_lookup(app) is None


@pytest.mark.parametrize(
    ("entry", "logged"),
    [
        ("auth_dbname=pgbouncer", 'cannot use the reserved "pgbouncer" database as an auth_dbname'),
        ("auth_dbname=pgtarn", 'cannot use the reserved "pgtarn" database as an auth_dbname'),
        ("auth_dbname=elsewhere", 'authentication database "elsewhere" is not configured'),
    ],
)
def test_an_auth_dbname_that_is_no_database_is_a_config_error(
    entry: str, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime, made = _lookups(INI + f"auth_user = auth\n[databases]\nodd = host=x {entry}\n")
    odd = runtime.config.find_database("odd")
    assert odd is not None
    with pytest.raises(PgtarnError, match="bouncer config error"):
        runtime.secret_lookup(odd)
    assert logged in caplog.text and made == []


class Failing(FakeClient):
    """A client whose taking of a server fails (a bug): the runtime goes on with the rest."""

    def server_assigned(self, server: FakeServer) -> None:
        raise RuntimeError("a client failed taking its server")


class Resuming(FakeClient):
    """A client that, given a server, resumes another pool (a hand-off asked then)."""

    def __init__(self, other: Pool[FakeServer]) -> None:
        super().__init__("resuming")
        self.other = other

    def server_assigned(self, server: FakeServer) -> None:
        super().server_assigned(server)
        self.other.resume()


def paused_pool_with_a_waiter(waiter: FakeClient) -> tuple[Pool[FakeServer], FakeServer]:
    """A paused pool whose one server is idle, and waiter waiting for it."""
    pool, _clock, launched = make_pool(pool_size=1)
    holder = FakeClient("holder")
    pool.acquire(holder)
    pool.server_ready(launched[0], {})
    assert holder.server is launched[0]
    pool.pause()
    pool.release(launched[0])
    pool.acquire(waiter)
    return pool, launched[0]


def test_the_hand_offs_run_once_the_callback_is_over_in_order() -> None:
    """Servers handed to waiting clients outside a read of their own (RESUME) in one
    callback are lent together after it, in order; one handed during the run is lent in
    the same run; a client that fails taking its server (a bug, logged) does not stop the
    others."""
    handoffs = HandOffSteps()
    failing, later, waiter = Failing("failing"), FakeClient("later"), FakeClient("waiter")

    async def scenario() -> None:
        broken, _ = paused_pool_with_a_waiter(failing)
        third, third_server = paused_pool_with_a_waiter(later)
        second, _ = paused_pool_with_a_waiter(Resuming(third))
        broken.acquire(waiter)  # behind the failing one
        for pool in (broken, second, third):
            pool.defer = handoffs
        broken.resume()
        second.resume()
        assert [pool for pool, _ in handoffs.pending] == [broken, second]  # not run inside
        assert waiter.server is None and later.server is None
        await asyncio.sleep(0)
        assert list(broken.waiting) == [waiter]  # (the server went with the failure)
        assert later.server is third_server  # handed during the run: in the same run
        assert not handoffs.pending

    asyncio.run(scenario())
