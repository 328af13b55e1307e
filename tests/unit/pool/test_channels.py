"""ChannelBoard: the union of a pool's channels, confirmations, losses and fan-out."""

from __future__ import annotations

from pgtarn.pool.channels import ChannelBoard, SchemaWatch

from .fakes import FakeLink, FakeSubscriber


def board_and_links() -> tuple[ChannelBoard, list[FakeLink]]:
    """A board whose every opened link is kept in the list."""
    links: list[FakeLink] = []

    def open_link(board: ChannelBoard) -> FakeLink:
        links.append(FakeLink(board))
        return links[-1]

    return ChannelBoard(open_link), links


def channels(*names: str) -> frozenset[str]:
    return frozenset(names)


NOTIFY_A = b"A\x00\x00\x00\x0f\x00\x00\x00\x07a\x00hello\x00"


def test_the_link_listens_to_the_union_of_the_clients_channels() -> None:
    board, links = board_and_links()
    one, two = FakeSubscriber("one"), FakeSubscriber("two")
    assert board.open_links == 0 and board.wanted() == set()
    board.update(one, channels(), channels("a", "b"), 1.0)
    assert len(links) == 1 and board.open_links == 1
    assert links[0].syncs == [{"a", "b"}]
    board.update(two, channels(), channels("b", "c"), 2.0)
    assert board.wanted() == {"a", "b", "c"}
    assert len(links) == 1  # one link per pool
    assert links[0].syncs[-1] == {"a", "b", "c"}
    assert board.subscribers["b"] == {one, two}


def test_a_channel_is_dropped_only_when_its_last_client_leaves() -> None:
    board, links = board_and_links()
    one, two = FakeSubscriber("one"), FakeSubscriber("two")
    board.update(one, channels(), channels("a"), 1.0)
    board.update(two, channels(), channels("a", "b"), 1.0)
    syncs = len(links[0].syncs)
    board.update(one, channels("a"), channels(), 2.0)
    assert board.wanted() == {"a", "b"}
    assert len(links[0].syncs) == syncs  # nothing for the link to change
    board.update(two, channels("a", "b"), channels("b"), 3.0)
    assert board.wanted() == {"b"} and "a" not in board.subscribers
    assert links[0].syncs[-1] == {"b"}
    assert board.empty_since == 0.0
    board.update(two, channels("b"), channels(), 4.0)
    assert board.wanted() == set() and links[0].syncs[-1] == set()
    assert board.empty_since == 4.0
    assert board.open_links == 1  # kept until idle_timeout


def test_a_new_channel_waits_for_the_links_confirmation() -> None:
    board, _links = board_and_links()
    client = FakeSubscriber("c")
    assert not board.update(client, channels(), channels("a", "b"), 1.0)
    assert board.waiters == {client: 1.0}
    board.confirmed("a", True)
    assert client.confirmations == [] and client in board.waiters  # b is not there yet
    board.confirmed("b", True)
    assert client.confirmations == [""] and not board.waiters
    assert board.listened == {"a", "b"}
    # a channel confirmed already needs no waiting
    other = FakeSubscriber("other")
    assert board.update(other, channels(), channels("b"), 2.0)
    assert other.confirmations == [] and not board.waiters


def test_an_unlisten_confirmed_wakes_nobody_and_forgets_the_channel() -> None:
    board, _links = board_and_links()
    one, two = FakeSubscriber("one"), FakeSubscriber("two")
    board.update(one, channels(), channels("a"), 1.0)
    board.confirmed("a", True)
    board.update(one, channels("a"), channels(), 2.0)
    assert not board.update(two, channels(), channels("b"), 2.0)
    board.confirmed("a", False)
    assert board.listened == set() and two.confirmations == []


def test_a_client_that_stops_listening_no_longer_waits() -> None:
    board, _links = board_and_links()
    client = FakeSubscriber("c")
    board.update(client, channels(), channels("a"), 1.0)
    assert client in board.waiters
    assert board.update(client, channels("a"), channels(), 2.0)
    assert not board.waiters
    board.confirmed("a", True)
    assert client.confirmations == []


