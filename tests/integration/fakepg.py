"""A hostile PostgreSQL for tests: each database name is a script of how it misbehaves.

Only for what a real PostgreSQL cannot be made to do (send garbage, forge SCRAM, stall in
the middle of a result). It runs its own event loop in a daemon thread, like FaultProxy,
so synchronous tests can use it. Scripts (the database name in the startup packet):

- ``error_no_sqlstate``: answers the startup with an ErrorResponse that has only a message.
- ``error_empty``: answers the startup with an ErrorResponse with no fields at all.
- ``scram_bad_nonce``: a SCRAM server-first whose nonce does not extend the client's.
- ``scram_huge_iterations``: a SCRAM server-first asking for 2**31 - 1 iterations.
- ``garbage_login``: random bytes instead of an authentication request.
- everything else logs in (trust) and then, per simple Query:
  - ``stall``: a RowDescription and two DataRows, then nothing, ever;
  - ``garbage_result``: a RowDescription, then bytes with an impossible length word;
  - ``error_no_sqlstate_result``: an ErrorResponse with only a message, then ReadyForQuery;
  - ``cut_mid_row``: a RowDescription and the first 200 bytes of a DataRow, then it hangs up;
  - any other: an ordinary one-row result.
A CancelRequest is accepted and ignored (the stalled query goes on).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import threading

from pgtarn.proto import build
from pgtarn.proto.messages import CANCEL_REQUEST, SSL_REQUEST, parse_startup

HOST = "127.0.0.1"


class FakePostgres:
    """Listens on 127.0.0.1:port; count of connections per script in ``seen``."""

    def __init__(self) -> None:
        self.port = 0
        self.seen: dict[str, int] = {}
        self.cancels = 0
        #: What an SSLRequest is answered with (b"N": no TLS, as a server with ssl = off).
        self.tls_answer = b"N"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._writers: set[asyncio.StreamWriter] = set()

    def __enter__(self) -> FakePostgres:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake PostgreSQL did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def connstr(self, script: str) -> str:
        return f"host={HOST} port={self.port} dbname={script}"

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        for writer in list(self._writers):
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._script(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _script(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        length = struct.unpack("!I", await reader.readexactly(4))[0]
        packet = parse_startup(await reader.readexactly(length - 4))
        if packet.code == SSL_REQUEST:
            writer.write(self.tls_answer)
            if self.tls_answer != b"N":
                await writer.drain()
                with contextlib.suppress(asyncio.IncompleteReadError, OSError):
                    await reader.read(65536)
                return
            length = struct.unpack("!I", await reader.readexactly(4))[0]
            packet = parse_startup(await reader.readexactly(length - 4))
        if packet.code == CANCEL_REQUEST:
            self.cancels += 1
            return
        script = packet.params.get("database", "")
        self.seen[script] = self.seen.get(script, 0) + 1
        if script == "error_no_sqlstate":
            writer.write(build.message(b"E", b"SFATAL\x00Mno code here\x00\x00"))
        elif script == "error_empty":
            writer.write(build.message(b"E", b"\x00"))
        elif script in ("scram_bad_nonce", "scram_huge_iterations"):
            writer.write(build.auth_sasl(["SCRAM-SHA-256"]))
            _, body = await read_message(reader)
            client_nonce = body.rsplit(b"r=", 1)[1].split(b",")[0]
            salt = base64.b64encode(b"0123456789abcdef")
            if script == "scram_bad_nonce":
                first = b"r=someoneelse" + client_nonce[::-1] + b",s=" + salt + b",i=4096"
            else:
                first = b"r=" + client_nonce + b"xyz,s=" + salt + b",i=2147483647"
            writer.write(build.authentication(11, first))
        elif script == "garbage_login":
            writer.write(b"\x13\x37" * 50 + b"R\xff\xff\xff\xff")
        else:
            await self._session(reader, writer, script)
            return
        await writer.drain()
        with contextlib.suppress(asyncio.IncompleteReadError, OSError):
            await reader.read(65536)  # whatever pgtarn does next; then hang up

    async def _session(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, script: str
    ) -> None:
        writer.write(
            build.authentication(0)
            + build.parameter_status("server_version", "15.99")
            + build.parameter_status("client_encoding", "UTF8")
            + build.parameter_status("standard_conforming_strings", "on")
            + build.backend_key_data(4242, 7)
            + build.ready_for_query()
        )
        while True:
            msg_type, _ = await read_message(reader)
            if msg_type == ord("X"):
                return
            if msg_type != ord("Q"):
                continue
            head = build.row_description([("v", 25)])
            if script == "stall":
                writer.write(head + build.data_row(["1"]) + build.data_row(["2"]))
                await writer.drain()
                await asyncio.Event().wait()  # never answers again
            elif script == "cut_mid_row":
                writer.write(head + build.data_row(["x" * 1000])[:200])
                await writer.drain()
                return
            elif script == "garbage_result":
                writer.write(head + b"D\x00\x00\x00\x01garbage")
            elif script == "error_no_sqlstate_result":
                writer.write(
                    build.message(b"E", b"SERROR\x00Mno code here\x00\x00")
                    + build.ready_for_query()
                )
            else:
                writer.write(
                    head
                    + build.data_row(["ok"])
                    + build.message(b"C", b"SELECT 1\x00")
                    + build.ready_for_query()
                )
            await writer.drain()


async def read_message(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    header = await reader.readexactly(5)
    length = struct.unpack("!I", header[1:])[0]
    return header[0], await reader.readexactly(length - 4)
