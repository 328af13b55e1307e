"""One end of a control socket between processes: messages with descriptors, and requests.

The socket is a connected AF_UNIX stream (a socketpair between the supervisor and a worker,
or the takeover socket of a rolling restart). Descriptors ride on the first byte of their
message (SCM_RIGHTS); asyncio's transports cannot carry them, so the channel reads and writes
the non-blocking socket itself from the event loop's reader and writer callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
from collections import deque
from collections.abc import Callable

from .wire import Message, MessageReader, WireError, encode

log = logging.getLogger("pgtarn")

#: Descriptors one read accepts (SCM_MAX_FD, the kernel's limit per message).
MAX_FDS_PER_READ = 253
#: Bytes one read takes from the socket.
READ_SIZE = 256 * 1024
#: Received descriptors are close-on-exec, as every descriptor pgtarn opens.
_RECV_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)

Handler = Callable[["Channel", Message, list[int]], None]


class ChannelClosed(Exception):
    """The other process is gone (or the stream broke) before a reply came."""


class Channel:
    """Messages to and from the process at the other end of sock."""

    def __init__(
        self,
        sock: socket.socket,
        on_message: Handler,
        on_closed: Callable[[Channel], None],
        name: str = "control",
    ) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.name = name
        self.on_message = on_message
        self.on_closed = on_closed
        self.reader = MessageReader()
        self.out: deque[tuple[memoryview, list[int]]] = deque()
        self.pending: dict[int, asyncio.Future[tuple[Message, list[int]]]] = {}
        self.ids = itertools.count(1)
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self.loop.add_reader(sock.fileno(), self._readable)
        self.writing = False

    # --- out ------------------------------------------------------------------------------

    def send(self, message: Message, fds: list[int] | tuple[int, ...] = ()) -> None:
        """Queue message (and the descriptors to pass with it; the caller keeps its own)."""
        if self.closed:
            raise ChannelClosed(f"{self.name}: channel closed")
        if fds:
            message["fds"] = len(fds)
        self.out.append((memoryview(encode(message)), list(fds)))
        if not self.writing:
            self._flush()

    def reply(
        self, request: Message, message: Message, fds: list[int] | tuple[int, ...] = ()
    ) -> None:
        """Answer request (a message that carried an ``id``)."""
        message["re"] = request["id"]
        self.send(message, fds)

    async def request(
        self, message: Message, timeout: float | None = None, fds: list[int] | tuple[int, ...] = ()
    ) -> tuple[Message, list[int]]:
        """Send message and wait for its reply (ChannelClosed if the other end goes first)."""
        ident = next(self.ids)
        message["id"] = ident
        future: asyncio.Future[tuple[Message, list[int]]] = self.loop.create_future()
        self.pending[ident] = future
        try:
            self.send(message, fds)
            return await asyncio.wait_for(future, timeout)
        finally:
            self.pending.pop(ident, None)

    def _flush(self) -> None:
        sock, out = self.sock, self.out
        while out:
            data, fds = out[0]
            try:
                if fds:
                    sent = socket.send_fds(sock, [data], fds)
                    fds.clear()  # they went with the first byte
                else:
                    sent = sock.send(data)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self.close(f"write failed: {exc}")
                return
            if sent < len(data):
                out[0] = (data[sent:], fds)
                break
            out.popleft()
        want = bool(out)
        if want != self.writing:
            self.writing = want
            if want:
                self.loop.add_writer(sock.fileno(), self._flush)
            else:
                self.loop.remove_writer(sock.fileno())

    # --- in -------------------------------------------------------------------------------

    def _readable(self) -> None:
        # Until the socket holds nothing: when the other process exits with bytes of ours
        # unread, right behind its last message, epoll reports an error, and uvloop calls
        # this reader once more and stops watching the socket; the reset behind the message
        # must be read in that same call (the channel is far from the hot path).
        while not self.closed and self._read_once():
            pass

    def _read_once(self) -> bool:
        """One read and its messages; False when the socket held nothing or the channel
        closed."""
        try:
            data, fds, _flags, _addr = socket.recv_fds(
                self.sock, READ_SIZE, MAX_FDS_PER_READ, _RECV_FLAGS
            )
        except (BlockingIOError, InterruptedError):
            return False
        except ConnectionResetError:  # the other process exited with bytes unread: its end
            self.close("")
            return False
        except OSError as exc:
            self.close(f"read failed: {exc}")
            return False
        if not data:
            for fd in fds:
                os.close(fd)
            self.close("")
            return False
        try:
            messages = self.reader.feed(data, fds)
        except WireError as exc:
            self.close(str(exc))
            return False
        for message, message_fds in messages:
            answered = message.get("re")
            if answered is not None:
                future = self.pending.pop(answered, None)
                if future is not None and not future.done():
                    future.set_result((message, message_fds))
                else:
                    _close_all(message_fds)
                continue
            try:
                self.on_message(self, message, message_fds)
            except Exception:  # one bad message must not end the channel
                log.exception("%s: handling %s failed", self.name, message.get("kind"))
            if self.closed:
                return False
        return True

    # --- end ------------------------------------------------------------------------------

    def close(self, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        if reason:
            log.warning("%s: %s", self.name, reason)
        fileno = self.sock.fileno()
        if fileno >= 0:
            self.loop.remove_reader(fileno)
            if self.writing:
                self.loop.remove_writer(fileno)
        self.sock.close()
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ChannelClosed(f"{self.name}: channel closed"))
        self.pending.clear()
        for _data, fds in self.out:
            fds.clear()  # the caller's descriptors; not ours to close
        self.out.clear()
        self.reader.close_pending(os.close)
        self.on_closed(self)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
