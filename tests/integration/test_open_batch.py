"""An extended-protocol batch that goes on past a Sync (pg8000 sends Describe, Sync, Bind and
then, after the reply, Execute, Sync) keeps its server: the ReadyForQuery of that Sync must not
hand the server, with the client's portal on it, to another client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pgtarn.proto import build

from .conftest import PgtarnFactory
from .rawpg import AsyncRawClient, _data_row

pytestmark = pytest.mark.integration


async def _replies_until_ready(client: AsyncRawClient) -> list[tuple[int, bytes]]:
    out = []
    while True:
        msg_type, body = await client.read_message()
        out.append((msg_type, body))
        if msg_type == 0x5A:
            return out


def test_a_batch_past_its_sync_keeps_its_server(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1, "max_prepared_statements": 0})

    async def scenario() -> tuple[list[Any], list[Any]]:
        mine = await AsyncRawClient.connect(proc.host, proc.port, "app", "app_pass", "app")
        other = await AsyncRawClient.connect(proc.host, proc.port, "app", "app_pass", "app")
        try:
            # Parse and Sync, then a Bind of it right behind: the portal waits for Execute
            mine.writer.write(
                build.parse("", "select 'mine'") + build.SYNC + build.bind("", "", [])
            )
            await _replies_until_ready(mine)
            # another client, on a pool of one server, asks now
            theirs = asyncio.ensure_future(other.query("select 'theirs'"))
            await asyncio.sleep(0.3)
            mine.writer.write(build.execute() + build.SYNC)
            replies = await _replies_until_ready(mine)
            rows = [_data_row(body) for msg_type, body in replies if msg_type == 0x44]
            errors = [body for msg_type, body in replies if msg_type == 0x45]
            return rows + errors, await asyncio.wait_for(theirs, 10)
        finally:
            await mine.close()
            await other.close()

    mine, theirs = asyncio.run(scenario())
    assert mine == [["mine"]]
    assert theirs == [["theirs"]]
