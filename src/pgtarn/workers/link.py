"""A worker's end of its control channel: requests to the supervisor and to other workers.

Messages are routed by their ``kind``. Parts of the worker register what they answer with
:meth:`WorkerLink.handle`; a handler returns the reply (for a message that carried an
``id``) or None.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from .channel import Channel, ChannelClosed
from .wire import Message

log = logging.getLogger("pgtarn")

#: How long a worker waits for the other workers' answers (SHOW, a cancel).
GATHER_TIMEOUT = 5.0

#: A handler's reply, or an awaitable one (sent when it is done: PAUSE waits for servers).
MessageHandler = Callable[[Message, list[int]], Message | Awaitable[Message] | None]


class WorkerLink:
    """This worker's index, the worker count, and the channel to the supervisor."""

    def __init__(
        self, index: int, count: int, sock: socket.socket, on_supervisor_gone: Callable[[], None]
    ) -> None:
        self.index = index
        self.count = count
        self.handlers: dict[str, MessageHandler] = {}
        self.on_supervisor_gone = on_supervisor_gone
        self.channel = Channel(sock, self._message, self._closed, name="supervisor channel")
        self.replying: set[asyncio.Task[None]] = set()

    def handle(self, kind: str, handler: MessageHandler) -> None:
        self.handlers[kind] = handler

    def send(self, message: Message, fds: list[int] | tuple[int, ...] = ()) -> None:
        """To the supervisor (dropped when it is gone: the worker is stopping then)."""
        if not self.channel.closed:
            self.channel.send(message, fds)

    async def request(
        self, message: Message, timeout: float = GATHER_TIMEOUT
    ) -> tuple[Message, list[int]]:
        return await self.channel.request(message, timeout)

    def broadcast(self, message: Message, others: bool = True) -> None:
        """message to every worker (but this one, with others)."""
        self.send({"kind": "broadcast", "others": others, "message": message})

    def to_worker(self, index: int, message: Message) -> None:
        self.send({"kind": "to_worker", "worker": index, "message": message})

    async def ask_worker(self, index: int, message: Message, timeout: float) -> Message | None:
        """message to worker index, and its reply when its handler's answer is ready (None:
        no answer in timeout, or no supervisor)."""
        try:
            reply, _fds = await self.request(
                {"kind": "ask_worker", "worker": index, "message": message, "timeout": timeout},
                timeout + 1,
            )
        except (ChannelClosed, TimeoutError):
            return None
        answer = reply.get("reply")
        return answer if isinstance(answer, dict) else None

    async def gather(self, message: Message, timeout: float = GATHER_TIMEOUT) -> list[Message]:
        """Ask every worker (this one too) message; their replies, in worker order (a
        worker that did not answer in time is left out)."""
        reply, _fds = await self.request(
            {"kind": "gather", "message": message, "timeout": timeout}, timeout + 1
        )
        results: list[Any] = reply.get("results", [])
        return [r for r in results if isinstance(r, dict)]

    def _message(self, channel: Channel, message: Message, fds: list[int]) -> None:
        kind = message.get("kind", "")
        handler = self.handlers.get(kind)
        if handler is None:
            log.warning("supervisor channel: no handler for %r", kind)
            reply: Message | None = {"error": f"unknown message {kind!r}"}
        else:
            answer = handler(message, fds)
            if answer is not None and not isinstance(answer, dict):
                task = asyncio.get_running_loop().create_task(self._reply_later(message, answer))
                self.replying.add(task)
                task.add_done_callback(self.replying.discard)
                return
            reply = answer
        if "id" in message:
            channel.reply(message, reply if reply is not None else {})

    async def _reply_later(self, message: Message, answer: Awaitable[Message]) -> None:
        reply = await answer
        if "id" in message and not self.channel.closed:
            self.channel.reply(message, reply)

    def _closed(self, channel: Channel) -> None:
        self.on_supervisor_gone()
