"""The supervisor's books of workers = N: server slots and client counts across workers.

Plain data, no I/O: the supervisor feeds it the workers' messages and sends what it returns.

Server slots. A worker opens a server for a pool (database, user) only with a slot granted
here. It asks with the limits it computed from its config (the pool's size, with the reserve
when its janitor would use the reserve pool; max_db_connections; max_user_connections; 0: no
limit), so the ledger knows no config. A request that does not fit waits in one queue shared
by every worker, first come first served: a freed slot goes to the oldest request it fits.
When a request must wait and another worker holds more than its fair share of the limit in
the way (the limit divided by the workers that hold or want slots under it), that worker is
asked to give one back (``reclaims``): it closes an idle server of that pool, or the next one
released, and its release lets the waiting request in.

Clients. A worker asks at each login whether max_client_conn, max_db_client_connections and
max_user_client_connections allow one more client: its own clients it counts itself (they
include those still logging in, as a single process counts them), the other workers' admitted
clients are counted here.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, TypeVar

#: (database, user): one pool.
PoolKey = tuple[str, str]
K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class SlotRequest:
    """A worker's request for one server slot of a pool, with the limits that apply."""

    worker: int
    database: str
    user: str
    pool_limit: int
    max_db: int = 0
    max_user: int = 0


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Ask worker to give back one slot of the pool (database, user); idle_only: only if
    the pool has an idle server and no client waiting (else keep it)."""

    worker: int
    database: str
    user: str
    idle_only: bool = False


@dataclass(slots=True)
class ClientLimits:
    """The client limits of one login as its worker computed them (0: no limit), and that
    worker's own counts, this client included."""

    max_clients: int
    max_db: int = 0
    max_user: int = 0
    local_clients: int = 1
    local_db: int = 1
    local_user: int = 1


