"""runtime.py: what the running pooler shares between connections."""

from __future__ import annotations

import pytest

from pgtarn import runtime as runtime_module
from pgtarn.configfile import parse_config
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


def test_a_new_key_has_a_secret_no_client_here_has(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = Runtime(parse_config(INI), {})
    first = Keyed((10, 77))
    assert runtime.add_client(first)  # type: ignore[arg-type]
    made = iter([(11, 77), (12, 78)])  # the first one's secret is taken
    monkeypatch.setattr(runtime_module, "make_key", lambda peer_id, worker: next(made))
    assert runtime.new_key() == (12, 78)


def test_a_client_is_found_by_its_whole_key_only() -> None:
    runtime = Runtime(parse_config(INI), {})
    client = Keyed((10, 77))
    assert runtime.add_client(client)  # type: ignore[arg-type]
    assert runtime.client_by_key((10, 77)) is client
    assert runtime.client_by_key((11, 77)) is None  # the secret alone is not enough
    assert runtime.client_by_key((10, 78)) is None
    other = Keyed((11, 77))
    assert not runtime.add_client(other)  # type: ignore[arg-type]  # its secret is taken
    assert runtime.client_by_key((10, 77)) is client
    assert not runtime.remove_client(other)  # type: ignore[arg-type]  # not the one there
    assert runtime.has_client(client)  # type: ignore[arg-type]
    assert runtime.remove_client(client)  # type: ignore[arg-type]
    assert not runtime.has_client(client) and runtime.clients == {}  # type: ignore[arg-type]
