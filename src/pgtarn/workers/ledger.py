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

Clients. max_client_conn is kept with places: every admitted client holds one, and a worker
holds some spare places besides (a lease), so that most logins take a spare place of their
worker's without asking here. A worker asks when it has none left; it gets one and a new
lease, if the places of all workers stay within the limit. When they would not, the other
workers are asked to give their spare places back (``limits_spare``), and the login waits for
their answers: a client is refused only when every place is held by a client. A client to
which max_db_client_connections or max_user_client_connections applies is always asked about
(it takes a spare place all the same): its worker's own clients it counts itself (they include
those still logging in, as a single process counts them), the other workers' are counted here.
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


@dataclass(slots=True)
class Admission:
    """One login a worker asks about: need, the places it needs (1, or 0 when it has a spare
    one for this client); lease, the spare places it would take with it."""

    worker: int
    ident: object
    database: str
    user: str
    admin: bool
    limits: ClientLimits
    need: int = 1
    lease: int = 0


#: An admission's answer: the limit that refuses it (None: admitted), and the places granted.
Verdict = tuple[str | None, int]


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
        #: Per worker: client places held (its clients and its spare places), and the clients
        #: counted by database and by user (those a per-database or per-user limit applied to).
        self.places: Counter[int] = Counter()
        self.db_clients: dict[int, Counter[str]] = {}
        self.user_clients: dict[int, Counter[str]] = {}
        #: Admissions waiting for the workers in ``asking`` to give spare places back.
        self.waiting_admissions: list[Admission] = []
        self.asking: set[int] = set()

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
        self.places.pop(worker, None)
        self.db_clients.pop(worker, None)
        self.user_clients.pop(worker, None)
        return self._grant_queued()

    def clients_worker_gone(self, worker: int) -> list[tuple[Admission, Verdict]]:
        """The other workers' admissions that waited for this one's answer, decided now."""
        self.waiting_admissions = [a for a in self.waiting_admissions if a.worker != worker]
        self.asking.discard(worker)
        self.places.pop(worker, None)
        return self._decide_waiting()

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
        self, admission: Admission
    ) -> tuple[Verdict | None, list[tuple[int, dict[str, Any]]]]:
        """A login: its verdict now, or None and the ``limits_spare`` requests to send (it
        waits for the other workers' spare places: :meth:`spare_returned`)."""
        verdict = self._verdict(admission)
        if verdict[0] != "max_client_conn":
            return verdict, []
        others = [w for w, n in self.places.items() if w != admission.worker and n > 0]
        if not others:
            return verdict, []
        self.waiting_admissions.append(admission)
        asked = [w for w in others if w not in self.asking]
        self.asking.update(asked)
        return None, [(w, {"kind": "limits_spare"}) for w in asked]

    def spare_returned(
        self, worker: int, count: int, asked: bool
    ) -> list[tuple[Admission, Verdict]]:
        """worker gave back count spare places (asked: its answer to ``limits_spare``); the
        waiting admissions decided now."""
        _subtract(self.places, worker, min(max(count, 0), self.places[worker]))
        if asked:
            self.asking.discard(worker)
        return self._decide_waiting()

    def _decide_waiting(self) -> list[tuple[Admission, Verdict]]:
        decided: list[tuple[Admission, Verdict]] = []
        kept: list[Admission] = []
        for admission in self.waiting_admissions:
            verdict = self._verdict(admission)
            if verdict[0] is None or not self.asking:  # still refused with every answer in
                decided.append((admission, verdict))
            else:
                kept.append(admission)
        self.waiting_admissions = kept
        return decided

    def _verdict(self, admission: Admission) -> Verdict:
        worker, limits = admission.worker, admission.limits
        database, user, admin = admission.database, admission.user, admission.admin
        total = sum(self.places.values())
        need = admission.need
        if need and limits.max_clients and total + need > limits.max_clients:
            return "max_client_conn", 0
        if limits.max_db and not admin:
            others_db = sum(c[database] for w, c in self.db_clients.items() if w != worker)
            if others_db + limits.local_db > limits.max_db:
                return "max_db_client_connections", 0
        if limits.max_user and not admin:
            others_user = sum(c[user] for w, c in self.user_clients.items() if w != worker)
            if others_user + limits.local_user > limits.max_user:
                return "max_user_client_connections", 0
        places = 0
        if need:
            room = limits.max_clients - total - need if limits.max_clients else admission.lease
            places = need + max(0, min(admission.lease, room))
            self.places[worker] += places
        if limits.max_db or limits.max_user:  # counted by name only where a limit applies
            self.db_clients.setdefault(worker, Counter())[database] += 1
            if not admin:
                self.user_clients.setdefault(worker, Counter())[user] += 1
        return None, places

    def client_left(self, worker: int, database: str, user: str, admin: bool) -> None:
        """A client of worker counted by name is gone (its place stays with the worker)."""
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
        admission = Admission(
            worker,
            message.get("id"),
            database,
            user,
            bool(message.get("admin")),
            ClientLimits(*(numbers + [0] * 6)[:6]),
            min(1, max(0, _int(message, "need"))),
            max(0, _int(message, "lease")),
        )
        verdict, asks = ledger.admit(admission)
        return (None if verdict is None else _answer(verdict)), asks
    if kind == "limits_returned":
        decided = ledger.spare_returned(worker, _int(message, "count"), bool(message.get("asked")))
        return None, answers(decided)
    if kind == "limits_left":
        ledger.client_left(worker, database, user, bool(message.get("admin")))
        return None, []
    return {"error": f"unknown message {kind!r}"}, []


def answers(decided: list[tuple[Admission, Verdict]]) -> Outgoing:
    """The replies to admissions decided after they waited."""
    return [(a.worker, {**_answer(verdict), "re": a.ident}) for a, verdict in decided]


def _answer(verdict: Verdict) -> dict[str, Any]:
    return {"refused": verdict[0], "places": verdict[1]}


def _int(message: dict[str, Any], name: str) -> int:
    value = message.get(name, 0)
    return value if isinstance(value, int) else 0
