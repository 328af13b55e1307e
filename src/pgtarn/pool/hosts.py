"""A split database's servers as its health checks see them, and where a read may go (sans-IO).

Theory of operation. A database entry with ``read_write_split`` on has one HostSet (shared by
every entry naming the same servers, such as its ``_ro`` alias). The health checker
(server/health.py) reports each check of each host here: reachable or not,
``pg_is_in_recovery()``, an LSN (the primary's current insert LSN, a replica's replay LSN) and a
replica's replay delay. Roles are what the servers say: the primary is the one host that is up
and not in recovery; with none, writes wait for one (a promoted standby), and with two or more
pgtarn writes to neither (``split_brain``) and says so loudly.

A host that fails a check, or a server's login, is banned: no reads go to it, and its next
check waits for a backoff that doubles from FIRST_BAN up to MAX_BAN; a check that passes lifts
the ban.

Reads. ``readable(since)`` lists the replicas a read may go to: up, not banned, within
``max_replica_lag``, and for read-your-writes (``since``: when the client's last write
committed) replayed past an LSN the primary reported after that commit. The primary's LSN is
sampled by the checks; a client whose write is younger than the last sample asks for an early
one (``want_sample``) and reads from the primary meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

UNKNOWN: Final = "unknown"
PRIMARY: Final = "primary"
REPLICA: Final = "replica"
#: The first ban of a host lasts this long; each failure in a row doubles it, up to MAX_BAN.
FIRST_BAN: Final = 1.0
MAX_BAN: Final = 60.0
#: An early sample of the primary's LSN (read-your-writes) is asked for at most this often.
SAMPLE_GAP: Final = 0.05


class HostState:
    """One server of a split database: what its last check said."""

    __slots__ = (
        "banned_until",
        "checked_at",
        "failures",
        "host",
        "index",
        "lag_bytes",
        "lag_seconds",
        "lsn",
        "port",
        "reason",
        "role",
        "routed",
        "up",
    )

    def __init__(self, index: int, host: str, port: int) -> None:
        self.index = index
        self.host = host
        self.port = port
        self.role = UNKNOWN
        #: Its last check (or login) passed.
        self.up = False
        self.banned_until = 0.0
        #: Checks or logins failed in a row (the ban's backoff).
        self.failures = 0
        #: Why it is banned (for SHOW HOSTS), or "".
        self.reason = ""
        #: The primary's current insert LSN, or a replica's replay LSN, at its last check.
        self.lsn = 0
        #: A replica's distance behind the primary: bytes of WAL and seconds of replay.
        self.lag_bytes = 0
        self.lag_seconds = 0.0
        #: When its last check was sent (monotonic; 0.0: never checked).
        self.checked_at = 0.0
        #: Transactions routed to it (statistics).
        self.routed = 0

    @property
    def key(self) -> str:
        return f"{self.host}:{self.port}"

    def banned(self, now: float) -> bool:
        return self.banned_until > now

    def __repr__(self) -> str:
        return f"<Host {self.key} {self.role}{' up' if self.up else ''}>"


class HostSet:
    """The servers of a split database: roles, bans, lag, and the replicas a read may use."""

    def __init__(
        self,
        name: str,
        targets: list[tuple[str, int]],
        *,
        period: float = 1.0,
        max_lag_bytes: int | None = None,
        max_lag_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.hosts = [HostState(i, host, port) for i, (host, port) in enumerate(targets)]
        self.period = period
        self.max_lag_bytes = max_lag_bytes
        self.max_lag_seconds = max_lag_seconds
        self.clock = clock
        #: The one host that is up and not in recovery, or None (none, or split brain).
        self.primary: HostState | None = None
        #: Two or more hosts claim to be the primary: writes go to none of them.
        self.split_brain = False
        #: The last sample of the primary's LSN: when its check was sent, and the LSN.
        self.sampled_at = 0.0
        self.sampled_lsn = 0
        #: A client waits for a sample younger than its write (read-your-writes).
        self.sample_wanted = False
        #: Replicas fit for reads without read-your-writes, recomputed at every change.
        self.fit: list[HostState] = []
        #: Called after roles, bans or lag changed (the registry retargets its pools).
        self.changed: list[Callable[[HostSet], None]] = []
        #: Set by the health checker: check now (a sample is wanted, a login failed).
        self.wake: Callable[[], None] = _nothing
        #: Where role changes and bans are told (the health checker logs them).
        self.tell: Callable[[int, str], None] = _nothing_told

    def __repr__(self) -> str:
        return f"<HostSet {self.name}>"

    def configure(
        self, period: float, max_lag_bytes: int | None, max_lag_seconds: float | None
    ) -> None:
        """Settings from a reload (the host list itself makes another HostSet)."""
        self.period = period
        self.max_lag_bytes = max_lag_bytes
        self.max_lag_seconds = max_lag_seconds
        self._recompute()

    # --- the checks' reports ------------------------------------------------------------------

    def check_passed(
        self, index: int, in_recovery: bool, lsn: int, lag_seconds: float, sent_at: float
    ) -> None:
        """A check of host index, sent at sent_at, answered."""
        host = self.hosts[index]
        role = REPLICA if in_recovery else PRIMARY
        if host.role != role:
            self.tell(
                logging.WARNING if host.role != UNKNOWN else logging.INFO,
                f"{self.name}: {host.key} is now {role} (was {host.role})",
            )
            host.role = role
        if not host.up or host.banned_until:
            if host.banned_until:
                self.tell(logging.WARNING, f"{self.name}: {host.key} is back, ban lifted")
            host.up = True
            host.banned_until = 0.0
            host.reason = ""
        host.failures = 0
        host.lsn = lsn
        host.lag_seconds = lag_seconds if in_recovery else 0.0
        host.checked_at = sent_at
        if not in_recovery and sent_at >= self.sampled_at:
            self.sampled_at = sent_at
            self.sampled_lsn = lsn
            self.sample_wanted = False
        self._recompute()

    def check_failed(self, index: int, reason: str) -> None:
        """A check of host index failed (unreachable, login refused, no answer)."""
        self.ban(index, reason)

    def ban(self, index: int, reason: str) -> None:
        """No reads go to host index until a check passes; its next check waits for the
        ban's backoff. A server's failed login bans its host too (and wakes the checker)."""
        host = self.hosts[index]
        now = self.clock()
        host.failures += 1
        host.banned_until = now + min(MAX_BAN, FIRST_BAN * 2 ** (host.failures - 1))
        if host.up or host.reason != reason:
            self.tell(
                logging.WARNING,
                f"{self.name}: {host.key} banned for {host.banned_until - now:g} s: {reason}",
            )
        host.up = False
        host.reason = reason
        self._recompute()

    def next_check(self, index: int) -> float:
        """When host index is to be checked next (monotonic)."""
        host = self.hosts[index]
        if host.banned_until:
            return host.banned_until
        return host.checked_at + self.period

    # --- roles and reads ------------------------------------------------------------------------

    def _recompute(self) -> None:
        """The primary and the replicas fit for reads, after any change; tell who cares."""
        now = self.clock()
        claims = [h for h in self.hosts if h.up and h.role == PRIMARY]
        primary = claims[0] if len(claims) == 1 else None
        split_brain = len(claims) > 1
        if split_brain and not self.split_brain:
            self.tell(
                logging.ERROR,
                f"{self.name}: {len(claims)} servers claim to be the primary ("
                f"{', '.join(h.key for h in claims)}): no writes go to any of them",
            )
        elif self.split_brain and not split_brain:
            self.tell(logging.WARNING, f"{self.name}: a single primary again")
        if primary is not self.primary:
            if primary is None and not split_brain:
                self.tell(logging.WARNING, f"{self.name}: no primary: writes wait for one")
            elif primary is not None:
                self.tell(logging.WARNING, f"{self.name}: primary is {primary.key}")
        self.split_brain = split_brain
        self.primary = primary
        head = primary.lsn if primary is not None else 0
        fit = []
        for host in self.hosts:
            if host.role != REPLICA or not host.up or host.banned(now):
                continue
            host.lag_bytes = max(0, head - host.lsn) if head else 0
            if self.max_lag_bytes is not None and host.lag_bytes > self.max_lag_bytes:
                continue
            if self.max_lag_seconds is not None and host.lag_seconds > self.max_lag_seconds:
                continue
            fit.append(host)
        self.fit = fit
        for changed in self.changed:
            changed(self)

    def readable(self, since: float) -> list[HostState]:
        """The replicas a read of a client whose last write committed at since (monotonic;
        0.0: none, or read-your-writes off) may go to; empty: the primary serves it."""
        fit = self.fit
        if not since or not fit:
            return fit
        if self.sampled_at < since:  # no LSN known to follow that commit yet: ask for one
            self.want_sample()
            return []
        lsn = self.sampled_lsn
        return [host for host in fit if host.lsn >= lsn]

    def want_sample(self) -> None:
        """A client waits for the primary's LSN after its write: check soon."""
        if not self.sample_wanted:
            self.sample_wanted = True
            self.wake()


def _nothing() -> None:
    pass


def _nothing_told(level: int, message: str) -> None:
    pass