def test_waiting_clients_are_warned_after_the_wait_limit() -> None:
    board, links = board_and_links()
    early, late = FakeSubscriber("early"), FakeSubscriber("late")
    board.update(early, channels(), channels("a"), 10.0)
    board.update(late, channels(), channels("b"), 12.0)
    board.tick(14.9, 5.0, 0.0)
    assert early.confirmations == [] and late.confirmations == []
    assert links[0].ticks == [14.9]
    board.tick(15.0, 5.0, 0.0)
    (warning,) = early.confirmations
    assert warning and "5 s" in warning
    assert late.confirmations == [] and list(board.waiters) == [late]
    board.tick(17.0, 5.0, 0.0)
    assert late.confirmations == [warning] and not board.waiters
    board.confirmed("a", True)  # confirmed later: the client was told already
    assert early.confirmations == [warning]


def test_a_lost_link_warns_each_listening_client_once_per_loss() -> None:
    board, _links = board_and_links()
    both, one, waiter = FakeSubscriber("both"), FakeSubscriber("one"), FakeSubscriber("w")
    board.update(both, channels(), channels("a", "b"), 1.0)
    board.update(one, channels(), channels("a"), 1.0)
    board.confirmed("a", True)
    board.confirmed("b", True)
    board.update(waiter, channels(), channels("c"), 2.0)  # not confirmed yet
    board.connection_lost()
    # a waiter too: its LISTEN is not answered yet, but it may listen to older channels
    assert (both.losses, one.losses, waiter.losses) == (1, 1, 1)
    assert board.reconnects == 1 and board.lost and board.listened == set()
    board.connection_lost()  # the reconnect failed too: still the same loss
    assert (both.losses, one.losses) == (1, 1) and board.reconnects == 1
    board.connected()
    assert not board.lost and board.listened == set()
    for channel in ("a", "b", "c"):
        board.confirmed(channel, True)
    assert waiter.confirmations == [""]
    assert both.confirmations == [""]  # its first LISTEN's: not waiting since
    board.connection_lost()
    assert (both.losses, one.losses, waiter.losses) == (2, 2, 2)
    assert board.reconnects == 2


def test_a_waiter_that_listened_before_the_loss_is_warned_too() -> None:
    board, _links = board_and_links()
    client = FakeSubscriber("c")
    board.update(client, channels(), channels("a"), 1.0)
    board.confirmed("a", True)  # listening to a, told so
    assert not board.update(client, channels("a"), channels("a", "b"), 2.0)  # waits for b
    board.connection_lost()  # what was NOTIFYed on a from here on is gone
    board.connected()
    board.confirmed("a", True)
    board.confirmed("b", True)
    warnings = client.losses + sum(1 for warning in client.confirmations if warning)
    assert warnings == 1


def test_a_loss_clears_what_was_confirmed_so_new_clients_wait_again() -> None:
    board, _links = board_and_links()
    first, second = FakeSubscriber("first"), FakeSubscriber("second")
    board.update(first, channels(), channels("a"), 1.0)
    board.confirmed("a", True)
    board.connection_lost()
    assert not board.update(second, channels(), channels("a"), 2.0)
    board.connected()
    board.confirmed("a", True)
    assert second.confirmations == [""]


def test_a_notification_goes_to_the_clients_of_its_channel_only() -> None:
    board, _links = board_and_links()
    on_a, on_b, on_both = FakeSubscriber("a"), FakeSubscriber("b"), FakeSubscriber("ab")
    board.update(on_a, channels(), channels("a"), 1.0)
    board.update(on_b, channels(), channels("b"), 1.0)
    board.update(on_both, channels(), channels("a", "b"), 1.0)
    board.notification("a", NOTIFY_A)
    assert on_a.notified == [NOTIFY_A] and on_both.notified == [NOTIFY_A]
    assert on_b.notified == []
    board.notification("nobody", b"A\x00\x00\x00\x0e\x00\x00\x00\x07x\x00\x00")
    assert board.received == 2
    assert on_a.notified == [NOTIFY_A] and on_b.notified == []


