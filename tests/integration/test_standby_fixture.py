"""The streaming standby the suite makes for replica tests: it follows its primary, reads
only, and takes writes once promoted."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from pgtarn.demo.cluster import ClusterError
from tests.support.cluster import PrimaryCluster, StandbyCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def primary_and_standby() -> Iterator[tuple[PrimaryCluster, StandbyCluster]]:
    primary = PrimaryCluster()
    primary.start()
    standby = StandbyCluster(primary)
    try:
        primary.psql("CREATE TABLE marks (n int);")
        standby.start()
        yield primary, standby
    finally:
        standby.cleanup()
        primary.cleanup()


def _until(check: Callable[[], object], seconds: float = 15.0) -> str:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return str(value)
        time.sleep(0.1)


def test_the_standby_streams_from_its_primary_and_reads_only(
    primary_and_standby: tuple[PrimaryCluster, StandbyCluster],
) -> None:
    primary, standby = primary_and_standby
    assert standby.port != primary.port and standby.socket_dir != primary.socket_dir
    assert standby.psql("SELECT pg_is_in_recovery();").strip() == "t"
    assert primary.psql("SELECT pg_is_in_recovery();").strip() == "f"
    primary.psql("INSERT INTO marks VALUES (42);")
    assert (
        _until(lambda: standby.psql("SELECT count(*) FROM marks WHERE n = 42;").strip() == "1")
        == "True"
    )
    assert "read-only" in _write_error(standby)
    streaming = primary.psql("SELECT state FROM pg_stat_replication;").strip()
    assert streaming == "streaming"


def test_a_promoted_standby_takes_writes(
    primary_and_standby: tuple[PrimaryCluster, StandbyCluster],
) -> None:
    _primary, standby = primary_and_standby
    standby.promote()
    assert standby.psql("SELECT pg_is_in_recovery();").strip() == "f"
    standby.psql("INSERT INTO marks VALUES (7);")
    assert standby.psql("SELECT count(*) FROM marks WHERE n = 7;").strip() == "1"


def _write_error(cluster: StandbyCluster) -> str:
    try:
        cluster.psql("INSERT INTO marks VALUES (1);")
    except ClusterError as exc:  # psql failed, with PostgreSQL's message
        return str(exc)
    return ""
