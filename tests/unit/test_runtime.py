"""runtime.py: what the running pooler shares between connections."""

from __future__ import annotations

import os

import pytest

from pgtarn.configfile import parse_config
from pgtarn.errors import PgtarnError
from pgtarn.runtime import SHARED_PARAMS, Runtime

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


class Keyed:
    """What the runtime's index reads of a client: its key."""

    def __init__(self, key: tuple[int, int]) -> None:
        self.cancel_key = key


#: Two keys that fold into one index (cancelkey.index_of): the pid's top bits differ by the
#: secret's low bit.
KEY = ((1 << 30) | 5, 76)  # (every pid handed out has bit 30 set: cancelkey.make_key)
SAME_INDEX = ((1 << 30) | (1 << 28) | 5, 77)


def test_a_new_key_has_an_index_no_client_here_has(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = Runtime(parse_config(INI), {})
    assert runtime.add_client(Keyed(KEY))  # type: ignore[arg-type]
    # make_key's random bytes: first SAME_INDEX's (taken), then (12, 78)'s
    made = iter([b"".join(n.to_bytes(4, "big") for n in key) for key in (SAME_INDEX, (12, 78))])
    monkeypatch.setattr(os, "urandom", lambda size: next(made))
    assert runtime.new_key() == ((1 << 30) | 12, 78)


def test_a_client_is_found_by_its_whole_key_only() -> None:
    runtime = Runtime(parse_config(INI), {})
    client = Keyed(KEY)
    assert runtime.add_client(client)  # type: ignore[arg-type]
    assert runtime.client_by_key(KEY) is client
    assert runtime.client_by_key(SAME_INDEX) is None  # the same index is not enough
    assert runtime.client_by_key((6, 76)) is None
    assert runtime.client_by_key((KEY[0], 77)) is None
    same_secret = Keyed((6, 76))
    assert runtime.add_client(same_secret)  # type: ignore[arg-type]  # (a secret is not a key)
    assert runtime.client_by_key((6, 76)) is same_secret
    other = Keyed(SAME_INDEX)
    assert runtime.key_taken(SAME_INDEX)
    assert not runtime.add_client(other)  # type: ignore[arg-type]  # its index is taken
    assert runtime.client_by_key(KEY) is client
    assert not runtime.remove_client(other)  # type: ignore[arg-type]  # not the one there
    assert runtime.has_client(client)  # type: ignore[arg-type]
    assert runtime.remove_client(client)  # type: ignore[arg-type]
    assert not runtime.has_client(client)  # type: ignore[arg-type]
    assert list(runtime.clients.values()) == [same_secret]


class Lookup:
    """An auth_query lookup that records what it was told to forget."""

    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, user: str) -> None:
        self.forgotten.append(user)


def test_a_failed_password_forgets_a_looked_up_secret_and_never_raises() -> None:
    with_auth_db = INI + "auth_user = auth\nauth_dbname = authdb\n"
    runtime = Runtime(parse_config(with_auth_db + "[databases]\nauthdb = host=127.0.0.1\n"),
                      {})
    made: list[Lookup] = []
    runtime.make_lookup = lambda *_args: made.append(Lookup()) or made[-1]  # type: ignore
    db = runtime.config.find_database("app")
    assert db is not None
    lookup = runtime.secret_lookup(db)
    runtime.forget_secret(db, "alice")
    assert made == [lookup] and made[0].forgotten == ["alice"]
    runtime.lookups.clear()
    runtime.config = parse_config(with_auth_db)  # a RELOAD took authdb away
    runtime.forget_secret(db, "alice")
    assert runtime.lookups == {} and len(made) == 1
    with pytest.raises(PgtarnError):  # what asking for the lookup again would do
        runtime.secret_lookup(db)
