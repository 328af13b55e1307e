"""Large client messages stream through pgtarn: its memory stays bounded, the answers right.

The RSS checks read the pgtarn process's peak resident size (VmHWM, reset once the pool is
warm) against its size before: memory, not timing, and with a generous margin.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from .drivers import connect
from .pgstat import wait_until
from .rawpg import error_fields
from .test_admin import admin, show
from .test_timeouts import raw_login

pytestmark = pytest.mark.integration

MB = 1024 * 1024
#: What pgtarn's peak may rise over its size before the traffic: the per-client bound
#: (message_buffer_size, 256 KiB by default) for a few clients, plus the interpreter's own
#: churn, with a generous margin.
RSS_MARGIN_KB = 32 * 1024


def status_kb(proc: Any, field: str) -> int:
    with open(f"/proc/{proc.proc.pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def reset_peak(proc: Any) -> int:
    """Reset the process's peak RSS (Linux: clear_refs 5) and return its RSS now."""
    with open(f"/proc/{proc.proc.pid}/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")
    return status_kb(proc, "VmRSS")


def warm(proc: Any) -> None:
    """Every pool server connected and the session-state parser loaded, as in a running
    pgtarn, so that what the test measures is the traffic."""
    conns = [connect(proc, autocommit=True) for _ in range(3)]
    try:
        for conn in conns:
            conn.execute("BEGIN")
            conn.execute("SET LOCAL statement_timeout = '1min'")
        for conn in conns:
            conn.execute("COMMIT")
        conns[0].execute("SELECT length(%s::bytea)", (b"x" * 1000,))
    finally:
        for conn in conns:
            conn.close()


