"""The welcome cache: build_welcome's welcomes, made once per set of what they are made of."""

from __future__ import annotations

import struct

import pytest

from pgtarn.proto import build
from pgtarn.proto.welcome import WELCOME_END, WELCOMES, WelcomeCache, build_welcome, welcome_ended

KEY = (1234, 5678)


class Sharing:
    """The runtime's sharing of parameter dicts, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, params: dict[str, str]) -> dict[str, str]:
        self.calls += 1
        return params


def test_the_welcome_cache_gives_build_welcome_s_welcome_made_once() -> None:
    server = {"client_encoding": "UTF8", "DateStyle": "ISO, MDY", "TimeZone": "UTC"}
    tracked = ("client_encoding", "DateStyle", "TimeZone", "application_name")
    given = {"application_name": "app", "DateStyle": "german"}
    cache, share = WelcomeCache(), Sharing()
    first = cache.welcome(server, given, tracked, KEY, {}, share)
    again = cache.welcome(server, dict(given), tracked, (5, 6), {}, share)
    assert first.data == build_welcome(server, given, tracked, KEY).data
    assert first.params == build_welcome(server, given, tracked, KEY).params
    assert again.data == build_welcome(server, given, tracked, (5, 6)).data
    # made and shared once: the second client gets the very dict the first did
    assert share.calls == 1 and again.params is first.params


def test_the_welcome_cache_follows_what_it_is_made_of() -> None:
    server = {"client_encoding": "UTF8", "TimeZone": "UTC"}
    tracked = ("client_encoding", "TimeZone")
    given = {"TimeZone": "europe/paris"}
    cache, share = WelcomeCache(), Sharing()
    assert cache.welcome(server, given, tracked, KEY, {}, share).params["TimeZone"] == (
        "europe/paris"
    )
    # a server reported the value's own spelling since: the next welcome says it
    learned = {("TimeZone", "europe/paris"): "Europe/Paris"}
    assert cache.welcome(server, given, tracked, KEY, learned, share).params["TimeZone"] == (
        "Europe/Paris"
    )
    # another pool's server parameters, and more tracked names: welcomes of their own
    other = {"client_encoding": "LATIN1", "TimeZone": "UTC", "search_path": "s"}
    assert cache.welcome(other, {}, tracked, KEY, {}, share).params == {
        "client_encoding": "LATIN1",
        "TimeZone": "UTC",
    }
    assert cache.welcome(other, {}, (*tracked, "search_path"), KEY, {}, share).params == {
        "client_encoding": "LATIN1",
        "TimeZone": "UTC",
        "search_path": "s",
    }
    assert cache.welcome(server, {}, tracked, KEY, {}, share).params == {
        "client_encoding": "UTF8",
        "TimeZone": "UTC",
    }


def test_the_welcome_cache_is_bounded() -> None:
    server = {"client_encoding": "UTF8"}
    cache, share = WelcomeCache(), Sharing()
    for n in range(WELCOMES + 10):
        cache.welcome(server, {"application_name": f"a{n}"}, ("application_name",), KEY, {}, share)
        assert len(cache.entries) <= WELCOMES


def test_a_welcome_ends_with_the_key_and_ready_for_query_in_both_builds() -> None:
    statuses = build.parameter_status("server_version", "15.4")
    for pid, secret in ((0, 0), (1, 2), (0x7FFFFFFF, 0xFFFFFFFF), (0x4ABCDEF0, 0x01020304)):
        expected = statuses + build.backend_key_data(pid, secret) + build.ready_for_query(b"I")
        assert WELCOME_END(statuses, pid, secret) == expected
        assert welcome_ended(statuses, pid, secret) == expected
        assert WELCOME_END(b"", pid, secret) == expected[len(statuses) :]
    for end in (WELCOME_END, welcome_ended):
        with pytest.raises((OverflowError, struct.error)):
            end(statuses, 1 << 32, 0)
