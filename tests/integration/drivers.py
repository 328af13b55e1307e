"""Connect real drivers (psycopg 3, asyncpg) to a running pgtarn."""

from __future__ import annotations

from typing import Any

import asyncpg
import psycopg


def connect(
    proc: Any, user: str = "app", password: str | None = "app_pass", dbname: str = "app", **kw: Any
) -> psycopg.Connection[Any]:
    return psycopg.connect(proc.dsn(user, password, dbname=dbname), **kw)


async def aconnect(
    proc: Any, user: str = "app", password: str | None = "app_pass", dbname: str = "app", **kw: Any
) -> asyncpg.Connection:
    kw.setdefault("statement_cache_size", 0)
    return await asyncpg.connect(
        host=proc.host,
        port=proc.port,
        user=user,
        password=password,
        database=dbname,
        ssl=False,
        **kw,
    )


def scalar(cursor: psycopg.Cursor[Any], column: int = 0) -> Any:
    """A column of the cursor's next row; the test fails if the query returned no row."""
    row = cursor.fetchone()
    assert row is not None, "the query returned no row"
    return row[column]
