"""LISTEN and UNLISTEN answered by pgtarn for a pooled client; its notifications delivered."""

from __future__ import annotations

import dataclasses
from typing import cast

from pgtarn.client.connection import ClientConnection
from pgtarn.client.listening import ClientListen, local_batch
from pgtarn.client.parsers import effects_of
from pgtarn.config.inifile import parse_config
from pgtarn.errors import PgtarnError
from pgtarn.pool.channels import ChannelBoard
from pgtarn.pool.pool import Pool as PoolOf
from pgtarn.proto import build
from pgtarn.proto.framing import split_messages
from pgtarn.proto.messages import parse_fields
from pgtarn.runtime import Runtime
from pgtarn.server.connection import ServerConnection
from pgtarn.server.login import server_login_for
from pgtarn.session.effects import as_subscriptions
from pgtarn.session.tracking import SessionState, SessionTracker
from pgtarn.views.states import ClientState

from ..pool.fakes import FakeLink
from .pair import INI, ClientSide, Pool, result, sent, types

LISTEN_COMPLETE = build.command_complete("LISTEN")
UNLISTEN_COMPLETE = build.command_complete("UNLISTEN")


def notification(channel: str, payload: str = "hi", pid: int = 99) -> bytes:
    return build.message(b"A", pid.to_bytes(4, "big") + build.cstr(channel) + build.cstr(payload))


class Listening:
    """A transaction-mode pool (pair.Pool) whose listener connection is a FakeLink."""

    def __init__(self, mode: str = "transaction", prepared: int = 0) -> None:
        self.pool = Pool(mode=mode, prepared=prepared)
        self.links: list[FakeLink] = []
        self.pool.runtime.registry.open_listener = self._open

    def _open(self, pool: object, db: object, board: ChannelBoard) -> FakeLink:
        self.links.append(FakeLink(board))
        return self.links[-1]

    def client(self) -> tuple[ClientConnection, ClientSide, ServerConnection]:
        client, transport = self.pool.client()
        return client, transport, self.pool.servers[0]

    @property
    def board(self) -> ChannelBoard:
        (link,) = self.links
        return link.board


def statuses(data: bytes) -> list[bytes]:
    """The status of each ReadyForQuery in data."""
    return [body for msg_type, body in split_messages(data) if msg_type == ord("Z")]


def run(client: ClientConnection, server: ServerConnection, sql: str, reply: bytes) -> None:
    """A query that goes to the server, answered with reply."""
    client.data_received(build.query(sql))
    assert sent(server) == build.query(sql)
    server.data_received(reply)


def begin(client: ClientConnection, server: ServerConnection) -> None:
    run(client, server, "BEGIN", build.command_complete("BEGIN") + build.ready_for_query(b"T"))


def test_a_client_holds_no_listen_state_until_it_listens() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    run(client, server, "select 1", result())
    assert transport.take() == result()
    run(
        client,
        server,
        "SET search_path = a",
        build.command_complete("SET") + build.ready_for_query(b"I"),
    )
    assert client.tracked and client.listen is None and client.subscribed == frozenset()
    client.data_received(build.query("LISTEN a"))
    assert client.listen is not None and client.listen.holds_anything()
    setup.board.confirmed("a", True)
    assert client.subscribed == {"a"}


def test_a_listen_is_answered_here_and_its_ready_for_query_waits_for_the_listener() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    client.data_received(build.query("LISTEN a"))
    assert transport.take() == LISTEN_COMPLETE  # the ReadyForQuery waits for the listener
    assert sent(server) == b""  # never reaches a server
    assert setup.board.wanted() == {"a"} and setup.links[0].syncs == [{"a"}]
    client.data_received(build.query("select 1"))  # sent meanwhile: waits too
    assert sent(server) == b"" and transport.take() == b""
    setup.board.confirmed("a", True)
    assert transport.take() == build.ready_for_query(b"I")
    assert sent(server) == build.query("select 1")
    server.data_received(result())
    assert transport.take() == result() and client.server is None
    assert not client.pinned