def in_threads(work: Callable[[int], object], count: int = 3) -> list[object]:
    """Run work(0..count-1) in threads at once; their results (an exception re-raised)."""
    results: list[object] = [None] * count
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = work(index)
        except BaseException as exc:  # (re-raised in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def payload(index: int, size: int) -> bytes:
    """size bytes, different for each client (a mix-up between clients shows in the hash)."""
    block = hashlib.sha256(bytes([index])).hexdigest().encode() * (size // 64 + 1)
    return block[:size]


def test_large_binds_three_clients_memory_bounded(pgtarn_factory: Any) -> None:
    """Three psycopg clients each bind a 64 MB parameter (extended protocol) at once."""
    proc = pgtarn_factory()
    warm(proc)
    start = reset_peak(proc)

    def bind(index: int) -> tuple[int, str]:
        data = payload(index, 64 * MB)
        with connect(proc, autocommit=True) as conn:
            row = conn.execute("SELECT length(%s::bytea), md5(%s::bytea)", (data, data)).fetchone()
            assert row is not None
            return row[0], row[1]

    results = in_threads(bind)
    for index, result in enumerate(results):
        expected = payload(index, 64 * MB)
        assert result == (len(expected), hashlib.md5(expected).hexdigest())
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


def test_large_queries_three_clients_memory_bounded(pgtarn_factory: Any) -> None:
    """Three simple Queries with a 64 MB literal each, at once; nothing held afterwards."""
    proc = pgtarn_factory()
    warm(proc)
    start = reset_peak(proc)

    def query(index: int) -> str:
        text = payload(index, 64 * MB).decode()
        with connect(proc, autocommit=True) as conn:
            row = conn.execute(f"SELECT md5('{text}')".encode()).fetchone()  # simple Query
            assert row is not None
            return str(row[0])

    results = in_threads(query)
    for index, result in enumerate(results):
        assert result == hashlib.md5(payload(index, 64 * MB)).hexdigest()
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"
    held = status_kb(proc, "VmRSS")
    assert held - start <= RSS_MARGIN_KB, f"pgtarn holds {(held - start) // 1024} MB afterwards"


def test_large_query_session_mode_memory_bounded(pgtarn_factory: Any) -> None:
    """Session mode reads no texts, and still must not hold a large Query whole."""
    proc = pgtarn_factory(settings={"pool_mode": "session"})
    warm(proc)
    start = reset_peak(proc)
    text = payload(7, 64 * MB).decode()
    with connect(proc, autocommit=True) as conn:
        row = conn.execute(f"SELECT md5('{text}')".encode()).fetchone()
    assert row == (hashlib.md5(text.encode()).hexdigest(),)
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


def test_set_at_the_end_of_a_10mb_query_is_tracked(pgtarn_factory: Any) -> None:
    """A SET after thousands of statements in one 10 MB Query follows its client to other
    servers, and no other client sees it."""
    proc = pgtarn_factory()
    warm(proc)
    start = reset_peak(proc)
    filler = "SELECT '" + "x" * 1000 + "';"
    text = filler * (10 * MB // len(filler)) + "SET application_name = 'tail_of_big'"
    with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
        conn.execute(text.encode())  # simple Query: several statements
        peak = status_kb(proc, "VmHWM")
        # the other client takes a server (the one just used, if it went back) and keeps it
        other.execute("BEGIN")
        assert other.execute("SHOW application_name").fetchone() != ("tail_of_big",)
        assert conn.execute("SHOW application_name").fetchone() == ("tail_of_big",)
        other.execute("COMMIT")
        for _ in range(3):
            assert other.execute("SHOW application_name").fetchone() != ("tail_of_big",)
            assert conn.execute("SHOW application_name").fetchone() == ("tail_of_big",)
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


def test_words_of_state_inside_a_10mb_literal_do_not_pin(pgtarn_factory: Any) -> None:
    """A 10 MB literal of data holding "SET" and "COMMIT" (a simple Query read in pieces):
    the literal runs nothing, so its client keeps pooling; a SET after the literal still
    pins it."""
    proc = pgtarn_factory()
    text = "SET application_name = x; COMMIT; /* */ " * (10 * MB // 40)
    with connect(proc, autocommit=True) as conn:
        row = conn.execute(f"SELECT length($q${text}$q$), md5('{text}')".encode()).fetchone()
        assert row == (len(text), hashlib.md5(text.encode()).hexdigest())
        with admin(proc) as console:
            assert [r["pinned"] for r in show(console, "CLIENTS") if r["pinned"]] == []
        conn.execute(f"SELECT length('{text}'); SET application_name = 'after'".encode())
        with admin(proc) as console:
            assert [r["pinned"] for r in show(console, "CLIENTS") if r["pinned"]] == ["untracked"]
        assert conn.execute("SHOW application_name").fetchone() == ("after",)


def linked_server(proc: Any) -> dict[str, Any] | None:
    """The one server linked to a client (SHOW SERVERS' link set), if any."""
    with admin(proc) as console:
        linked = [row for row in show(console, "SERVERS") if row["link"]]
    return linked[0] if len(linked) == 1 else None


def backend_pids(proc: Any) -> set[int]:
    with admin(proc) as console:
        return {int(row["remote_pid"]) for row in show(console, "SERVERS")}


def test_client_gone_mid_message_closes_its_server(pgtarn_factory: Any) -> None:
    """A client that sent part of a 50 MB Query and vanished: the server it was streaming to
    is closed (never lent half-way through a message), and the others are served."""
    proc = pgtarn_factory()
    warm(proc)
    raw = raw_login(proc)
    body = b"SELECT length('" + b"y" * (50 * MB) + b"')\x00"
    message = b"Q" + struct.pack("!I", len(body) + 4) + body
    raw.send(message[: 2 * MB])
    found: list[dict[str, Any]] = []

    def streaming() -> bool:
        row = linked_server(proc)
        if row is not None:
            found.append(row)
        return row is not None

    wait_until(streaming, timeout=10, what="a server linked to the client mid-message")
    pid = int(found[0]["remote_pid"])
    raw.close()
    wait_until(lambda: pid not in backend_pids(proc), timeout=10, what="its server closed")
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("SELECT 42").fetchone() == (42,)


def test_message_past_max_packet_size_refused(pgtarn_factory: Any) -> None:
    """A Query longer than max_packet_size: 08P01 and the client closed; others served."""
    proc = pgtarn_factory(settings={"max_packet_size": 4 * MB})
    other = connect(proc, autocommit=True)
    other.execute("SELECT 1")
    raw = raw_login(proc)
    body = b"SELECT length('" + b"z" * (5 * MB) + b"')\x00"
    raw.send(b"Q" + struct.pack("!I", len(body) + 4) + body[:MB])
    msg_type, reply = raw.read_message()
    assert msg_type == "E" and error_fields(reply)["C"] == "08P01", (msg_type, reply)
    with pytest.raises(ConnectionError):
        raw.read_message()
    raw.close()
    assert other.execute("SELECT 7").fetchone() == (7,)
    other.close()
    with connect(proc, autocommit=True) as conn:  # a Query just under the limit passes
        text = "w" * (4 * MB - 100)
        assert conn.execute(f"SELECT length('{text}')".encode()).fetchone() == (len(text),)


@pytest.mark.parametrize("settings", [{}, {"pool_mode": "session"}, {"max_prepared_statements": 0}])
def test_large_bind_of_a_prepared_statement(pgtarn_factory: Any, settings: dict[str, Any]) -> None:
    """A named (prepared) statement bound with a 32 MB parameter, again and again: its name
    rewritten in the head of a Bind that is never held whole, in each way a Bind goes."""
    proc = pgtarn_factory(settings=settings)
    warm(proc)
    start = reset_peak(proc)
    with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
        for index in range(3):
            data = payload(index, 32 * MB)
            row = conn.execute("SELECT md5(%s::bytea)", (data,), prepare=True).fetchone()
            assert row == (hashlib.md5(data).hexdigest(),)
            other.execute("SELECT 1")  # (a server taken in between: the next is another)
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


def test_large_copy_data(pgtarn_factory: Any) -> None:
    """COPY FROM STDIN with 16 MB rows (CopyData messages that long): all of them arrive."""
    proc = pgtarn_factory()
    warm(proc)
    start = reset_peak(proc)
    with connect(proc, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE big_rows (t text)")
        with conn.cursor() as cur, cur.copy("COPY big_rows FROM STDIN") as copy:
            for index in range(3):
                copy.write(payload(index, 16 * MB) + b"\n")
        row = conn.execute("SELECT count(*), sum(length(t)) FROM big_rows").fetchone()
    assert row == (3, 48 * MB)
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


@pytest.mark.parametrize("settings", [{"pool_mode": "session"}, {"max_prepared_statements": 0}])
def test_large_error_response_memory_bounded(pgtarn_factory: Any, settings: dict[str, Any]) -> None:
    """A 48 MB ErrorResponse on its way back: passed on as it comes, read by its head only
    (its SQLSTATE and severity still seen), nothing of it held whole."""
    proc = pgtarn_factory(settings=settings)
    warm(proc)
    start = reset_peak(proc)
    with connect(proc, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.RaiseException) as raised:
            conn.execute("DO $$ BEGIN RAISE EXCEPTION '%', repeat('e', 48 * 1024 * 1024); END $$")
        assert len(str(raised.value.diag.message_primary)) == 48 * MB
        assert conn.execute("SELECT 5").fetchone() == (5,)
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


def test_large_named_statements_three_clients_memory_bounded(pgtarn_factory: Any) -> None:
    """Three psycopg clients each prepare a 40 MB named statement (transaction mode, with
    max_prepared_statements) and run it twice, at once: the Parse is passed on in pieces
    and its client pinned to its server; other clients are served all along."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    warm(proc)
    start = reset_peak(proc)

    def prepare(index: int) -> list[tuple[str, int]]:
        text = payload(index, 40 * MB).decode()
        rows = []
        with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
            for number in (index, index + 10):
                sql = f"SELECT md5('{text}'), %s::int"
                row = conn.execute(sql.encode(), (number,), prepare=True).fetchone()
                assert row is not None
                rows.append((str(row[0]), int(row[1])))
                assert other.execute("SELECT %s::int", (number,)).fetchone() == (number,)
        return rows

    results = in_threads(prepare)
    for index, result in enumerate(results):
        digest = hashlib.md5(payload(index, 40 * MB)).hexdigest()
        assert result == [(digest, index), (digest, index + 10)]
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("SELECT 42").fetchone() == (42,)


def test_sql_execute_with_a_large_literal_three_clients(pgtarn_factory: Any) -> None:
    """Three clients each EXECUTE a SQL-level prepared statement with a 40 MB literal, twice,
    at once (transaction mode, with max_prepared_statements): the name, in the Query's
    head, is rewritten for whichever server runs it and the rest streams through, never
    held whole; the client is not pinned, and other clients are served in between."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    warm(proc)
    start = reset_peak(proc)

    def execute(index: int) -> list[str]:
        text = payload(index, 40 * MB).decode()
        digests = []
        with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
            conn.execute(f"PREPARE big_md5_{index}(text) AS SELECT md5($1)")
            for number in range(2):
                row = conn.execute(f"EXECUTE big_md5_{index}('{text}')".encode()).fetchone()
                assert row is not None
                digests.append(str(row[0]))
                assert other.execute("SELECT %s::int", (number,)).fetchone() == (number,)
            conn.execute(f"DEALLOCATE big_md5_{index}")
        return digests

    results = in_threads(execute)
    for index, result in enumerate(results):
        digest = hashlib.md5(payload(index, 40 * MB)).hexdigest()
        assert result == [digest, digest]
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


def test_large_queries_naming_statements_in_literals_memory_bounded(pgtarn_factory: Any) -> None:
    """Three simple Queries of 40 MB at once whose first 8 KiB hold EXECUTE, PREPARE and
    DISCARD ALL in a literal (transaction mode, with max_prepared_statements): they name
    nothing, so they are passed on as they come, never held whole."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    warm(proc)
    start = reset_peak(proc)

    def query(index: int) -> str:
        text = "execute x; prepare y as z; discard all; " + payload(index, 40 * MB).decode()
        with connect(proc, autocommit=True) as conn:
            row = conn.execute(f"SELECT md5('{text}')".encode()).fetchone()
            assert row is not None
            return str(row[0])

    results = in_threads(query)
    for index, result in enumerate(results):
        text = "execute x; prepare y as z; discard all; " + payload(index, 40 * MB).decode()
        assert result == hashlib.md5(text.encode()).hexdigest()
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


def test_sql_execute_of_a_large_literal_keeps_pooling(pgtarn_factory: Any) -> None:
    """A streamed EXECUTE whose head names the client's statement pins nothing: the client
    goes on from server to server, its statement prepared wherever it lands."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10, "default_pool_size": 2})
    text = "k" * (4 * MB)
    with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
        conn.execute("PREPARE big_len(text, int) AS SELECT length($1) + $2")
        for number in range(3):
            row = conn.execute(f"EXECUTE big_len('{text}', {number})".encode()).fetchone()
            assert row == (len(text) + number,)
            with admin(proc) as console:
                pins = [row["pinned"] for row in show(console, "CLIENTS") if row["pinned"]]
            assert pins == []
            other.execute("BEGIN")  # (takes the server conn just had, if it went back)
            assert conn.execute("EXECUTE big_len('x', 1)").fetchone() == (2,)
            other.execute("COMMIT")


def test_sql_prepare_of_a_large_literal_three_clients(pgtarn_factory: Any) -> None:
    """Three clients each PREPARE a statement holding a 40 MB literal (a simple Query,
    transaction mode with max_prepared_statements) and EXECUTE it, at once: the PREPARE is
    passed on in pieces, never held whole, under the client's own name, and its client
    pinned to the server that has the statement (SHOW CLIENTS says why); that server is
    closed when the client leaves, so no other client ever meets the statement."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    warm(proc)
    start = reset_peak(proc)
    all_prepared = threading.Barrier(3)
    pins: list[str] = []

    def prepare(index: int) -> tuple[list[str], int]:
        text = payload(index, 40 * MB).decode()
        digests = []
        with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
            conn.execute(f"PREPARE big_prep_{index}(int) AS SELECT md5('{text}'), $1".encode())
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert pid is not None
            for number in range(2):
                row = conn.execute(f"EXECUTE big_prep_{index}({number})").fetchone()
                assert row is not None and row[1] == number
                digests.append(str(row[0]))
                assert other.execute("SELECT %s::int", (number,)).fetchone() == (number,)
            # (a name another client uses is not this client's)
            with pytest.raises(psycopg.errors.InvalidSqlStatementName):
                other.execute(f"EXECUTE big_prep_{index}(1)")
            assert conn.execute("SELECT pg_backend_pid()").fetchone() == pid
            all_prepared.wait()
            if index == 0:
                with admin(proc) as console:
                    pins.extend(r["pinned"] for r in show(console, "CLIENTS") if r["pinned"])
            all_prepared.wait()
        return digests, int(pid[0])

    results = in_threads(prepare)
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"
    assert pins == ["untracked"] * 3
    for index, result in enumerate(results):
        digest = hashlib.md5(payload(index, 40 * MB)).hexdigest()
        assert isinstance(result, tuple) and result[0] == [digest, digest]
    pids = {result[1] for result in results if isinstance(result, tuple)}
    assert len(pids) == 3
    wait_until(lambda: not pids & backend_pids(proc), timeout=10, what="their servers closed")
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("SELECT 42").fetchone() == (42,)


def test_large_error_of_a_prepared_statement_three_clients(pgtarn_factory: Any) -> None:
    """Three clients at once run a prepared statement (transaction mode, with
    max_prepared_statements) whose execution raises a 48 MB error: the ErrorResponse, which
    pgtarn may hold back for a retry, is decided from its head and passed on as it comes;
    each client gets its whole error, and pooling goes on."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    warm(proc)
    with connect(proc, autocommit=True) as conn:
        conn.execute(
            "CREATE OR REPLACE FUNCTION large_error(n int, c text) RETURNS int"
            " LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '%', repeat(c, n); END $$"
        )
    start = reset_peak(proc)

    def fail(index: int) -> tuple[int, str]:
        with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
            char = "abc"[index]
            with pytest.raises(psycopg.errors.RaiseException) as raised:
                conn.execute("SELECT large_error(%s, %s)", (48 * MB, char), prepare=True)
            message = str(raised.value.diag.message_primary)
            assert other.execute("SELECT %s::int", (index,), prepare=True).fetchone() == (index,)
            assert conn.execute("SELECT %s::int", (index,), prepare=True).fetchone() == (index,)
            return len(message), message[:1] + message[-1:]

    results = in_threads(fail)
    assert results == [(48 * MB, char * 2) for char in "abc"]
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("SELECT 42").fetchone() == (42,)


def test_extended_execute_with_a_large_literal_three_clients(pgtarn_factory: Any) -> None:
    """Three clients each run EXECUTE of a SQL-level prepared statement with a 40 MB literal
    through the extended protocol (an unnamed Parse), twice, at once: its name, in the Parse's
    head, is rewritten for whichever server runs it and the rest streams; not pinned."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    warm(proc)
    start = reset_peak(proc)
    pins: list[str] = []

    def execute(index: int) -> list[tuple[str, int]]:
        text = payload(index, 40 * MB).decode()
        rows = []
        with connect(proc, autocommit=True) as conn:
            conn.execute(f"PREPARE big_ext_{index}(text, int) AS SELECT md5($1), $2")
            for number in range(2):
                # (binary results: the extended protocol, an unnamed Parse of the text)
                sql = f"EXECUTE big_ext_{index}('{text}', {number})"
                row = conn.execute(sql.encode(), prepare=False, binary=True).fetchone()
                assert row is not None
                rows.append((str(row[0]), int(row[1])))
            with admin(proc) as console:
                pins.extend(r["pinned"] for r in show(console, "CLIENTS") if r["pinned"])
        return rows

    results = in_threads(execute)
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"
    for index, result in enumerate(results):
        digest = hashlib.md5(payload(index, 40 * MB)).hexdigest()
        assert result == [(digest, 0), (digest, 1)]
    assert pins == []


def test_sql_prepare_of_a_large_literal_run_in_the_same_text(pgtarn_factory: Any) -> None:
    """A long PREPARE and an EXECUTE of it after its literal, in one Query: the statement
    has its client's name on the server, so the EXECUTE, past what pgtarn reads, finds it;
    later queries name it too, and after DEALLOCATE it is gone as on a direct connection."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    text = "s" * (10 * MB)
    with connect(proc, autocommit=True) as conn:
        cur = conn.execute(f"PREPARE tail_p AS SELECT length('{text}'); EXECUTE tail_p".encode())
        rows = []
        while True:
            if cur.description is not None:
                rows.extend(cur.fetchall())
            if not cur.nextset():
                break
        assert rows == [(len(text),)]
        assert conn.execute("EXECUTE tail_p").fetchone() == (len(text),)
        conn.execute("DEALLOCATE tail_p")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("EXECUTE tail_p")


def pinned_reasons(proc: Any) -> list[str]:
    with admin(proc) as console:
        return [row["pinned"] for row in show(console, "CLIENTS") if row["pinned"]]


@pytest.mark.parametrize("lock_last", [False, True], ids=["lock_first", "lock_last"])
def test_large_row_beside_an_advisory_lock_call(pgtarn_factory: Any, lock_last: bool) -> None:
    """A 48 MB row in a Query whose lock call's row pgtarn reads (pg_try_advisory_lock in a
    tracked session, on a server that keeps prepared statements), before or after it: the
    long row goes on as it comes, never held whole, and the lock's row is still read, so
    the client is pinned while it holds the lock, and not after."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    warm(proc)
    start = reset_peak(proc)
    statements = ["SELECT pg_try_advisory_lock(71)", f"SELECT repeat('x', {48 * MB})"]
    if lock_last:
        statements.reverse()
    with connect(proc, autocommit=True) as conn:
        cur = conn.execute("; ".join(statements))  # one simple Query, two results
        rows = [cur.fetchall()]
        while cur.nextset():
            rows.append(cur.fetchall())
        if lock_last:
            rows.reverse()
        assert rows[0] == [(True,)]
        assert len(rows[1]) == 1 and len(rows[1][0][0]) == 48 * MB
        del rows
        peak = status_kb(proc, "VmHWM")
        assert pinned_reasons(proc) == ["advisory_lock"]
        assert conn.execute("SELECT pg_advisory_unlock(71)").fetchone() == (True,)
        assert pinned_reasons(proc) == []
        assert conn.execute("SELECT 5").fetchone() == (5,)
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


def results_of(cur: Any) -> list[Any]:
    """Every row of every result of a simple Query, in order."""
    rows: list[Any] = []
    while True:
        if cur.description is not None:
            rows.extend(cur.fetchall())
        if not cur.nextset():
            return rows


def test_long_script_naming_statements_three_clients(pgtarn_factory: Any) -> None:
    """Three clients at once, each with a SQL-level and a protocol-level prepared statement,
    send a 40 MB script (one simple Query; transaction mode with max_prepared_statements)
    that EXECUTEs, PREPAREs and DEALLOCATEs statements before and after its literal: it is
    passed on in pieces, never held whole, after the client's statements were prepared on
    its server under the client's own names; its client is pinned there, and from then on
    its statements are the server's own, as on a direct connection."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    warm(proc)
    start = reset_peak(proc)
    all_done = threading.Barrier(3)
    pins: list[str] = []

    def script(index: int) -> None:
        text = payload(index, 40 * MB).decode()
        with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
            conn.execute(f"PREPARE add_{index}(int) AS SELECT $1 + {index}")
            assert conn.execute("SELECT %s::int * 2", (21,), prepare=True).fetchone() == (42,)
            sql = (
                f"EXECUTE add_{index}(1); SELECT md5('{text}'); EXECUTE add_{index}(2);"
                f" DEALLOCATE add_{index}"
            )
            rows = results_of(conn.execute(sql.encode()))
            digest = hashlib.md5(payload(index, 40 * MB)).hexdigest()
            assert rows == [(1 + index,), (digest,), (2 + index,)]
            assert other.execute("SELECT %s::int", (index,)).fetchone() == (index,)
            with pytest.raises(psycopg.errors.InvalidSqlStatementName):
                conn.execute(f"EXECUTE add_{index}(3)")
            assert conn.execute("SELECT %s::int * 2", (4,), prepare=True).fetchone() == (8,)
            conn.execute(f"PREPARE add_{index}(int) AS SELECT $1 * 10")
            assert conn.execute(f"EXECUTE add_{index}(3)").fetchone() == (30,)
            all_done.wait()
            if index == 0:
                pins.extend(pinned_reasons(proc))
            all_done.wait()

    in_threads(script)
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"
    assert pins == ["untracked"] * 3
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("SELECT 42").fetchone() == (42,)


def test_long_script_preparing_a_statement(pgtarn_factory: Any) -> None:
    """A long script that PREPAREs a statement and runs it (refused in a short script in
    transaction mode): its statements being the server's own, it runs as on a direct
    connection, and so do the client's later uses of the name."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10, "default_pool_size": 1})
    text = "m" * (10 * MB)
    with connect(proc, autocommit=True) as conn:
        sql = f"PREPARE made AS SELECT 'made'; SELECT length('{text}'); EXECUTE made"
        assert results_of(conn.execute(sql.encode())) == [(len(text),), ("made",)]
        assert conn.execute("EXECUTE made").fetchone() == ("made",)
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            conn.execute("PREPARE made AS SELECT 1")
        assert conn.execute("SELECT %s::int", (7,), prepare=True).fetchone() == (7,)
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()
    # Its server, which has the client's statements, was closed when it left: the one
    # server of the pool is a new one, without them.
    with connect(proc, autocommit=True) as other:
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            other.execute("EXECUTE made")
        assert other.execute("SELECT pg_backend_pid()").fetchone() != pid


def test_long_deallocate(pgtarn_factory: Any) -> None:
    """A DEALLOCATE long for the comment after its name (transaction mode with
    max_prepared_statements): passed on in pieces, the statement gone after it as on a
    direct connection, and a failed one leaves the statement in place."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10})
    warm(proc)
    start = reset_peak(proc)
    comment = "/* " + "c" * (20 * MB) + " */"
    with connect(proc, autocommit=True) as conn:
        conn.execute("PREPARE gone AS SELECT 1")
        conn.execute("PREPARE kept AS SELECT 2")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute(f"DEALLOCATE nothing_by_that_name {comment}".encode())
        assert conn.execute("EXECUTE gone").fetchone() == (1,)
        conn.execute(f"DEALLOCATE gone {comment}".encode())
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("EXECUTE gone")
        assert conn.execute("EXECUTE kept").fetchone() == (2,)
    with connect(proc, autocommit=True) as conn:  # (an unnamed Parse: the extended protocol)
        conn.execute("PREPARE gone AS SELECT 3")
        conn.execute(f"DEALLOCATE gone {comment}".encode(), prepare=False, binary=True)
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("EXECUTE gone")
        conn.execute("PREPARE gone AS SELECT 4")
        assert conn.execute("EXECUTE gone").fetchone() == (4,)
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"


def test_long_texts_naming_statements_past_their_head(pgtarn_factory: Any) -> None:
    """A long Query that names the client's statements only past its first 8 KiB (after a
    literal: its head one EXECUTE, or naming none) runs as on a direct connection, since
    the client's statements were prepared under its own names ahead of it; its client is
    pinned there from then on. A long Query naming none keeps pooling, and those copies are
    closed after it: another client lent the same server does not meet them."""
    proc = pgtarn_factory(settings={"max_prepared_statements": 10, "default_pool_size": 1})
    with connect(proc, autocommit=True) as conn:  # (warm's three servers: one here)
        conn.execute("SELECT length(%s::bytea)", (b"x" * 1000,))
    start = reset_peak(proc)
    text = payload(0, 20 * MB).decode()
    digest = hashlib.md5(text.encode()).hexdigest()
    with connect(proc, autocommit=True) as conn, connect(proc, autocommit=True) as other:
        conn.execute("PREPARE add_one(int) AS SELECT $1 + 1")
        conn.execute("PREPARE md5_of(text) AS SELECT md5($1)")
        assert conn.execute("SELECT %s::int", (6,), prepare=True).fetchone() == (6,)
        rows = results_of(conn.execute(f"SELECT md5('{text}')".encode()))
        assert rows == [(digest,)] and pinned_reasons(proc) == []
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            other.execute("EXECUTE add_one(1)")  # (the one server: the copy is gone)
        sql = f"EXECUTE md5_of('{text}'); EXECUTE add_one(1)"
        assert results_of(conn.execute(sql.encode())) == [(digest,), (2,)]
        assert pinned_reasons(proc) == ["untracked"]
        sql = f"SELECT md5('{text}'); EXECUTE add_one(2); DEALLOCATE add_one"
        assert results_of(conn.execute(sql.encode())) == [(digest,), (3,)]
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("EXECUTE add_one(3)")
        assert conn.execute("SELECT %s::int", (7,), prepare=True).fetchone() == (7,)
    peak = status_kb(proc, "VmHWM")
    assert peak - start <= RSS_MARGIN_KB, f"pgtarn's RSS rose {(peak - start) // 1024} MB"
