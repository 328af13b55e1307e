"""The state of a handed-over client (--reboot) as a message, and the checks on the way in."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgtarn.restart.handover import (
    HandedClient,
    HandedStatement,
    HandoverError,
    decode_client,
    encode_client,
)


def _client() -> HandedClient:
    return HandedClient(
        user="app",
        database="app",
        cancel_key=(12345, -987654321),
        params={"application_name": "kept", "TimeZone": "UTC"},
        connect_time=1700000000.5,
        age=12.25,
        settings={"statement_timeout": "SET statement_timeout = '123s'"},
        startup_settings={"search_path": "SELECT pg_catalog.set_config('search_path', 'x', false)"},
        restore=True,
        framer=True,
        statements=[
            HandedStatement(b"_pg3_0", b"select $1::int\x00\x00\x01\x00\x00\x00\x17"),
            HandedStatement(b"s\xe9", b" (int) AS select $1", sql=True),
        ],
        scram_keys=(bytes(range(32)), bytes(range(32, 64))),
    )


def test_a_client_survives_json_as_it_was() -> None:
    client = _client()
    message = json.loads(json.dumps(encode_client(client)))
    assert decode_client(message) == client


def test_an_empty_session_round_trips() -> None:
    client = HandedClient("u", "db", (1, 2), {})
    assert decode_client(json.loads(json.dumps(encode_client(client)))) == client


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("v", 2),
        ("cancel_key", [1]),
        ("cancel_key", [1, "2"]),
        ("cancel_key", [True, 2]),
        ("user", None),
        ("params", {"a": 1}),
        ("settings", []),
        ("restore", 1),
        ("age", "1"),
        ("statements", [["a", "b"]]),
        ("statements", [["a", "\u0100", False]]),
        ("statements", [["a", "b", 0]]),
        ("scram_keys", ["00" * 32]),
        ("scram_keys", ["00" * 32, "zz" * 32]),
        ("scram_keys", ["00" * 32, "00" * 31]),
        ("scram_keys", "00" * 64),
    ],
)
def test_a_field_that_does_not_check_out_is_refused(name: str, value: Any) -> None:
    message = encode_client(_client())
    message[name] = value
    with pytest.raises(HandoverError):
        decode_client(message)


def test_a_missing_field_is_refused() -> None:
    message = encode_client(_client())
    del message["database"]
    with pytest.raises(HandoverError):
        decode_client(message)


def test_a_message_of_an_older_pgtarn_has_no_scram_keys() -> None:
    message = encode_client(_client())
    del message["scram_keys"]
    assert decode_client(message).scram_keys is None


def test_bad_scram_keys_are_not_shown_in_the_error() -> None:
    message = encode_client(_client())
    message["scram_keys"] = ["ab" * 32, "cd" * 31 + "zz"]
    with pytest.raises(HandoverError) as caught:
        decode_client(message)
    assert "abab" not in str(caught.value) and "cdcd" not in str(caught.value)
