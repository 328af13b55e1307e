"""runtime.py: what the running pooler shares between connections."""

from __future__ import annotations

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
