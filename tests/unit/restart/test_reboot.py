"""Tests for pgtarn.restart.reboot: which clients a takeover may hand over now."""

from __future__ import annotations

import asyncio
import socket

from pgtarn.proto import build
from pgtarn.restart.handover import HandedClient, HandoverError
from pgtarn.restart.reboot import adopt, idle_reason
from pgtarn.runtime import Runtime

from ..client.pair import Pool, sent, types
from ..test_runtime import keyed


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


def _adopted(runtime: Runtime, key: tuple[int, int]) -> str:
    """Adopt a handed-over client with key on a socket pair (then close it): "" or the
    refusal."""
    state = HandedClient(user="u", database="app", cancel_key=key, params={})

    async def adopt_and_close(sock: socket.socket) -> str:
        try:
            await adopt(runtime, state, sock)
        except HandoverError as refusal:
            return str(refusal)
        client = runtime.client_by_key(key)
        assert client is not None and client.transport is not None
        client.transport.close()
        await asyncio.sleep(0)
        return ""

    near, far = socket.socketpair()
    try:
        return asyncio.run(adopt_and_close(near))
    finally:
        near.close()
        far.close()


def test_a_handed_client_is_refused_only_when_its_whole_key_is_in_use() -> None:
    """Clients this process accepted, and those of another old worker (another pid byte),
    may have the same secret: that alone keeps no client on the old process."""
    runtime = Pool().runtime
    here = Pool().runtime.new_key()  # (any key: one accepted here)
    assert runtime.add_client(here, keyed(here))
    assert _adopted(runtime, (here[0] ^ 0x2, here[1])) == ""
    assert "in use" in _adopted(runtime, here)
