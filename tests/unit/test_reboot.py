"""Tests for pgtarn.reboot: which clients a takeover may hand over now."""

from __future__ import annotations

from pgtarn.proto import build
from pgtarn.reboot import idle_reason

from .client.pair import Pool, sent, types


def test_a_client_whose_first_parse_was_cut_is_idle_again_once_answered() -> None:
    """The framer takes over in the middle of the cut Parse: the relay's scanner, which held
    its start, must not keep the client "busy" for good."""
    pool = Pool(prepared=5)
    client, transport = pool.client()
    parse = build.parse("s1", "SELECT 1")
    client.data_received(parse[:6])
    assert idle_reason(client) == "busy"  # half a message read
    client.data_received(parse[6:] + build.SYNC)
    (server,) = pool.servers
    assert types(sent(server)) == "PS"
    server.data_received(build.message(b"1") + build.ready_for_query(b"I"))
    assert types(transport.take()) == "1Z"
    assert idle_reason(client) == ""


def test_a_client_in_the_middle_of_a_message_through_its_framer_is_busy() -> None:
    pool = Pool(prepared=5)
    client, transport = pool.client()
    client.data_received(build.parse("s1", "SELECT 1") + build.SYNC)
    (server,) = pool.servers
    server.data_received(build.message(b"1") + build.ready_for_query(b"I"))
    assert types(transport.take()) == "1Z" and idle_reason(client) == ""
    client.data_received(build.bind("", "s1", [])[:4])
    assert idle_reason(client) == "busy"