def test_a_channel_confirmed_already_is_answered_at_once() -> None:
    setup = Listening()
    first, first_side, _server = setup.client()
    first.data_received(build.query("LISTEN a"))
    setup.board.confirmed("a", True)
    first_side.take()
    second, second_side = setup.pool.client()
    second.data_received(build.query("LISTEN a; LISTEN a"))
    assert second_side.take() == LISTEN_COMPLETE * 2 + build.ready_for_query(b"I")
    assert setup.board.subscribers["a"] == {first.listen, second.listen}


def test_unlisten_is_answered_at_once_and_the_last_client_ends_the_channel() -> None:
    setup = Listening()
    client, transport, _server = setup.client()
    client.data_received(build.query("LISTEN a; LISTEN b"))
    setup.board.confirmed("a", True)
    setup.board.confirmed("b", True)
    transport.take()
    client.data_received(build.query("UNLISTEN a"))
    assert transport.take() == UNLISTEN_COMPLETE + build.ready_for_query(b"I")
    assert setup.board.wanted() == {"b"}
    client.data_received(build.query("LISTEN c; UNLISTEN *"))
    assert transport.take() == (LISTEN_COMPLETE + UNLISTEN_COMPLETE + build.ready_for_query(b"I"))
    assert setup.board.wanted() == set() and client.subscribed == frozenset()


def test_in_a_transaction_the_reply_has_its_status_and_the_channel_counts_from_commit() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    begin(client, server)
    transport.take()
    client.data_received(build.query("LISTEN a"))
    assert transport.take() == LISTEN_COMPLETE + build.ready_for_query(b"T")
    assert sent(server) == b"" and setup.links == []  # nothing committed yet
    run(client, server, "COMMIT", build.command_complete("COMMIT") + build.ready_for_query(b"I"))
    assert setup.board.wanted() == {"a"}
    assert transport.take() == build.command_complete("COMMIT")  # its ReadyForQuery waits
    setup.board.confirmed("a", True)
    assert transport.take() == build.ready_for_query(b"I")


def test_a_listen_in_a_rolled_back_transaction_is_forgotten() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    begin(client, server)
    client.data_received(build.query("LISTEN a"))
    run(
        client, server, "ROLLBACK", build.command_complete("ROLLBACK") + build.ready_for_query(b"I")
    )
    assert statuses(transport.take()) == [b"T", b"T", b"I"]
    assert setup.links == [] and client.subscribed == frozenset()


def test_in_a_failed_transaction_a_listen_fails_as_any_statement() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    begin(client, server)
    run(
        client,
        server,
        "select 1/0",
        build.error_response("22012", "division by zero") + build.ready_for_query(b"E"),
    )
    transport.take()
    client.data_received(build.query("LISTEN a"))
    out = transport.take()
    assert types(out) == "EZ" and statuses(out) == [b"E"]
    assert parse_fields(split_messages(out)[0][1])["C"] == "25P02"
    assert sent(server) == b""
    run(client, server, "COMMIT", build.command_complete("ROLLBACK") + build.ready_for_query(b"I"))
    assert statuses(transport.take()) == [b"I"] and setup.links == []


def test_pipelined_queries_get_their_replies_in_order() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    client.data_received(build.query("select 1") + build.query("LISTEN a"))
    assert transport.take() == b"" and sent(server) == build.query("select 1")
    server.data_received(result())
    # the LISTEN's reply right after the select's, its ReadyForQuery waiting for the listener
    assert transport.take() == result() + LISTEN_COMPLETE
    setup.board.confirmed("a", True)
    assert transport.take() == build.ready_for_query(b"I")


def test_a_listen_sent_while_a_ready_for_query_is_withheld_is_answered_after_it() -> None:
    setup = Listening()
    client, transport, _server = setup.client()
    client.data_received(build.query("LISTEN a"))
    client.data_received(build.query("LISTEN b"))
    assert transport.take() == LISTEN_COMPLETE
    setup.board.confirmed("a", True)
    assert transport.take() == build.ready_for_query(b"I") + LISTEN_COMPLETE
    setup.board.confirmed("b", True)
    assert transport.take() == build.ready_for_query(b"I")