def test_a_client_may_leave_its_channel_while_a_notification_is_handed_out() -> None:
    board, _links = board_and_links()

    class Leaver(FakeSubscriber):
        def notify(self, message: bytes) -> None:
            super().notify(message)
            board.update(self, channels("a"), channels(), 2.0)

    leaver, stayer = Leaver("leaver"), FakeSubscriber("stayer")
    board.update(leaver, channels(), channels("a"), 1.0)
    board.update(stayer, channels(), channels("a"), 1.0)
    board.notification("a", NOTIFY_A)
    assert leaver.notified == stayer.notified == [NOTIFY_A]
    assert board.subscribers["a"] == {stayer}


def test_close_ends_the_link_and_a_later_channel_opens_a_new_one() -> None:
    board, links = board_and_links()
    client = FakeSubscriber("c")
    board.update(client, channels(), channels("a"), 1.0)
    board.confirmed("a", True)
    board.close("shutdown")
    assert links[0].closes == ["shutdown"]
    assert board.link is None and board.open_links == 0 and board.listened == set()
    board.update(client, channels("a"), channels("a", "b"), 2.0)
    assert len(links) == 2 and board.open_links == 1 and links[1].syncs == [{"a", "b"}]


def test_a_board_without_an_opener_opens_nothing() -> None:
    board = ChannelBoard(None)
    client = FakeSubscriber("c")
    assert not board.update(client, channels(), channels("a"), 1.0)
    assert board.link is None and board.open_links == 0
    board.tick(2.0, 60.0, 0.0)
    board.close("shutdown")


def test_an_unused_link_is_closed_after_idle_timeout() -> None:
    board, links = board_and_links()
    client = FakeSubscriber("c")
    board.update(client, channels(), channels("a"), 1.0)
    board.tick(500.0, 5.0, 60.0)  # in use: kept however long
    assert links[0].closes == []
    board.update(client, channels("a"), channels(), 100.0)
    board.tick(160.0, 5.0, 60.0)
    assert links[0].closes == [] and board.open_links == 1
    board.tick(160.5, 5.0, 0.0)  # idle_timeout 0: kept
    assert links[0].closes == []
    board.tick(160.5, 5.0, 60.0)
    assert links[0].closes and board.open_links == 0


def test_a_channel_wanted_again_keeps_the_link() -> None:
    board, links = board_and_links()
    client = FakeSubscriber("c")
    board.update(client, channels(), channels("a"), 1.0)
    board.update(client, channels("a"), channels(), 100.0)
    board.update(client, channels(), channels("b"), 150.0)
    board.tick(1000.0, 5.0, 60.0)
    assert links[0].closes == [] and board.open_links == 1


def test_resume_releases_each_client_once_and_restart_moves_the_link() -> None:
    board, links = board_and_links()
    both, one = FakeSubscriber("both"), FakeSubscriber("one")
    board.update(both, channels(), channels("a", "b"), 1.0)
    board.update(one, channels(), channels("b"), 1.0)
    board.resume()
    assert (both.releases, one.releases) == (1, 1)
    board.restart("reconnect requested")
    assert links[0].restarts == ["reconnect requested"]


def test_pause_holds_the_link_and_resume_releases_it() -> None:
    """PAUSE/SUSPEND stop the link reading (notifications wait in PostgreSQL's queue, not in
    the clients' bounded ones); RESUME reads again and clients send what they held."""
    board, links = board_and_links()
    client = FakeSubscriber("c")
    board.update(client, channels(), channels("a"), 1.0)
    link = links[0]
    board.hold(True)
    assert link.held == [True] and board.held
    board.resume()
    assert link.held == [True, False] and not board.held
    assert client.releases == 1


def test_a_schema_watch_keeps_the_link_and_hears_each_change_and_each_loss() -> None:
    board, links = board_and_links()
    changes: list[int] = []
    watch = SchemaWatch("pgtarn_schema", lambda: changes.append(1))
    board.update(watch, channels(), channels("pgtarn_schema"), 1.0)
    assert len(links) == 1 and board.wanted() == {"pgtarn_schema"}
    board.notification("pgtarn_schema", NOTIFY_A)
    board.notification("other", NOTIFY_A)
    assert changes == [1]
    board.connection_lost()  # notifications may have been missed meanwhile
    assert changes == [1, 1]
    board.tick(1000.0, 5.0, 1.0)  # never idle: the watch still wants its channel
    assert board.link is links[0]
