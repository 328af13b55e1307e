"""Connect real drivers (psycopg 3, asyncpg) to a running pgtarn."""

from __future__ import annotations

from typing import Any, Protocol

import asyncpg
import psycopg


class DsnSource(Protocol):
    """What psycopg connects through: a libpq connection string (pgtarn, a FaultProxy)."""

    def dsn(self, user: str, password: str | None, dbname: str = "app", **extra: object) -> str:
        """A connection string to it."""
        ...


class Endpoint(DsnSource, Protocol):
    """What asyncpg connects to: a host and a port as well."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


def connect(
    proc: DsnSource,
    user: str = "app",
    password: str | None = "app_pass",
    dbname: str = "app",
    **kw: Any,
) -> psycopg.Connection[Any]:
    return psycopg.connect(proc.dsn(user, password, dbname=dbname), **kw)


async def aconnect(
    proc: Endpoint,
    user: str = "app",
    password: str | None = "app_pass",
    dbname: str = "app",
    **kw: Any,
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