def test_a_listen_not_confirmed_in_time_is_answered_with_a_warning() -> None:
    setup = Listening()
    client, transport, _server = setup.client()
    client.data_received(build.query("LISTEN a"))
    transport.take()
    assert client.listen is not None
    since = setup.board.waiters[client.listen]  # (its LISTEN state is the subscriber)
    setup.board.tick(since + 100, 5.0, 0.0)
    out = transport.take()
    assert types(out) == "NZ"
    notice = parse_fields(split_messages(out)[0][1])
    assert notice["S"] == "WARNING" and notice["M"]


def test_a_notification_to_an_idle_client_is_written_at_once() -> None:
    setup = Listening()
    client, transport, _server = setup.client()
    client.data_received(build.query("LISTEN a"))
    setup.board.confirmed("a", True)
    transport.take()
    message = notification("a", "payload")
    setup.board.notification("a", message)
    assert transport.take() == message
    assert setup.board.delivered == 1 and setup.board.queued == 0
    setup.board.notification("b", notification("b"))  # not ours
    assert transport.take() == b""


def test_a_notification_to_a_linked_client_waits_for_an_idle_ready_for_query() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    client.data_received(build.query("LISTEN a"))
    setup.board.confirmed("a", True)
    begin(client, server)
    transport.take()
    message = notification("a")
    setup.board.notification("a", message)
    assert transport.take() == b"" and setup.board.queued == 1
    run(client, server, "select 1", result(b"T"))
    assert transport.take() == result(b"T")  # still in the transaction block
    run(client, server, "COMMIT", build.command_complete("COMMIT") + build.ready_for_query(b"I"))
    assert transport.take() == (
        build.command_complete("COMMIT") + build.ready_for_query(b"I") + message
    )
    assert setup.board.delivered == 1 and setup.board.queued == 0


def test_a_notification_to_a_client_whose_ready_for_query_is_withheld_follows_it() -> None:
    setup = Listening()
    client, transport, _server = setup.client()
    client.data_received(build.query("LISTEN a"))
    transport.take()
    message = notification("a")
    setup.board.notification("a", message)  # (sent by a backend that LISTENed already)
    assert transport.take() == b"" and setup.board.queued == 1
    setup.board.confirmed("a", True)
    assert transport.take() == build.ready_for_query(b"I") + message


def test_notifications_are_held_while_the_pool_is_paused() -> None:
    setup = Listening()
    client, transport, _server = setup.client()
    client.data_received(build.query("LISTEN a"))
    setup.board.confirmed("a", True)
    transport.take()
    pool = client.pool
    assert pool is not None
    pool.pause()
    message = notification("a")
    setup.board.notification("a", message)
    assert transport.take() == b""
    pool.resume()
    assert transport.take() == message


def test_a_lost_listener_connection_warns_an_idle_client() -> None:
    setup = Listening()
    client, transport, _server = setup.client()
    client.data_received(build.query("LISTEN a"))
    setup.board.confirmed("a", True)
    transport.take()
    setup.board.connection_lost()
    out = transport.take()
    assert types(out) == "N"
    assert parse_fields(split_messages(out)[0][1])["S"] == "WARNING"


def test_past_listen_queue_size_the_client_is_closed_with_53400() -> None:
    setup = Listening()
    runtime = setup.pool.runtime
    runtime.config = dataclasses.replace(runtime.config, listen_queue_size=2)
    client, transport, server = setup.client()
    client.data_received(build.query("LISTEN a"))
    setup.board.confirmed("a", True)
    begin(client, server)
    transport.take()
    for _ in range(2):
        setup.board.notification("a", notification("a"))
    assert transport.take() == b"" and not transport.closing
    setup.board.notification("a", notification("a"))
    out = transport.take()
    assert types(out) == "E" and transport.closing
    fields = parse_fields(split_messages(out)[0][1])
    assert (fields["S"], fields["C"]) == ("FATAL", "53400")
    assert setup.board.dropped == 3 and setup.board.queued == 0
    assert setup.board.wanted() == set()