class Ledger:
    """Server slots held and asked for, and clients admitted, by each worker."""

    def __init__(self) -> None:
        #: (worker, database, user) -> slots that worker holds (its servers of the pool).
        self.slots: Counter[tuple[int, str, str]] = Counter()
        self.pool_total: Counter[PoolKey] = Counter()
        self.db_total: Counter[str] = Counter()
        self.user_total: Counter[str] = Counter()
        self.queue: deque[SlotRequest] = deque()
        #: (worker, database, user) -> slots that worker was asked to give back.
        self.reclaiming: Counter[tuple[int, str, str]] = Counter()
        #: Per worker: clients admitted, and by database and by user.
        self.clients: Counter[int] = Counter()
        self.db_clients: dict[int, Counter[str]] = {}
        self.user_clients: dict[int, Counter[str]] = {}

    # --- server slots -----------------------------------------------------------------------

    def held(self, worker: int, database: str, user: str) -> int:
        return self.slots[(worker, database, user)]

    def fits(self, request: SlotRequest) -> bool:
        if self.pool_total[(request.database, request.user)] >= request.pool_limit:
            return False
        if request.max_db and self.db_total[request.database] >= request.max_db:
            return False
        return not (request.max_user and self.user_total[request.user] >= request.max_user)

    def ask(self, request: SlotRequest) -> tuple[bool, list[Reclaim]]:
        """A worker asks for a slot: granted now (True), or queued, with the workers to ask
        to give one back."""
        if self.fits(request):
            self._take(request)
            return True, []
        self.queue.append(request)
        return False, self._reclaims(request)

    def nudge(self, worker: int, database: str, user: str) -> list[Reclaim]:
        """A worker's clients still wait for a queued request (its janitor asks every visit):
        the give-backs that request calls for now (the holders may have gone idle since)."""
        for request in self.queue:
            if (request.worker, request.database, request.user) == (worker, database, user):
                return self._reclaims(request)
        return []

    def release(self, worker: int, database: str, user: str) -> list[SlotRequest]:
        """A worker gives a slot back (its server closed): the queued requests it lets in."""
        key = (worker, database, user)
        if self.slots[key] <= 0:
            return []
        self._drop(key, 1)
        if self.reclaiming[key]:
            self.reclaiming[key] -= 1
        if not self.slots[key]:
            del self.slots[key]
            self.reclaiming.pop(key, None)
        return self._grant_queued()

    def worker_gone(self, worker: int) -> list[SlotRequest]:
        """A worker exited: its slots, requests and clients are dropped; the queued requests
        its slots let in."""
        for key in [k for k in self.slots if k[0] == worker]:
            self._drop(key, self.slots[key])
            del self.slots[key]
        for key in [k for k in self.reclaiming if k[0] == worker]:
            del self.reclaiming[key]
        self.queue = deque(r for r in self.queue if r.worker != worker)
        self.clients.pop(worker, None)
        self.db_clients.pop(worker, None)
        self.user_clients.pop(worker, None)
        return self._grant_queued()

    def queued(self, worker: int, database: str, user: str) -> int:
        return sum(
            1 for r in self.queue if (r.worker, r.database, r.user) == (worker, database, user)
        )

    def _take(self, request: SlotRequest) -> None:
        self.slots[(request.worker, request.database, request.user)] += 1
        self.pool_total[(request.database, request.user)] += 1
        self.db_total[request.database] += 1
        self.user_total[request.user] += 1

    def _drop(self, key: tuple[int, str, str], count: int) -> None:
        _worker, database, user = key
        self.slots[key] -= count
        _subtract(self.pool_total, (database, user), count)
        _subtract(self.db_total, database, count)
        _subtract(self.user_total, user, count)

    def _grant_queued(self) -> list[SlotRequest]:
        """Oldest first, every queued request that fits now."""
        granted: list[SlotRequest] = []
        if not self.queue:
            return granted
        kept: deque[SlotRequest] = deque()
        for request in self.queue:
            if self.fits(request):
                self._take(request)
                granted.append(request)
            else:
                kept.append(request)
        self.queue = kept
        return granted

    def _reclaims(self, request: SlotRequest) -> list[Reclaim]:
        """For each limit that keeps request waiting: one give-back from the worker that holds
        the most under it, when that is more than its fair share."""
        limits: list[tuple[int, tuple[str | None, str | None]]] = []
        if self.pool_total[(request.database, request.user)] >= request.pool_limit:
            limits.append((request.pool_limit, (request.database, request.user)))
        if request.max_db and self.db_total[request.database] >= request.max_db:
            limits.append((request.max_db, (request.database, None)))
        if request.max_user and self.user_total[request.user] >= request.max_user:
            limits.append((request.max_user, (None, request.user)))
        reclaims: list[Reclaim] = []
        for limit, (database, user) in limits:
            reclaim = self._reclaim_under(request.worker, limit, database, user)
            if reclaim is not None:
                reclaims.append(reclaim)
            else:
                reclaims += self._idle_under(request, database, user)
        return reclaims

    def _idle_under(
        self, request: SlotRequest, database: str | None, user: str | None
    ) -> list[Reclaim]:
        """No worker is over its fair share: each one holding slots under the limit (of
        another pool, for the asker) closes one idle server if it has one, as a single
        process closes an idle server of another pool at max_db_connections."""
        best: dict[int, tuple[int, str, str]] = {}
        for key, count in self.slots.items():
            worker, db, usr = key
            if (database is not None and db != database) or (user is not None and usr != user):
                continue
            if worker == request.worker and (db, usr) == (request.database, request.user):
                continue
            if worker not in best or count > self.slots[best[worker]]:
                best[worker] = key
        return [Reclaim(*key, idle_only=True) for key in best.values()]

    def _reclaim_under(
        self, asker: int, limit: int, database: str | None, user: str | None
    ) -> Reclaim | None:
        def under(db: str, usr: str) -> bool:
            return (database is None or db == database) and (user is None or usr == user)

        held: Counter[int] = Counter()
        biggest: dict[int, tuple[int, str, str]] = {}
        for key, count in self.slots.items():
            worker, db, usr = key
            if not under(db, usr):
                continue
            owed = min(count, self.reclaiming[key])
            held[worker] += count - owed
            if count - owed > 0 and (
                worker not in biggest or count - owed > self._spare(biggest[worker])
            ):
                biggest[worker] = key
        demand = set(held) | {r.worker for r in self.queue if under(r.database, r.user)}
        demand.add(asker)
        fair = limit / len(demand)
        candidates = [w for w in held if w != asker and held[w] > fair and w in biggest]
        if not candidates:
            return None
        worker = max(candidates, key=lambda w: held[w])
        key = biggest[worker]
        self.reclaiming[key] += 1
        return Reclaim(*key)

    def _spare(self, key: tuple[int, str, str]) -> int:
        return self.slots[key] - min(self.slots[key], self.reclaiming[key])

    # --- clients ----------------------------------------------------------------------------

    def admit(
        self, worker: int, database: str, user: str, admin: bool, limits: ClientLimits
    ) -> str | None:
        """One more client in worker: None (admitted and counted), or the limit that refuses
        it (max_client_conn, max_db_client_connections, max_user_client_connections)."""
        others = sum(n for w, n in self.clients.items() if w != worker)
        if limits.max_clients and others + limits.local_clients > limits.max_clients:
            return "max_client_conn"
        if limits.max_db and not admin:
            others_db = sum(c[database] for w, c in self.db_clients.items() if w != worker)
            if others_db + limits.local_db > limits.max_db:
                return "max_db_client_connections"
        if limits.max_user and not admin:
            others_user = sum(c[user] for w, c in self.user_clients.items() if w != worker)
            if others_user + limits.local_user > limits.max_user:
                return "max_user_client_connections"
        self.clients[worker] += 1
        self.db_clients.setdefault(worker, Counter())[database] += 1
        if not admin:
            self.user_clients.setdefault(worker, Counter())[user] += 1
        return None

    def client_left(self, worker: int, database: str, user: str, admin: bool) -> None:
        """An admitted client of worker is gone."""
        if self.clients[worker] > 0:
            self.clients[worker] -= 1
        _decrement(self.db_clients.get(worker), database)
        if not admin:
            _decrement(self.user_clients.get(worker), user)


