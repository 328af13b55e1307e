"""Seeded random SET / RESET / transaction / savepoint steps by 20 clients: every SHOW prints what a
model of PostgreSQL's setting semantics predicts, directly and through pgtarn on 2 servers.

The model (ClientModel) is written from PostgreSQL's documented behaviour, not from pgtarn's
code: a session value per setting, and inside a transaction the values the session would keep at
COMMIT (`pending`, changed by SET and RESET, not by SET LOCAL) beside the values in effect now
(`current`), with a copy of both per savepoint. test_model_agrees_with_postgresql runs the same
steps with every client on a connection of its own and so shows that the model is right.

Seeds: PGTARN_FUZZ_SEEDS=1,2,3 (comma-separated) and PGTARN_FUZZ_STEPS=N choose other runs; a
failure names its seed and the steps before it.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess, TempCluster

from .drivers import connect

SEEDS = [int(s) for s in os.environ.get("PGTARN_FUZZ_SEEDS", "17,4242,90001,31337").split(",") if s]
STEPS = int(os.environ.get("PGTARN_FUZZ_STEPS", "800"))
CLIENTS = 20
PREPARED_CLIENTS = 3  # on again (#17): a prepared DISCARD ALL is followed now
"""Clients 0..PREPARED_CLIENTS-1 use psycopg's prepare_threshold=0: every statement, SET and
BEGIN included, goes out as a named prepared statement (extended protocol)."""
SWEEP_EVERY = 50
"""Every this many steps, each client not in a failed transaction SHOWs every setting."""
HISTORY = 25
"""Steps quoted in a failure message."""

CUSTOM = "myapp.tenant"
VALUES: dict[str, tuple[str, ...]] = {
    # values whose SHOW output is the value as written
    "statement_timeout": ("0", "30s", "2500ms", "1min"),
    "lock_timeout": ("0", "1s", "750ms"),
    "work_mem": ("64kB", "1MB", "4MB", "16MB"),
    "search_path": ("public", "alpha, public", "beta", '"$user", public'),
    "application_name": ("fuzz-a", "fuzz b", ""),
    "timezone": ("UTC", "Asia/Tokyo", "America/New_York"),
    CUSTOM: ("t1", "t2", "acme corp"),
}
NAMES = tuple(VALUES)
BAD_VALUES = {"statement_timeout": "soon", "lock_timeout": "later", "work_mem": "lots"}

DIVISION_BY_ZERO = "22012"
INVALID_PARAMETER_VALUE = "22023"
ACTIVE_SQL_TRANSACTION = "25001"
IN_FAILED_SQL_TRANSACTION = "25P02"


# --------------------------------------------------------------------------- the model


@dataclass
class ClientModel:
    """What PostgreSQL holds for one client's session: its settings and transaction state."""

    defaults: dict[str, str]
    session: dict[str, str] = field(default_factory=dict)
    in_tx: bool = False
    failed: bool = False
    pending: dict[str, str] = field(default_factory=dict)  # session values after a COMMIT now
    current: dict[str, str] = field(default_factory=dict)  # values in effect now
    savepoints: list[tuple[str, dict[str, str], dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.session = dict(self.defaults)
        self.current = dict(self.defaults)

    def show(self, name: str) -> str:
        return self.current[name]

    def begin(self) -> None:
        self.in_tx, self.failed = True, False
        self.pending, self.current = dict(self.session), dict(self.session)
        self.savepoints = []

    def commit(self) -> None:
        if not self.in_tx:
            return  # WARNING: there is no transaction in progress
        if not self.failed:
            self.session = self.pending
        self.rollback()

    def rollback(self) -> None:
        self.in_tx, self.failed, self.savepoints = False, False, []
        self.pending, self.current = {}, dict(self.session)

    def fail(self) -> None:
        """An error: inside a transaction it is aborted; outside, the statement's own
        (implicit) transaction is rolled back and nothing changes."""
        if self.in_tx:
            self.failed = True

    def _in_own_tx(self, change: Callable[[], None]) -> None:
        """A statement outside a transaction block runs in a transaction of its own."""
        if self.in_tx:
            change()
            return
        self.begin()
        change()
        self.commit()

    def set(self, name: str, value: str, *, local: bool = False) -> None:
        def change() -> None:
            self.current[name] = value
            if not local:
                self.pending[name] = value

        self._in_own_tx(change)

    def reset(self, name: str) -> None:
        self.set(name, self.defaults[name])

    def reset_all(self) -> None:
        for name in NAMES:
            self.reset(name)

    def savepoint(self, name: str) -> None:
        self.savepoints.append((name, dict(self.pending), dict(self.current)))

    def _savepoint_index(self, name: str) -> int:
        return max(i for i, (n, _p, _c) in enumerate(self.savepoints) if n == name)

    def rollback_to(self, name: str) -> None:
        i = self._savepoint_index(name)
        del self.savepoints[i + 1 :]
        _n, pending, current = self.savepoints[i]
        self.pending, self.current, self.failed = dict(pending), dict(current), False

    def release(self, name: str) -> None:
        del self.savepoints[self._savepoint_index(name) :]


# --------------------------------------------------------------------------- the steps


def nothing(_model: ClientModel) -> None:
    pass


def failing(model: ClientModel) -> None:
    model.fail()


@dataclass(frozen=True)
class Step:
    """One statement of one client, with its effect on the model."""

    client: int
    sql: str
    apply: Callable[[ClientModel], None] = nothing
    error: str | None = None  # the SQLSTATE it must fail with
    show: str | None = None  # the setting whose value it returns


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def show_sql(name: str) -> str:
    if name == CUSTOM:  # a placeholder: unknown to a backend that never saw it, so no SHOW
        return f"SELECT coalesce(current_setting({literal(name)}, true), '')"
    return f"SHOW {name}"


class StepMaker:
    """Draws the next step from the models' state only, so a seed gives the same steps
    whatever the statements return."""

    def __init__(self, rng: random.Random, models: list[ClientModel]) -> None:
        self.rng = rng
        self.models = models

    def kw(self, keywords: str) -> str:
        return keywords.lower() if self.rng.random() < 0.3 else keywords

    def pick(self, options: Sequence[tuple[float, Callable[[], Step]]]) -> Step:
        weights = [w for w, _make in options]
        return self.rng.choices(options, weights)[0][1]()

    def next(self) -> Step:
        owners = [i for i, m in enumerate(self.models) if m.in_tx]
        assert len(owners) <= 1, owners  # two open transactions could hold both servers
        owner = owners[0] if owners else None
        if owner is not None and self.rng.random() < 0.6:
            if self.models[owner].failed:
                return self.failed_tx_step(owner)
            return self.tx_step(owner)
        client = self.rng.choice([i for i in range(len(self.models)) if i != owner])
        if owner is None and self.rng.random() < 0.15:
            return Step(
                client, self.kw(self.rng.choice(["BEGIN", "START TRANSACTION"])), ClientModel.begin
            )
        return self.idle_step(client)

    # -- statements

    def set_step(self, client: int, *, local: bool = False) -> Step:
        name = self.rng.choice(NAMES)
        value = self.rng.choice(VALUES[name])
        as_written = value if name == "search_path" else literal(value)
        forms = [f"{self.kw('SET LOCAL' if local else 'SET')} {name} = {as_written}",
                 f"{self.kw('SET LOCAL' if local else 'SET SESSION')} {name} "
                 f"{self.kw('TO')} {as_written}",
                 f"{self.kw('SELECT set_config')}({literal(name)}, {literal(value)}, "
                 f"{'true' if local else 'false'})"]  # fmt: skip
        if name == "timezone":
            forms.append(f"{self.kw('SET LOCAL TIME ZONE' if local else 'SET TIME ZONE')} "
                         f"{literal(value)}")  # fmt: skip
        return Step(client, self.rng.choice(forms), lambda m: m.set(name, value, local=local))

    def reset_step(self, client: int) -> Step:
        name = self.rng.choice(NAMES)
        sql = self.rng.choice(
            [f"{self.kw('RESET')} {name}", f"{self.kw('SET')} {name} {self.kw('TO DEFAULT')}"]
        )
        return Step(client, sql, lambda m: m.reset(name))

    def show_step(self, client: int) -> Step:
        name = self.rng.choice(NAMES)
        return Step(client, show_sql(name), show=name)

    def bad_set_step(self, client: int) -> Step:
        name, value = self.rng.choice(sorted(BAD_VALUES.items()))
        return Step(client, f"SET {name} = {literal(value)}", failing, INVALID_PARAMETER_VALUE)

    def savepoint_name(self, client: int) -> str:
        return self.rng.choice([n for n, _p, _c in self.models[client].savepoints])

    def idle_step(self, client: int) -> Step:
        prepared = client < PREPARED_CLIENTS
        options: list[tuple[float, Callable[[], Step]]] = [
            (6, lambda: self.set_step(client)),
            (1, lambda: self.set_step(client, local=True)),  # outside a transaction: no effect
            (2, lambda: self.reset_step(client)),
            (0.7, lambda: Step(client, self.kw("RESET ALL"), ClientModel.reset_all)),
            (5, lambda: self.show_step(client)),
            (0.5, lambda: self.bad_set_step(client)),
            (0.4, lambda: Step(client, "SELECT 1/0", failing, DIVISION_BY_ZERO)),
            (0.3, lambda: Step(client, self.kw(self.rng.choice(["COMMIT", "ROLLBACK"])))),
        ]
        if not prepared:  # psycopg forgets its prepared statements at DISCARD ALL: keep apart
            options.append(
                (0.5, lambda: Step(client, self.kw("DISCARD ALL"), ClientModel.reset_all))
            )
        return self.pick(options)

    def tx_step(self, client: int) -> Step:
        model = self.models[client]
        options: list[tuple[float, Callable[[], Step]]] = [
            (5, lambda: self.set_step(client)),
            (3, lambda: self.set_step(client, local=True)),
            (1.5, lambda: self.reset_step(client)),
            (0.4, lambda: Step(client, self.kw("RESET ALL"), ClientModel.reset_all)),
            (4, lambda: self.show_step(client)),
            (1.5, lambda: self.savepoint_step(client)),
            (0.6, lambda: Step(client, "SELECT 1/0", failing, DIVISION_BY_ZERO)),
            (0.4, lambda: self.bad_set_step(client)),
            (
                1,
                lambda: Step(
                    client, self.kw(self.rng.choice(["COMMIT", "END"])), ClientModel.commit
                ),
            ),
            (
                0.7,
                lambda: Step(
                    client, self.kw(self.rng.choice(["ROLLBACK", "ABORT"])), ClientModel.rollback
                ),
            ),
        ]
        if client >= PREPARED_CLIENTS:
            options.append(
                (0.2, lambda: Step(client, "DISCARD ALL", failing, ACTIVE_SQL_TRANSACTION))
            )
        if model.savepoints:
            options += [
                (1.5, lambda: self.rollback_to_step(client)),
                (1, lambda: self.release_step(client)),
            ]
        return self.pick(options)

    def failed_tx_step(self, client: int) -> Step:
        options: list[tuple[float, Callable[[], Step]]] = [
            (1, lambda: Step(client, self.kw("ROLLBACK"), ClientModel.rollback)),
            (0.7, lambda: Step(client, self.kw("COMMIT"), ClientModel.commit)),  # = ROLLBACK
            (1, lambda: self.refused_step(client)),
        ]
        if self.models[client].savepoints:
            options.append((2, lambda: self.rollback_to_step(client)))
        return self.pick(options)

    def refused_step(self, client: int) -> Step:
        """Any other statement in a failed transaction, a SET too, fails and changes nothing."""
        if self.rng.random() < 0.5:
            return Step(client, show_sql(self.rng.choice(NAMES)), error=IN_FAILED_SQL_TRANSACTION)
        step = self.set_step(client)
        return Step(client, step.sql, error=IN_FAILED_SQL_TRANSACTION)

    def savepoint_step(self, client: int) -> Step:
        name = self.rng.choice(["s", "t"])
        return Step(client, f"{self.kw('SAVEPOINT')} {name}", lambda m: m.savepoint(name))

    def rollback_to_step(self, client: int) -> Step:
        name = self.savepoint_name(client)
        sql = f"{self.kw(self.rng.choice(['ROLLBACK TO SAVEPOINT', 'ROLLBACK TO']))} {name}"
        return Step(client, sql, lambda m: m.rollback_to(name))

    def release_step(self, client: int) -> Step:
        name = self.savepoint_name(client)
        sql = f"{self.kw(self.rng.choice(['RELEASE SAVEPOINT', 'RELEASE']))} {name}"
        return Step(client, sql, lambda m: m.release(name))


# --------------------------------------------------------------------------- the run


def settings_of(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Every setting of NAMES as a fresh session sees it: the model's defaults."""
    return {name: str(row[0]) for name in NAMES
            if (row := conn.execute(show_sql(name)).fetchone()) is not None}  # fmt: skip


def run_steps(conns: Sequence[psycopg.Connection[Any]], defaults: dict[str, str], seed: int,
              steps: int) -> int:  # fmt: skip
    """Run `steps` seeded steps (and the sweeps); fail at the first disagreement with the
    model. Returns how many values were compared."""
    assert set(defaults) == set(NAMES)
    rng = random.Random(seed)
    models = [ClientModel(dict(defaults)) for _ in conns]
    maker = StepMaker(rng, models)
    history: list[str] = []
    compared = 0

    def where(number: int, step: Step) -> str:
        return (
            f"seed {seed} (rerun: PGTARN_FUZZ_SEEDS={seed}), step {number}, client "
            f"{step.client}: {step.sql!r}\nsteps before it:\n" + "\n".join(history[-HISTORY:])
        )

    def execute(number: int, step: Step) -> None:
        nonlocal compared
        model = models[step.client]
        expected = model.show(step.show) if step.show is not None else None
        try:
            cur = conns[step.client].execute(step.sql)
            row = cur.fetchone() if step.show is not None else None
        except psycopg.Error as exc:
            if exc.sqlstate != step.error or exc.sqlstate is None:
                pytest.fail(
                    f"{where(number, step)}\nfailed with {exc.sqlstate}: {exc}; expected "
                    f"{'success' if step.error is None else step.error}",
                    pytrace=False,
                )
            step.apply(model)
            history.append(f"{number:4d} c{step.client:02d} {step.sql}  -> {exc.sqlstate}")
            return
        if step.error is not None:
            pytest.fail(f"{where(number, step)}\nsucceeded; expected {step.error}", pytrace=False)
        step.apply(model)
        if step.show is not None:
            got = None if row is None else str(row[0])
            compared += 1
            if got != expected:
                pytest.fail(
                    f"{where(number, step)}\nprinted {got!r}; expected {expected!r}", pytrace=False
                )
            history.append(f"{number:4d} c{step.client:02d} {step.sql}  -> {got!r}")
        else:
            history.append(f"{number:4d} c{step.client:02d} {step.sql}")

    def sweep(number: int) -> None:
        for client, model in enumerate(models):
            if model.failed:
                continue
            for name in NAMES:
                execute(number, Step(client, show_sql(name), show=name))

    for number in range(1, steps + 1):
        execute(number, maker.next())
        if number % SWEEP_EVERY == 0:
            sweep(number)
    for client, model in enumerate(models):  # close the open transaction, then a last look
        if model.in_tx:
            execute(steps + 1, Step(client, "ROLLBACK", ClientModel.rollback))
    sweep(steps + 1)
    return compared


@contextlib.contextmanager
def clients(open_one: Callable[..., psycopg.Connection[Any]]) -> Iterator[
        list[psycopg.Connection[Any]]]:  # fmt: skip
    """CLIENTS autocommit connections (the first PREPARED_CLIENTS preparing every statement),
    all closed at the end."""
    with contextlib.ExitStack() as stack:
        conns = []
        for i in range(CLIENTS):
            prepared = i < PREPARED_CLIENTS
            conn = stack.enter_context(
                open_one(autocommit=True, prepare_threshold=0 if prepared else None)
            )
            conn.prepared_max = 10_000  # no DEALLOCATE of psycopg's own, in a failed transaction
            conns.append(conn)
        yield conns


def direct_defaults(pg_cluster: TempCluster) -> dict[str, str]:
    with psycopg.connect(pg_cluster.dsn("app", "app_pass", dbname="app"),
                         autocommit=True) as conn:  # fmt: skip
        return settings_of(conn)


@pytest.mark.parametrize("seed", SEEDS)
def test_model_agrees_with_postgresql(pg_cluster: TempCluster, seed: int) -> None:
    """Each client on a connection of its own: PostgreSQL itself checks the model."""
    defaults = direct_defaults(pg_cluster)
    dsn = pg_cluster.dsn("app", "app_pass", dbname="app")
    with clients(lambda **kw: psycopg.connect(dsn, **kw)) as conns:
        compared = run_steps(conns, defaults, seed, STEPS)
    assert compared > STEPS


@pytest.mark.parametrize("seed", SEEDS)
def test_settings_follow_their_client_across_2_servers(
        pgtarn_factory: Callable[..., PgtarnProcess], pg_cluster: TempCluster,
        seed: int) -> None:  # fmt: skip
    """20 clients on 2 servers in transaction mode: each client sees its own settings only,
    with PostgreSQL's transaction and savepoint semantics."""
    proc = pgtarn_factory(settings={"pool_mode": "transaction", "default_pool_size": 2,
                                    "max_client_conn": 100})  # fmt: skip
    defaults = direct_defaults(pg_cluster)
    with clients(lambda **kw: connect(proc, **kw)) as conns:
        pids = {row[0] for c in conns[:3] if (row := c.execute(
            "SELECT pg_backend_pid()").fetchone()) is not None}  # fmt: skip
        assert len(pids) <= 2
        compared = run_steps(conns, defaults, seed, STEPS)
    assert compared > STEPS
