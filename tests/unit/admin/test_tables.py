"""The SHOW tables built from a runtime's state: SHOW LISTENERS from the pools' ChannelBoards."""

from __future__ import annotations

import time

from pgtarn.admin.show import SHOW_TABLES
from pgtarn.admin.tables import INT4, TEXT, show_listeners
from pgtarn.config.settings import Config, DatabaseEntry
from pgtarn.runtime import Runtime


class FakeSubscriber:
    """A listening client, as the board sees it."""

    def notify(self, message: bytes) -> None:
        pass

    def listener_confirmed(self, warning: str) -> None:
        pass

    def listener_lost(self) -> None:
        pass

    def release_notifications(self) -> None:
        pass


def listen(
    runtime: Runtime, database: str, user: str, client: FakeSubscriber, *channels: str
) -> None:
    pool = runtime.registry.get_pool(DatabaseEntry(name=database), user)
    assert pool.board is not None
    pool.board.update(client, frozenset(), frozenset(channels), time.monotonic())


def test_show_listeners_has_a_row_per_channel_listened_to_sorted() -> None:
    runtime = Runtime(Config.default(), {})
    a, b, c = FakeSubscriber(), FakeSubscriber(), FakeSubscriber()
    listen(runtime, "db2", "u", a, "zeta", "Alpha")
    listen(runtime, "db1", "v", b, "jobs")
    listen(runtime, "db1", "u", c, 'we"ird chan')
    listen(runtime, "db2", "u", c, "zeta")
    runtime.registry.get_pool(DatabaseEntry(name="db3"), "u")  # nobody listens there

    table = SHOW_TABLES["listeners"](runtime)

    assert table.columns == [
        ("database", TEXT),
        ("user", TEXT),
        ("channel", TEXT),
        ("clients", INT4),
    ]
    assert table.rows == [
        ["db1", "u", 'we"ird chan', 1],
        ["db1", "v", "jobs", 1],
        ["db2", "u", "Alpha", 1],
        ["db2", "u", "zeta", 2],
    ]


def test_a_channel_its_last_client_left_is_not_listed() -> None:
    runtime = Runtime(Config.default(), {})
    a, b = FakeSubscriber(), FakeSubscriber()
    listen(runtime, "db", "u", a, "one", "two")
    listen(runtime, "db", "u", b, "two")
    pool = runtime.registry.get_pool(DatabaseEntry(name="db"), "u")
    assert pool.board is not None
    pool.board.update(a, frozenset({"one", "two"}), frozenset({"two"}), time.monotonic())
    pool.board.update(b, frozenset({"two"}), frozenset(), time.monotonic())

    assert show_listeners(runtime).rows == [["db", "u", "two", 1]]


def test_no_pools_no_rows() -> None:
    assert show_listeners(Runtime(Config.default(), {})).rows == []