def test_a_client_that_leaves_leaves_its_channels_and_the_waiters() -> None:
    setup = Listening()
    client, _transport, _server = setup.client()
    client.data_received(build.query("LISTEN a"))
    assert client.listen is not None and client.listen in setup.board.waiters
    client.data_received(build.TERMINATE)
    assert client.state is ClientState.CLOSED
    assert setup.board.wanted() == set() and not setup.board.waiters
    assert setup.links[0].syncs[-1] == set()


def test_with_prepared_statements_a_listen_is_answered_here_too() -> None:
    setup = Listening(prepared=10)
    client, transport, server = setup.client()
    client.data_received(build.parse("s", "select 1") + build.SYNC)
    sent(server)
    server.data_received(build.message(b"1") + build.ready_for_query(b"I"))
    transport.take()
    client.data_received(build.query("LISTEN a"))  # one whole Query
    assert transport.take() == LISTEN_COMPLETE and sent(server) == b""
    setup.board.confirmed("a", True)
    assert transport.take() == build.ready_for_query(b"I")
    # in a chunk with other messages: the framer drops it, its reply in its place
    client.data_received(
        build.query("LISTEN b") + build.bind("", "s", []) + build.execute() + build.SYNC
    )
    assert transport.take() == LISTEN_COMPLETE + build.ready_for_query(b"I")
    assert types(sent(server)) == "BES"
    server.data_received(build.message(b"2") + result())
    assert transport.take() == build.message(b"2") + result()[:-6]  # withheld for b
    setup.board.confirmed("b", True)
    assert transport.take() == build.ready_for_query(b"I")


def test_statement_mode_answers_listen_too() -> None:
    setup = Listening(mode="statement")
    client, transport, server = setup.client()
    client.data_received(build.query("LISTEN a"))
    setup.board.confirmed("a", True)
    assert transport.take() == LISTEN_COMPLETE + build.ready_for_query(b"I")
    assert sent(server) == b""


def test_a_listen_mixed_with_other_statements_runs_on_the_server_and_pins() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    run(client, server, "LISTEN a; select 1", build.command_complete("LISTEN") + result())
    assert client.pin_reasons() == ["listen"] and setup.links == []
    transport.take()
    # from now on its LISTENs go to its server, which delivers their notifications
    run(client, server, "LISTEN b", LISTEN_COMPLETE + build.ready_for_query(b"I"))
    assert transport.take() == LISTEN_COMPLETE + build.ready_for_query(b"I")
    assert setup.links == []


def test_discard_all_or_unlisten_on_the_server_ends_the_listeners_channels() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    client.data_received(build.query("LISTEN a; LISTEN b"))
    setup.board.confirmed("a", True)
    setup.board.confirmed("b", True)
    run(client, server, "UNLISTEN a; select 1", build.command_complete("UNLISTEN") + result())
    assert setup.board.wanted() == {"b"} and not client.pinned
    run(
        client,
        server,
        "DISCARD ALL",
        build.command_complete("DISCARD ALL") + build.ready_for_query(b"I"),
    )
    assert setup.board.wanted() == set() and client.subscribed == frozenset()
    assert statuses(transport.take()) == [b"I"] * 3


def test_a_listen_cut_across_chunks_sends_nothing_to_a_server() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    listen = build.query("LISTEN a")
    client.data_received(listen[:7])
    client.data_received(listen[7:])
    assert sent(server) == b""
    assert transport.take() == LISTEN_COMPLETE


def test_a_pinned_clients_listen_waits_for_the_listener_too() -> None:
    setup = Listening()
    client, transport, server = setup.client()
    run(client, server, "select pg_advisory_lock(1)", result())
    assert client.pinned
    transport.take()
    client.data_received(build.query("LISTEN a"))
    assert transport.take() == LISTEN_COMPLETE


