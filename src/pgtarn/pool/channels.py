"""ChannelBoard: which clients of a pool listen to which channel, and what the pool's
listener connection must LISTEN to for them.

Theory of operation. In transaction and statement mode a client's LISTEN does not run on a
pooled server (the next client of that server would get its notifications). pgtarn answers
it, and the pool's board records the client under the channel. One listener connection per
pool (the ``link``, opened through ``open`` when a first channel is wanted) LISTENs to the
union of the channels, and UNLISTENs one when its last client leaves it. Each
NotificationResponse it receives is handed to every client of that channel.

A client that just began to listen on a channel the link has not confirmed yet waits for the
confirmation (``waiters``) before it gets its ReadyForQuery, so that a NOTIFY committed after
the client saw its LISTEN succeed is never missed. The link reports what PostgreSQL
confirmed; when it is lost, every client is warned (notifications sent meanwhile are gone)
and the link LISTENs to every channel again once it is back.

The board never touches sockets: the link and the clients are the Protocols below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

#: The warning clients listening get when the listener connection was lost.
LOST_MESSAGE = (
    "the listening connection to the server was lost and is being re-established:"
    " notifications may have been lost"
)
NOT_OPENED_MESSAGE = (
    "the listening connection to the server could not be opened yet ({}):"
    " notifications may be lost until it is"
)


class Subscriber(Protocol):
    """What the board needs of a listening client."""

    def notify(self, message: bytes) -> None:
        """A NotificationResponse (whole message) for a channel the client listens to."""

    def listener_confirmed(self, warning: str) -> None:
        """Every channel the client listens to is LISTENed on the link now (warning "") or
        will not be soon (warning: why)."""

    def listener_lost(self) -> None:
        """The link was lost while the client listened: warn it."""

    def release_notifications(self) -> None:
        """Delivery may resume (RESUME): send what was held."""


class ListenerLink(Protocol):
    """The listener connection, as the board drives it."""

    def sync(self) -> None:
        """The wanted channels changed: LISTEN/UNLISTEN what differs (when connected)."""

    def tick(self, now: float) -> None:
        """The janitor's visit: reconnect when due."""

    def hold(self, held: bool) -> None:
        """Stop reading notifications (PostgreSQL keeps them queued), or read again."""

    def restart(self, reason: str) -> None:
        """Reconnect now (a RELOAD changed the connection settings, RECONNECT)."""

    def close(self, reason: str) -> None:
        """Close for good (no channel is wanted any more, shutdown)."""


