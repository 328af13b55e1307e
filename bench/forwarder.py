"""The floor of a pooler on Python and uvloop: a byte forwarder with no parsing and no pool.

Each client connection gets its own connection to PostgreSQL, and bytes are passed on as they
come, both ways, by two asyncio.Protocols on uvloop. Whatever CPU a transaction costs here is
what the event loop, the system calls and one Python callback per read cost: no pooler built
on them can go below it. bench/cpu.py runs it next to PgBouncer and pgtarn.

    python3 bench/forwarder.py pooler.ini   # listens and forwards as the ini says
"""

from __future__ import annotations

import asyncio
import configparser
import signal
import sys
from typing import cast

import uvloop


class ServerSide(asyncio.Protocol):
    """PostgreSQL's bytes, written to the client as they come."""

    def __init__(self, client: ClientSide) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()


class ClientSide(asyncio.Protocol):
    """A client's bytes, held until its PostgreSQL connection is made, then written to it."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.server: asyncio.Transport | None = None
        self.early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        asyncio.get_running_loop().create_task(self.connect())

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        server, _ = await loop.create_connection(lambda: ServerSide(self), self.host, self.port)
        self.server = server
        server.write(b"".join(self.early))

    def data_received(self, data: bytes) -> None:
        if self.server is None:
            self.early.append(data)
        else:
            self.server.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.server is not None:
            self.server.close()


async def serve(ini: str) -> None:
    config = configparser.ConfigParser()
    config.read(ini)
    listen = config["pgbouncer"]
    entry = dict(part.split("=", 1) for part in next(iter(config["databases"].values())).split())
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: ClientSide(entry["host"], int(entry["port"])),
        listen["listen_addr"],
        int(listen["listen_port"]),
    )
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()


if __name__ == "__main__":
    uvloop.run(serve(sys.argv[1]))
