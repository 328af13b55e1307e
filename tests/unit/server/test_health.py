"""The health checker with fake transports and a fake clock: checks sent on a kept connection,
answers read into the HostSet, failures banning, timeouts, wakes."""

from __future__ import annotations

import math

import pytest

from pgtarn.config.inifile import parse_config
from pgtarn.pool.hosts import PRIMARY, REPLICA, SAMPLE_GAP, HostSet
from pgtarn.proto import build
from pgtarn.proto.messages import parse_startup
from pgtarn.server.health import APPLICATION_NAME, CHECK_QUERY, HealthChecker, parse_check_row

from .fakes import INI, WELCOME, CountingRuntime, FakeTransport

PERIOD = 1.0


def answer(in_recovery: str = "f", lsn: str = "1000", lag: str = "0") -> bytes:
    """PostgreSQL's reply to the check query."""
    return (
        build.row_description([("pg_is_in_recovery", 16), ("lsn", 20), ("lag", 701)])
        + build.data_row([in_recovery, lsn, lag])
        + build.command_complete("SELECT 1")
        + build.ready_for_query(b"I")
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Setup:
    """A checker of two hosts whose connects only count (the test plays the sockets)."""

    def __init__(self) -> None:
        self.runtime = CountingRuntime(parse_config(INI.format(mode="transaction", prepared=0)), {})
        db = self.runtime.config.databases["app"]
        self.clock = Clock()
        self.hosts = HostSet(
            "app", [("10.0.0.1", 5432), ("10.0.0.2", 5433)], period=PERIOD, clock=self.clock
        )
        pool = self.runtime.registry.get_pool(db, "u")
        self.checker = HealthChecker(self.runtime, self.hosts, pool, db)
        self.checker.attach()

    @property
    def connects(self) -> int:
        return self.runtime.connects

    def step(self) -> float:
        return self.checker.step(self.clock.now)

    def connect(self, index: int) -> FakeTransport:
        """Host index's connection connects; its StartupMessage is taken."""
        conn = self.checker.probes[index].conn
        assert conn is not None
        transport = FakeTransport()
        conn.connection_made(transport)
        assert parse_startup(transport.take()[4:]).params["application_name"] == APPLICATION_NAME
        return transport

    def logged_in(self) -> list[FakeTransport]:
        """Both hosts checked once (connected, logged in, the query sent, not answered)."""
        self.step()
        transports = [self.connect(0), self.connect(1)]
        for index, transport in enumerate(transports):
            self.feed(index, WELCOME)
            assert transport.take() == build.query(CHECK_QUERY)
        return transports

    def feed(self, index: int, data: bytes) -> None:
        conn = self.checker.probes[index].conn
        assert conn is not None
        conn.data_received(data)


def test_the_check_row_is_read_as_role_lsn_and_lag() -> None:
    assert parse_check_row([b"f", b"50331792", b"0"]) == (False, 50331792, 0.0)
    assert parse_check_row([b"t", b"7", b"1.25"]) == (True, 7, 1.25)


@pytest.mark.parametrize(
    "row",
    [
        [],
        [b"t", b"7"],
        [b"t", b"7", b"0", b"0"],
        [None, b"7", b"0"],
        [b"t", None, b"0"],
        [b"t", b"7", None],
        [b"yes", b"7", b"0"],
        [b"t", b"x", b"0"],
        [b"t", b"-1", b"0"],
        [b"t", b"7", b"fast"],
        [b"t", b"7", b"NaN"],
        [b"t", b"7", b"Infinity"],
        [b"t", b"7", b"-2"],
    ],
)
def test_a_malformed_check_row_is_refused(row: list[bytes | None]) -> None:
    with pytest.raises(ValueError):
        parse_check_row(row)


def test_every_host_gets_its_own_connection_and_the_answers_set_the_roles() -> None:
    setup = Setup()
    setup.step()
    assert setup.connects == 2
    transports = [setup.connect(0), setup.connect(1)]
    for index, transport in enumerate(transports):
        setup.feed(index, WELCOME)
        assert transport.take() == build.query(CHECK_QUERY)
    setup.feed(0, answer("f", "5000"))
    setup.feed(1, answer("t", "4000", "2.5"))
    primary, replica = setup.hosts.hosts
    assert (primary.role, primary.up, primary.lsn) == (PRIMARY, True, 5000)
    assert (replica.role, replica.up, replica.lsn, replica.lag_bytes, replica.lag_seconds) == (
        REPLICA,
        True,
        4000,
        1000,
        2.5,
    )
    assert setup.hosts.primary is primary and primary.checked_at == setup.clock.now


def test_the_next_check_comes_a_period_later_on_the_same_connection() -> None:
    setup = Setup()
    transports = setup.logged_in()
    setup.feed(0, answer("f"))
    setup.feed(1, answer("t"))
    assert setup.step() == pytest.approx(setup.clock.now + PERIOD)
    assert transports[0].take() == b"" and transports[1].take() == b""
    setup.clock.now += PERIOD
    setup.step()
    assert setup.connects == 2  # no new connection
    assert transports[0].take() == build.query(CHECK_QUERY)
    assert transports[1].take() == build.query(CHECK_QUERY)


def test_one_check_at_a_time_per_host() -> None:
    setup = Setup()
    transports = setup.logged_in()
    setup.clock.now += PERIOD * 1.5  # no answer yet, but within the answer timeout
    setup.step()
    setup.checker.wake()
    setup.step()
    assert transports[0].take() == b"" and transports[1].take() == b""


def test_an_error_response_fails_the_check_and_bans_the_host() -> None:
    setup = Setup()
    setup.logged_in()
    setup.feed(
        0, build.error_response("42883", "function does not exist") + build.ready_for_query(b"I")
    )
    host = setup.hosts.hosts[0]
    assert not host.up and host.banned(setup.clock.now)
    assert host.reason == "check failed: function does not exist"


def test_notices_and_parameter_status_are_no_trouble() -> None:
    setup = Setup()
    setup.logged_in()
    setup.feed(
        0,
        build.parameter_status("in_hot_standby", "off")
        + build.error_response("00000", "hello", "NOTICE", notice=True)
        + answer("f", "77"),
    )
    assert setup.hosts.hosts[0].up and setup.hosts.hosts[0].lsn == 77


@pytest.mark.parametrize(
    "reply",
    [
        build.command_complete("SELECT 0") + build.ready_for_query(b"I"),  # no row
        answer("t", "banana"),
        build.data_row(["t", "1", "0"]) + answer(),  # two rows
        build.message(b"G", b"\x00\x00\x00") + answer(),  # CopyInResponse: not for us
    ],
)
def test_a_malformed_answer_fails_the_check(reply: bytes) -> None:
    setup = Setup()
    setup.logged_in()
    setup.feed(0, reply)
    host = setup.hosts.hosts[0]
    assert not host.up and host.reason.startswith("malformed answer")


def test_an_answer_nobody_asked_for_closes_the_connection_and_bans_the_host() -> None:
    setup = Setup()
    transports = setup.logged_in()
    setup.feed(0, answer())
    setup.feed(0, answer())
    assert transports[0].closing
    host = setup.hosts.hosts[0]
    assert not host.up and host.reason == "malformed answer: unexpected message 'T'"
    setup.clock.now = host.banned_until
    setup.step()
    assert setup.connects == 3


def test_no_answer_in_time_fails_the_check_and_closes_the_connection() -> None:
    setup = Setup()
    transports = setup.logged_in()
    setup.feed(1, answer("t"))
    timeout = max(setup.runtime.config.server_connect_timeout, 2 * PERIOD)
    setup.clock.now += timeout + 0.01
    setup.step()
    host = setup.hosts.hosts[0]
    assert not host.up and host.reason == f"no answer in {timeout:g} s"
    assert transports[0].closing and transports[0].take().endswith(build.TERMINATE)


def test_a_login_that_never_ends_times_out() -> None:
    setup = Setup()
    setup.step()
    setup.connect(0)
    setup.clock.now += setup.runtime.config.server_connect_timeout + 0.01
    setup.step()
    assert setup.hosts.hosts[0].reason.startswith("connect timeout")


def test_a_refused_login_bans_the_host_and_says_why() -> None:
    setup = Setup()
    setup.step()
    setup.connect(0)
    setup.feed(0, build.error_response("28P01", "password authentication failed", "FATAL"))
    host = setup.hosts.hosts[0]
    assert not host.up and host.reason.startswith("login failed: ")
    assert host.reason == "login failed: password authentication failed"


def test_a_failed_connect_bans_the_host_until_its_backoff_ends() -> None:
    setup = Setup()
    setup.step()
    probe = setup.checker.probes[0]
    assert probe.conn is not None
    probe.conn.lost("connection refused")
    host = setup.hosts.hosts[0]
    assert not host.up and host.reason == "connection refused"
    assert setup.step() <= host.banned_until
    setup.step()
    assert setup.connects == 2  # not again before the ban ends
    setup.clock.now = host.banned_until
    setup.step()
    assert setup.connects == 3


def test_a_connection_lost_between_checks_is_opened_again_at_once() -> None:
    setup = Setup()
    setup.logged_in()
    setup.feed(0, answer("f"))
    setup.clock.now += PERIOD * 0.9
    setup.step()
    setup.clock.now += PERIOD * 0.2
    conn = setup.checker.probes[0].conn
    assert conn is not None
    conn.connection_lost(None)
    setup.step()
    assert setup.connects == 3 and setup.hosts.hosts[0].up


def test_a_server_that_drops_new_connections_is_banned_not_reconnected_in_a_loop() -> None:
    setup = Setup()
    setup.logged_in()
    setup.feed(0, answer("f"))
    conn = setup.checker.probes[0].conn
    assert conn is not None
    conn.connection_lost(None)
    setup.step()
    assert setup.connects == 2 and setup.hosts.hosts[0].reason == "connection lost"


def test_a_connection_lost_during_a_check_fails_it() -> None:
    setup = Setup()
    setup.logged_in()
    conn = setup.checker.probes[0].conn
    assert conn is not None
    setup.feed(
        0,
        build.error_response(
            "57P01", "terminating connection due to administrator command", "FATAL"
        ),
    )
    conn.connection_lost(None)
    host = setup.hosts.hosts[0]
    assert not host.up
    assert host.reason == "connection lost: terminating connection due to administrator command"


def test_a_wake_checks_every_host_now_at_most_once_per_sample_gap() -> None:
    setup = Setup()
    transports = setup.logged_in()
    setup.feed(0, answer("f"))
    setup.feed(1, answer("t"))
    setup.clock.now += 0.1
    assert setup.hosts.wake == setup.checker.wake
    setup.hosts.want_sample()
    setup.step()
    assert transports[0].take() == build.query(CHECK_QUERY)
    assert transports[1].take() == build.query(CHECK_QUERY)
    setup.feed(0, answer("f"))
    setup.feed(1, answer("t"))
    setup.clock.now += SAMPLE_GAP / 5
    setup.checker.wake()
    assert setup.step() <= setup.clock.now + SAMPLE_GAP
    assert transports[0].take() == b""  # too soon after the last wake: later
    setup.clock.now += SAMPLE_GAP
    setup.step()
    assert transports[0].take() == build.query(CHECK_QUERY)


def test_the_next_step_is_never_now() -> None:
    setup = Setup()
    setup.logged_in()
    wait = setup.step() - setup.clock.now
    assert wait > 0 and math.isfinite(wait)


def test_close_terminates_every_connection_and_lets_go_of_the_host_set() -> None:
    setup = Setup()
    transports = setup.logged_in()
    setup.checker.close()
    assert all(t.closing and t.take().endswith(build.TERMINATE) for t in transports)
    assert setup.hosts.wake != setup.checker.wake
    setup.clock.now += 100
    setup.step()
    assert setup.connects == 2


def test_tell_logs_under_pgtarn_health(caplog: pytest.LogCaptureFixture) -> None:
    setup = Setup()
    setup.logged_in()
    with caplog.at_level("INFO", logger="pgtarn.health"):
        setup.feed(0, answer("f"))
    assert any(
        r.name == "pgtarn.health" and "is now primary" in r.getMessage() for r in caplog.records
    )
