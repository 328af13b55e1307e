"""A worker's side of the shared limits: server slots from the supervisor, client admission.

The supervisor keeps the books (ledger.py). This worker holds a number of server slots per
pool and opens a server only while it has more slots than servers (the pools' gate,
pool/pool.py's ServerGate); otherwise it asks for one and opens the server when the grant
comes. A slot goes back when a server is gone and no client of the pool waits for it. Asked
to give one back for another worker's clients, it closes an idle server of the pool, or the
next one released.

Clients: this worker holds client places for max_client_conn, its clients' and spare ones
(a lease, taken with each place it asks for). A login takes a spare place without a message;
with none left, or when max_db_client_connections or max_user_client_connections applies to
the client, it asks the supervisor (a round trip), which may first ask the other workers for
their spare places. Places stay when clients leave, up to LEASE_KEEP spare ones.

Messages to the supervisor: ``limits_ask`` (a slot, with the limits), ``limits_release``,
``limits_nudge`` (clients still wait: look again for a slot to take back), ``limits_admit``
(a request: may one more client log in?), ``limits_left`` (a client counted by database and
user is gone), ``limits_returned`` (spare client places given back). From it:
``limits_grant``, ``limits_reclaim`` and ``limits_spare`` (give back your spare places).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from ..pool.pool import Pool, PooledServer, open_granted
from ..pool.registry import Registry
from .channel import ChannelClosed
from .link import WorkerLink
from .wire import Message

log = logging.getLogger("pgtarn")

#: How long a login waits for the supervisor's answer before it is refused.
ADMIT_TIMEOUT = 10.0
#: Spare client places a worker asks for with each place it needs, and the most it keeps as
#: its clients leave: enough that a worker's logins rarely ask the supervisor, few enough
#: that a limit near its end takes back little (the supervisor asks for spare places anyway
#: before it refuses a client).
LEASE = 32
LEASE_KEEP = 64
#: How often clients still waiting for a slot make the supervisor look again for one to take
#: back (the first look is at once, when the request is queued).
NUDGE_INTERVAL = 0.5


class SharedLimits:
    """This worker's server slots and admitted clients (see the module docstring)."""

    def __init__(self, link: WorkerLink, registry: Registry[Any]) -> None:
        self.link = link
        self.registry = registry
        self.index = link.index
        self.count = link.count
        #: (database, user) -> slots held, and slots asked for and not granted yet.
        self.held: Counter[tuple[str, str]] = Counter()
        self.asked: Counter[tuple[str, str]] = Counter()
        #: Servers closing to give their slots back: the slot goes when the server is gone,
        #: so that PostgreSQL does not see the next one open while this one still runs.
        self.leaving: Counter[tuple[str, str]] = Counter()
        self.next_nudge = 0.0
        #: id(client) -> (database, user, admin console, counted by name in the supervisor)
        #: of each admitted client.
        self.clients: dict[int, tuple[str, str, bool, bool]] = {}
        #: Client places held (max_client_conn), and those taken by clients (admitted, or
        #: being admitted in a place held already).
        self.places = 0
        self.used = 0
        link.handle("limits_grant", self._granted)
        link.handle("limits_reclaim", self._reclaimed)
        link.handle("limits_spare", self._spare_asked)

    # --- the pools' gate --------------------------------------------------------------------

    def may_open(self, pool: Pool[Any]) -> bool:
        key = (pool.database, pool.user)
        held = self.held[key]
        if pool.server_count + self.leaving[key] < held:
            return True
        asked = self.asked[key]
        # the reserve when the janitor would use it (the oldest client waited long enough)
        limit = pool.pool_size
        if pool.reserve_pool_size and pool.max_wait(pool.clock()) >= pool.reserve_pool_timeout:
            limit += pool.reserve_pool_size
        # one request per waiting client that no server logging in or being reset will serve
        coming = len(pool.login) + len(pool.tested)
        if held + asked < limit and asked < max(1, len(pool.waiting) - coming):
            config = self.registry.config
            db = self.registry.databases.get(pool.database)
            self.asked[key] += 1
            self.link.send(
                {
                    "kind": "limits_ask",
                    "database": pool.database,
                    "user": pool.user,
                    "pool_limit": limit,
                    "max_db": config.max_db_connections_for(db) if db is not None else 0,
                    "max_user": config.max_user_connections_for(pool.user),
                }
            )
        return False

    def server_gone(self, pool: Pool[Any]) -> None:
        key = (pool.database, pool.user)
        if self.leaving[key] > 0:
            self.leaving[key] -= 1
            self._release(*key)
        self._release_unused(*key)

    def gives_back(self, pool: Pool[Any], server: PooledServer) -> bool:
        # pool.owed: servers to close as they are released, their slots going to other
        # workers (the pool calls this only while it owes one)
        if pool.owed <= 0:
            return False
        pool.owed -= 1
        self.leaving[(pool.database, pool.user)] += 1
        server.close("given back for another worker's clients", wait=True)
        return True

    def share(self, total: int) -> int:
        """min_pool_size over the workers: worker i opens total // N, one more for the first
        total % N, so that they sum to total."""
        return total // self.count + (1 if self.index < total % self.count else 0)

    def tick(self) -> None:
        for database, user in list(self.held):
            self._release_unused(database, user)
        now = time.monotonic()
        if now < self.next_nudge:
            return
        self.next_nudge = now + NUDGE_INTERVAL
        for key, asked in self.asked.items():
            pool = self.registry.pools.get(key)
            if asked and pool is not None and (pool.waiting or pool.welcome_waiters):
                # still waiting: the supervisor looks again for a slot to take back for them
                self.link.send({"kind": "limits_nudge", "database": key[0], "user": key[1]})

    # --- messages from the supervisor -------------------------------------------------------

    def _granted(self, message: Message, fds: list[int]) -> None:
        key = (str(message.get("database")), str(message.get("user")))
        self.held[key] += 1
        if self.asked[key] > 0:
            self.asked[key] -= 1
        pool = self.registry.pools.get(key)
        if pool is not None:
            # first come first served chose this worker: a give-back asked before is moot
            pool.owed = 0
            open_granted(pool, pool.server_count + self.leaving[key] < self.held[key])
        self._release_unused(*key)

    def _reclaimed(self, message: Message, fds: list[int]) -> None:
        key = (str(message.get("database")), str(message.get("user")))
        pool = self.registry.pools.get(key)
        if pool is None or pool.owed + self.leaving[key] >= self.held[key]:
            return
        if pool.idle and not pool.waiting:
            self.leaving[key] += 1
            pool.idle.pop(0).close("given back for another worker's clients", wait=True)
        elif not message.get("idle_only"):
            pool.owed += 1  # the next server released to the pool closes

    # --- slots ------------------------------------------------------------------------------

    def _release_unused(self, database: str, user: str) -> None:
        """Slots beyond the pool's servers go back, but one a waiting client needs."""
        key = (database, user)
        pool = self.registry.pools.get(key)
        keep = self.leaving[key]
        if pool is not None:
            keep += pool.server_count
            if (pool.waiting or pool.welcome_waiters) and not pool.paused:
                keep += 1
            # a give-back asked for a server that closed meanwhile: its slot went back here
            pool.owed = min(pool.owed, pool.server_count)
        while self.held[key] > keep:
            self._release(database, user)

    def _release(self, database: str, user: str) -> None:
        key = (database, user)
        self.held[key] -= 1
        if self.held[key] <= 0:
            del self.held[key]
        pool = self.registry.pools.get(key)
        if pool is not None and pool.owed > self.held[key]:
            pool.owed = self.held[key]
        self.link.send({"kind": "limits_release", "database": database, "user": user})

    # --- clients ----------------------------------------------------------------------------

    def take(
        self, client: object, database: str, user: str, admin: bool, limits: list[int]
    ) -> bool:
        """A login that takes a spare place of this worker's, without asking the supervisor:
        True (admitted, counted until :meth:`left`), or False (call :meth:`admit`). limits as
        for admit."""
        if self.used >= self.places or limits[1] or limits[2]:
            return False
        self.used += 1
        self.clients[id(client)] = (database, user, admin, False)
        return True

    async def admit(
        self, client: object, database: str, user: str, admin: bool, limits: list[int]
    ) -> str | None:
        """Ask the supervisor whether one more client may log in: None (yes, counted until
        :meth:`left`), or the limit that refuses it. limits: max_client_conn,
        max_db_client_connections, max_user_client_connections as they apply to this client
        (0: none), then this worker's own counts for them, this client included."""
        need = 0 if self.used < self.places else 1
        self.used += 1 - need  # a spare place is this client's while the answer comes
        try:
            reply, _fds = await self.link.request(
                {
                    "kind": "limits_admit",
                    "database": database,
                    "user": user,
                    "admin": admin,
                    "limits": limits,
                    "need": need,
                    "lease": LEASE,
                },
                ADMIT_TIMEOUT,
            )
        except (ChannelClosed, TimeoutError):
            self.used -= 1 - need
            return "supervisor not answering"
        granted = reply.get("places")
        self.places += granted if isinstance(granted, int) and granted > 0 else 0
        refused = reply.get("refused")
        if isinstance(refused, str):
            self.used -= 1 - need
            if refused == "max_client_conn" and self.take(client, database, user, admin, limits):
                return None  # a client of this worker left meanwhile: its place is free
            self._return_spare()
            return refused
        self.used += need
        self.clients[id(client)] = (database, user, admin, bool(limits[1] or limits[2]))
        return None

    def admitted(self, client: object) -> bool:
        return id(client) in self.clients

    def left(self, client: object) -> None:
        """A client is gone (admitted or not)."""
        entry = self.clients.pop(id(client), None)
        if entry is None:
            return
        self.used -= 1
        database, user, admin, counted = entry
        if counted:
            self.link.send(
                {"kind": "limits_left", "database": database, "user": user, "admin": admin}
            )
        self._return_spare()

    def _return_spare(self) -> None:
        """Spare places beyond LEASE_KEEP go back, down to LEASE."""
        spare = self.places - self.used
        if spare > LEASE_KEEP:
            self.places -= spare - LEASE
            self.link.send({"kind": "limits_returned", "count": spare - LEASE})

    def _spare_asked(self, message: Message, fds: list[int]) -> None:
        """The supervisor would refuse a client of another worker: every spare place goes
        back (the answer is due even when there is none)."""
        spare = self.places - self.used
        self.places = self.used
        self.link.send({"kind": "limits_returned", "count": spare, "asked": True})