def _subtract(counter: Counter[K], name: K, count: int) -> None:
    counter[name] -= count
    if counter[name] <= 0:
        del counter[name]


def _decrement(counter: Counter[str] | None, name: str) -> None:
    if counter is not None and counter[name] > 0:
        _subtract(counter, name, 1)


#: What the supervisor sends for the ledger: (worker index, message).
Outgoing = list[tuple[int, dict[str, Any]]]


def grants(requests: list[SlotRequest]) -> Outgoing:
    return [
        (r.worker, {"kind": "limits_grant", "database": r.database, "user": r.user})
        for r in requests
    ]


def reclaims(requests: list[Reclaim]) -> Outgoing:
    return [
        (
            r.worker,
            {
                "kind": "limits_reclaim",
                "database": r.database,
                "user": r.user,
                "idle_only": r.idle_only,
            },
        )
        for r in requests
    ]


def on_message(
    ledger: Ledger, worker: int, message: dict[str, Any]
) -> tuple[dict[str, Any] | None, Outgoing]:
    """A worker's ``limits_*`` message (workers/slots.py): the reply (for a request) and the
    messages to send to workers."""
    kind = message.get("kind")
    database = str(message.get("database", ""))
    user = str(message.get("user", ""))
    if kind == "limits_ask":
        request = SlotRequest(
            worker,
            database,
            user,
            _int(message, "pool_limit"),
            _int(message, "max_db"),
            _int(message, "max_user"),
        )
        granted, reclaimed = ledger.ask(request)
        out = grants([request]) if granted else []
        return None, out + reclaims(reclaimed)
    if kind == "limits_nudge":
        return None, reclaims(ledger.nudge(worker, database, user))
    if kind == "limits_release":
        return None, grants(ledger.release(worker, database, user))
    if kind == "limits_admit":
        raw = message.get("limits")
        numbers = [n if isinstance(n, int) else 0 for n in raw] if isinstance(raw, list) else []
        limits = ClientLimits(*(numbers + [0] * 6)[:6])
        refused = ledger.admit(worker, database, user, bool(message.get("admin")), limits)
        return {"refused": refused}, []
    if kind == "limits_left":
        ledger.client_left(worker, database, user, bool(message.get("admin")))
        return None, []
    return {"error": f"unknown message {kind!r}"}, []


def _int(message: dict[str, Any], name: str) -> int:
    value = message.get(name, 0)
    return value if isinstance(value, int) else 0