def test_statement_mode_refuses_a_begin_after_the_withheld_ready_for_query() -> None:
    """The BEGIN waits behind the LISTEN's withheld ReadyForQuery, goes to a server, and
    its transaction status ends the client: the replies come in order, the error last."""
    setup = Listening(mode="statement")
    client, transport, server = setup.client()
    client.data_received(build.query("LISTEN a"))
    client.data_received(build.query("BEGIN"))
    assert types(transport.take()) == "C"
    setup.board.confirmed("a", True)
    assert types(transport.take()) == "Z"
    assert sent(server) == build.query("BEGIN")
    server.data_received(build.command_complete("BEGIN") + build.ready_for_query(b"T"))
    replies = transport.take()
    assert types(replies) == "E"
    assert parse_fields(list(split_messages(replies))[-1][1])["M"] == (
        "transaction blocks not allowed in statement pooling mode"
    )
    assert transport.closing


# --- ClientListen alone, for a stand-in connection (interfaces.ListenClient) ------------------


class Connection:
    """What a LISTEN state needs of its connection, and a record of what it asked (its pool
    and the server it may be linked to are real: compiled, the state checks their types)."""

    def __init__(self, listen_queue_size: int = 1000) -> None:
        config = parse_config(
            INI.format(mode="transaction", pool_size=1, prepared=0)
            + f"listen_queue_size = {listen_queue_size}\n"
        )
        self.runtime = Runtime(config, {"u": ""})
        db = config.find_database("app")
        assert db is not None
        self.pool = cast(PoolOf[ServerConnection], self.runtime.registry.get_pool(db, "u"))
        self.board = self.pool.board = ChannelBoard(None)
        self.linked = ServerConnection(
            self.runtime, self.pool, db, server_login_for(self.runtime, self.pool, db)
        )
        self.state = ClientState.READY
        self.expected = 0
        self.listening = False
        self.tracked = True
        self.write_paused = False
        self.server: ServerConnection | None = None
        self.session: SessionTracker | None = None
        self.pending: list[bytes] = []
        self.out = bytearray()
        self.closed: list[PgtarnError] = []
        self.sent_pending = 0
        self.link_ends: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out += data

    def close_flushing(self, error: PgtarnError, grace: float) -> None:
        self.closed.append(error)

    def _close_after(self, server: ServerConnection | None, error: PgtarnError) -> None:
        self.closed.append(error)

    def _session_made(self) -> SessionTracker:
        if self.session is None:
            self.session = SessionTracker(SessionState())
        return self.session

    def _session_ready(self, status: bytes) -> bool:
        return True

    def _status_now(self) -> bytes:
        return b"I"

    def _send_pending(self) -> None:
        self.sent_pending += 1

    def _link_ends(self, server: ServerConnection, status: bytes) -> bytes | None:
        self.link_ends.append(status)
        return None


def alone(listen_queue_size: int = 1000) -> tuple[ClientListen, Connection]:
    connection = Connection(listen_queue_size)
    return ClientListen(connection), connection


def test_alone_a_notification_goes_out_at_once_to_an_idle_client() -> None:
    listen, connection = alone()
    listen.notify(notification("a"))
    assert bytes(connection.out) == notification("a") and connection.board.delivered == 1


def test_alone_notifications_wait_for_a_linked_client_and_go_when_released() -> None:
    listen, connection = alone()
    connection.server = connection.linked
    listen.notify(notification("a"))
    listen.listener_lost()
    assert connection.out == b"" and connection.listening and connection.board.queued == 2
    connection.server = None
    listen.release_notifications()
    assert bytes(connection.out).startswith(notification("a"))
    assert connection.board.queued == 0 and connection.board.delivered == 1


def test_alone_a_paused_pool_holds_them() -> None:
    listen, connection = alone()
    connection.pool.paused = True  # (as PAUSE leaves it)
    listen.notify(notification("a"))
    assert connection.out == b"" and listen.notify_queue == [notification("a")]