class ChannelBoard:
    """The channels of one pool's clients (see the module docstring)."""

    __slots__ = (
        "delivered",
        "dropped",
        "empty_since",
        "held",
        "link",
        "listened",
        "lost",
        "open",
        "queued",
        "received",
        "reconnects",
        "subscribers",
        "waiters",
    )

    def __init__(self, open_link: Callable[[ChannelBoard], ListenerLink] | None) -> None:
        self.open = open_link
        self.link: ListenerLink | None = None
        #: channel -> the clients listening to it (a channel with none is not wanted).
        self.subscribers: dict[str, set[Subscriber]] = {}
        #: Channels PostgreSQL confirmed LISTENing to on the link's current connection.
        self.listened: set[str] = set()
        #: Clients waiting for their channels to be confirmed -> since when (monotonic).
        self.waiters: dict[Subscriber, float] = {}
        #: Since when no channel is wanted (monotonic; 0: some are).
        self.empty_since = 0.0
        # statistics: notifications from PostgreSQL, handed to clients, dropped with a
        # client closed at listen_queue_size, held in clients' queues now; link losses
        self.received = 0
        self.delivered = 0
        self.dropped = 0
        self.queued = 0
        self.reconnects = 0
        #: Set while the link is lost, so clients are warned only once per loss.
        self.lost = False
        #: PAUSE or SUSPEND: the link does not read notifications.
        self.held = False

    # --- clients ------------------------------------------------------------------------------

    def update(
        self, client: Subscriber, old: frozenset[str], new: frozenset[str], now: float
    ) -> bool:
        """client now listens to new instead of old; True when all of new is confirmed."""
        subscribers = self.subscribers
        changed = False
        for channel in old - new:
            clients = subscribers.get(channel)
            if clients is not None:
                clients.discard(client)
                if not clients:
                    del subscribers[channel]
                    changed = True
        for channel in new - old:
            clients = subscribers.get(channel)
            if clients is None:
                subscribers[channel] = {client}
                changed = True
            else:
                clients.add(client)
        if not new:
            self.waiters.pop(client, None)
        if changed:
            self.empty_since = now if not subscribers else 0.0
            self._sync()
        if new <= self.listened:
            self.waiters.pop(client, None)
            return True
        self.waiters[client] = now
        return False

    def wanted(self) -> set[str]:
        """The channels some client listens to."""
        return set(self.subscribers)

    def _sync(self) -> None:
        if self.link is not None:
            self.link.sync()
        elif self.subscribers and self.open is not None:
            self.link = self.open(self)
            self.link.sync()  # counted from here on: it may connect

    # --- the link's reports -----------------------------------------------------------------

    def confirmed(self, channel: str, listening: bool) -> None:
        """PostgreSQL answered a LISTEN (listening) or UNLISTEN of channel on the link."""
        if listening:
            self.listened.add(channel)
        else:
            self.listened.discard(channel)
        if listening and self.waiters:
            self._wake(lambda client_channels: client_channels <= self.listened, "")

    def refused(self, channel: str, error: str) -> None:
        """PostgreSQL refused to LISTEN to channel: its waiting clients are told so."""
        self.listened.discard(channel)
        if self.waiters:
            self._wake(
                lambda client_channels: channel in client_channels,
                f"the listening connection could not LISTEN to this channel: {error}",
            )

    def _wake(self, ready: Callable[[set[str]], bool], warning: str) -> None:
        """Tell the waiting clients whose channels are ready so."""
        channels_of: dict[Subscriber, set[str]] = {client: set() for client in self.waiters}
        for channel, clients in self.subscribers.items():
            for client in clients:
                if client in channels_of:
                    channels_of[client].add(channel)
        for client, channels in channels_of.items():
            if ready(channels):
                del self.waiters[client]
                client.listener_confirmed(warning)

    def connected(self) -> None:
        """The link logged in (again): it LISTENs to every wanted channel next."""
        self.lost = False
        self.listened.clear()

    def connection_lost(self) -> None:
        """The link's connection is gone; it reconnects. Listening clients are warned."""
        self.listened.clear()
        if self.lost:
            return
        self.lost = True
        self.reconnects += 1
        warned: set[Subscriber] = set()
        for clients in self.subscribers.values():
            for client in clients:
                if client not in warned:  # (a waiter too: its older channels were listened)
                    warned.add(client)
                    client.listener_lost()

    def notification(self, channel: str, message: bytes) -> None:
        """A NotificationResponse came for channel: to every client listening to it."""
        self.received += 1
        clients = self.subscribers.get(channel)
        if clients:
            for client in list(clients):
                client.notify(message)

    # --- the pool's ---------------------------------------------------------------------------

    def tick(self, now: float, wait_limit: float, idle_timeout: float) -> None:
        """Waiting clients get a warning after wait_limit seconds; an unused link is closed
        after idle_timeout (0: kept)."""
        link = self.link
        if link is not None:
            link.tick(now)
            if (
                self.empty_since
                and 0 < idle_timeout < now - self.empty_since
                and not self.subscribers
            ):
                self.close("no client listens any more")
        if self.waiters:
            since = now - wait_limit
            late = [client for client, began in self.waiters.items() if began <= since]
            warning = NOT_OPENED_MESSAGE.format(f"not confirmed within {wait_limit:g} s")
            for client in late:
                del self.waiters[client]
                client.listener_confirmed(warning)

    def hold(self, held: bool) -> None:
        """PAUSE and SUSPEND hold delivery: the link stops reading, so notifications wait in
        PostgreSQL's queue rather than in clients' bounded ones; RESUME reads them again."""
        self.held = held
        if self.link is not None:
            self.link.hold(held)

    def resume(self) -> None:
        """Delivery may resume: clients send what they held."""
        self.hold(False)
        clients: set[Subscriber] = set()
        for subscribers in self.subscribers.values():
            clients |= subscribers
        for client in clients:
            client.release_notifications()

    def restart(self, reason: str) -> None:
        """Move the link (new connection settings, RECONNECT)."""
        if self.link is not None:
            self.link.restart(reason)

    def close(self, reason: str) -> None:
        link, self.link = self.link, None
        self.listened.clear()
        if link is not None:
            link.close(reason)

    @property
    def open_links(self) -> int:
        """Servers this board's link counts for against max_db/user_connections."""
        return 1 if self.link is not None else 0


class SchemaWatch:
    """pgtarn's own subscriber of a pool's board: the channel an event trigger notifies at
    each schema change made anywhere (schema_change_channel). Each notification calls
    changed; so does a lost link (notifications may have been missed meanwhile)."""

    __slots__ = ("changed", "channel")

    def __init__(self, channel: str, changed: Callable[[], None]) -> None:
        self.channel = channel
        self.changed = changed

    def notify(self, message: bytes) -> None:
        self.changed()

    def listener_confirmed(self, warning: str) -> None:
        pass

    def listener_lost(self) -> None:
        self.changed()

    def release_notifications(self) -> None:
        pass