def test_alone_past_listen_queue_size_the_client_is_closed() -> None:
    listen, connection = alone(listen_queue_size=2)
    connection.server = connection.linked
    for _ in range(3):
        listen.notify(notification("a"))
    (error,) = connection.closed
    assert error.sqlstate == "53400" and connection.board.dropped == 3
    assert listen.notify_queue == [] and connection.board.queued == 0


def test_alone_a_channel_not_confirmed_withholds_the_ready_for_query() -> None:
    listen, connection = alone()
    listen.subscribe(frozenset({"a"}))
    assert listen.wait and connection.listening and listen in connection.board.waiters
    ready = build.ready_for_query(b"I")
    assert listen.after_reply(LISTEN_COMPLETE + ready, b"I") == LISTEN_COMPLETE
    assert listen.withheld == ready and listen.holds_anything()
    connection.board.confirmed("a", True)  # the board tells the state itself
    assert not listen.wait and bytes(connection.out) == ready
    assert connection.sent_pending == 1


def test_alone_a_state_that_stops_leaves_the_board() -> None:
    listen, connection = alone()
    listen.subscribe(frozenset({"a"}))
    connection.server = connection.linked
    listen.notify(notification("a"))
    listen.stop()
    assert connection.board.wanted() == set() and not connection.board.waiters
    assert connection.board.dropped == 1 and listen.subscribed == frozenset()


def test_alone_a_listen_owed_after_a_ready_for_query_goes_after_it() -> None:
    listen, connection = alone()
    connection.expected = 2  # the LISTEN's own ReadyForQuery and one before it
    listen.answers.append([1, None, LISTEN_COMPLETE, True])
    listen.answer_now()
    assert connection.out == b""  # one ReadyForQuery is owed before it
    listen.answers[0][0] -= 1
    assert listen.answers_due(b"I") == LISTEN_COMPLETE + build.ready_for_query(b"I")
    assert connection.expected == 1


def test_local_batch_reads_a_listen_statement_alone() -> None:
    parse = build.message(b"P", b"s1\x00LISTEN a\x00\x00\x00")
    describe = build.message(b"D", b"Ss1\x00")
    sync = build.message(b"S")
    batch = local_batch(parse + describe + sync, None)
    assert batch is not None
    used, parsed, replies, synced, known = batch
    assert used == len(parse + describe + sync) and synced and parsed is None
    assert types(replies) == "1tn" and known is not None and b"s1" in known
    assert local_batch(parse + describe, None) == (0, None, b"", False, None)  # not whole
    select = build.message(b"P", b"\x00SELECT 1\x00\x00\x00")
    assert local_batch(select + sync, None) is None


def test_alone_a_reply_owed_goes_right_after_the_ready_for_query_before_it() -> None:
    """Its connection's ReadyForQuery while a LISTEN's reply is owed one ReadyForQuery from
    now: that ReadyForQuery, then the reply (CommandComplete, ReadyForQuery); then, owed
    nothing more, the link may end; the connection no longer needs a look."""
    listen, connection = alone()
    connection.server = connection.linked
    connection.expected = 1  # the LISTEN's own ReadyForQuery (the server's was counted)
    listen.answers.append([1, as_subscriptions(effects_of("LISTEN a")), None, True])
    connection.listening = True
    out = listen.ready_for_query(connection.linked, b"I")
    ready = build.ready_for_query(b"I")
    assert out == ready + LISTEN_COMPLETE + ready
    assert listen.answers == [] and connection.expected == 0
    assert connection.link_ends == [b"I"] and not connection.listening


def test_alone_a_ready_for_query_with_replies_still_owed_keeps_the_link() -> None:
    listen, connection = alone()
    connection.expected = 2
    listen.answers.append([2, as_subscriptions(effects_of("LISTEN a")), None, True])
    connection.listening = True
    assert listen.ready_for_query(connection.linked, b"I") == build.ready_for_query(b"I")
    assert listen.answers[0][0] == 1 and connection.link_ends == [] and connection.listening
