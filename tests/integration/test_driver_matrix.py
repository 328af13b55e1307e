"""The driver matrix: each driver, with its default settings (prepared statements on where it
has them), runs the same small workload through pgtarn in transaction mode.

The workload: connect, create a table, insert with parameters, select with parameters ten
times (so that drivers cross their prepare thresholds), one transaction that rolls back,
close. Every result is checked. Servers are few (pool size 2) and shared with other clients
between transactions, so a driver that relies on session state would see it lost.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import PgtarnProcess

from .drivers import scalar

pytestmark = pytest.mark.integration

MATRIX_DIR = Path(__file__).resolve().with_name("matrix")
NAMES = {1: "one", 2: "two", 3: "three"}
SELECT = "SELECT name FROM {t} WHERE id = {p}"


@pytest.fixture
def proc(pgtarn_factory: Callable[..., Any]) -> Any:
    return pgtarn_factory(settings={"default_pool_size": 2, "pool_mode": "transaction"})


@pytest.fixture(autouse=True)
def busy(proc: PgtarnProcess) -> Iterator[None]:
    """Another client's transactions all along, so that servers change hands between the
    driver's transactions."""
    import psycopg

    stop = threading.Event()

    def churn() -> None:
        with psycopg.connect(proc.dsn("app", "app_pass"), autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("select pg_sleep(0.002)")

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join(timeout=10)


def _check_rows(rows: list[Any]) -> None:
    assert rows == [NAMES[i % 3 + 1] for i in range(10)], rows


# --- Python drivers ------------------------------------------------------------------------------


def test_psycopg_sync(proc: PgtarnProcess) -> None:
    import psycopg

    table = "matrix_psycopg"
    with psycopg.connect(proc.dsn("app", "app_pass")) as conn:  # prepare_threshold 5
        conn.autocommit = True
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
        for key, name in NAMES.items():
            conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (key, name))
        rows = [
            scalar(conn.execute(SELECT.format(t=table, p="%s"), (i % 3 + 1,))) for i in range(10)
        ]
        _check_rows(rows)
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute(f"INSERT INTO {table} VALUES (99, 'x')")
            raise RuntimeError("roll back")
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (3,)


def test_psycopg_async(proc: PgtarnProcess) -> None:
    import psycopg

    table = "matrix_psycopg_async"

    async def work() -> None:
        conn = await psycopg.AsyncConnection.connect(proc.dsn("app", "app_pass"), autocommit=True)
        async with conn:
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
            await conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
            for key, name in NAMES.items():
                await conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (key, name))
            rows = []
            for i in range(10):
                cur = await conn.execute(SELECT.format(t=table, p="%s"), (i % 3 + 1,))
                row = await cur.fetchone()
                assert row is not None
                rows.append(row[0])
            _check_rows(rows)
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await conn.execute(f"INSERT INTO {table} VALUES (99, 'x')")
                    raise RuntimeError("roll back")
            cur = await conn.execute(f"SELECT count(*) FROM {table}")
            assert await cur.fetchone() == (3,)

    asyncio.run(work())


def test_psycopg_pipeline(proc: PgtarnProcess) -> None:
    import psycopg

    table = "matrix_psycopg_pipeline"
    with psycopg.connect(proc.dsn("app", "app_pass"), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
        with conn.pipeline():
            for key, name in NAMES.items():
                conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (key, name))
            cursors = [
                conn.execute(SELECT.format(t=table, p="%s"), (i % 3 + 1,)) for i in range(10)
            ]
        _check_rows([scalar(cur) for cur in cursors])
        with pytest.raises(RuntimeError), conn.pipeline(), conn.transaction():
            conn.execute(f"INSERT INTO {table} VALUES (99, 'x')")
            raise RuntimeError("roll back")
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (3,)


def test_psycopg2(proc: PgtarnProcess) -> None:
    import psycopg2

    table = "matrix_psycopg2"
    conn = psycopg2.connect(proc.dsn("app", "app_pass"))
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
            cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
            for key, name in NAMES.items():
                cur.execute(f"INSERT INTO {table} VALUES (%s, %s)", (key, name))
        conn.commit()
        rows = []
        with conn.cursor() as cur:
            for i in range(10):
                cur.execute(SELECT.format(t=table, p="%s"), (i % 3 + 1,))
                rows.append(scalar(cur))
        conn.commit()
        _check_rows(rows)
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {table} VALUES (99, 'x')")
        conn.rollback()
        with conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {table}")
            assert cur.fetchone() == (3,)
        conn.commit()
    finally:
        conn.close()


def test_asyncpg(proc: PgtarnProcess) -> None:
    import asyncpg

    table = "matrix_asyncpg"

    async def work() -> None:
        conn = await asyncpg.connect(
            host=proc.host,
            port=proc.port,
            user="app",
            password="app_pass",
            database="app",
            ssl=False,
        )
        try:  # its default statement cache: every query a named prepared statement
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
            await conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
            for key, name in NAMES.items():
                await conn.execute(f"INSERT INTO {table} VALUES ($1, $2)", key, name)
            _check_rows(
                [await conn.fetchval(SELECT.format(t=table, p="$1"), i % 3 + 1) for i in range(10)]
            )
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await conn.execute(f"INSERT INTO {table} VALUES (99, 'x')")
                    raise RuntimeError("roll back")
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 3
        finally:
            await conn.close()

    asyncio.run(work())


def test_pg8000(proc: PgtarnProcess) -> None:
    import pg8000.native

    table = "matrix_pg8000"
    conn = pg8000.native.Connection(
        "app", host=proc.host, port=proc.port, database="app", password="app_pass"
    )
    try:
        conn.run(f"DROP TABLE IF EXISTS {table}")
        conn.run(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)")
        for key, name in NAMES.items():
            conn.run(f"INSERT INTO {table} VALUES (:id, :name)", id=key, name=name)
        _check_rows(
            [conn.run(SELECT.format(t=table, p=":id"), id=i % 3 + 1)[0][0] for i in range(10)]
        )
        conn.run("BEGIN")
        conn.run(f"INSERT INTO {table} VALUES (99, 'x')")
        conn.run("ROLLBACK")
        assert conn.run(f"SELECT count(*) FROM {table}") == [[3]]
    finally:
        conn.close()


def test_sqlalchemy_sync_psycopg(proc: PgtarnProcess) -> None:
    from sqlalchemy import create_engine, text

    table = "matrix_sqlalchemy"
    engine = create_engine(f"postgresql+psycopg://app:app_pass@{proc.host}:{proc.port}/app")
    try:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
            conn.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)"))
            conn.execute(
                text(f"INSERT INTO {table} VALUES (:id, :name)"),
                [{"id": k, "name": v} for k, v in NAMES.items()],
            )
        with engine.connect() as conn:
            _check_rows(
                [
                    conn.execute(
                        text(SELECT.format(t=table, p=":id")), {"id": i % 3 + 1}
                    ).scalar_one()
                    for i in range(10)
                ]
            )
            conn.rollback()
            conn.execute(text(f"INSERT INTO {table} VALUES (99, 'x')"))
            conn.rollback()
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() == 3
    finally:
        engine.dispose()


def test_sqlalchemy_async_asyncpg(proc: PgtarnProcess) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    table = "matrix_sqlalchemy_async"

    async def work() -> None:
        engine = create_async_engine(
            f"postgresql+asyncpg://app:app_pass@{proc.host}:{proc.port}/app"
        )
        try:
            async with engine.begin() as conn:
                await conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
                await conn.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, name text)"))
                await conn.execute(
                    text(f"INSERT INTO {table} VALUES (:id, :name)"),
                    [{"id": k, "name": v} for k, v in NAMES.items()],
                )
            async with engine.connect() as conn:
                rows = []
                for i in range(10):
                    result = await conn.execute(
                        text(SELECT.format(t=table, p=":id")), {"id": i % 3 + 1}
                    )
                    rows.append(result.scalar_one())
                await conn.rollback()
                _check_rows(rows)
                await conn.execute(text(f"INSERT INTO {table} VALUES (99, 'x')"))
                await conn.rollback()
                result = await conn.execute(text(f"SELECT count(*) FROM {table}"))
                assert result.scalar_one() == 3
        finally:
            await engine.dispose()

    asyncio.run(work())


def test_django_orm(proc: PgtarnProcess, tmp_path: Path) -> None:
    """Django: makemigrations and migrate through pgtarn, then CRUD, in a process of its own
    (Django's settings are process-wide)."""
    app = tmp_path / "matrixapp"
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    (app / "models.py").write_text(
        textwrap.dedent("""
        from django.db import models

        class Item(models.Model):
            name = models.TextField()
    """)
    )
    (tmp_path / "matrix_settings.py").write_text(
        textwrap.dedent(f"""
        SECRET_KEY = "matrix"
        INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "matrixapp"]
        DATABASES = {{"default": {{
            "ENGINE": "django.db.backends.postgresql", "NAME": "app", "USER": "app",
            "PASSWORD": "app_pass", "HOST": "{proc.host}", "PORT": "{proc.port}",
        }}}}
        USE_TZ = True
        DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
    """)
    )
    (tmp_path / "crud.py").write_text(
        textwrap.dedent("""
        import django
        django.setup()
        from django.db import transaction
        from matrixapp.models import Item

        Item.objects.all().delete()
        made = [Item.objects.create(name=name) for name in ("one", "two", "three")]
        for i in range(10):
            item = made[i % 3]
            assert Item.objects.get(pk=item.pk).name == item.name
        try:
            with transaction.atomic():
                Item.objects.create(name="rolled back")
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        assert Item.objects.count() == 3
        Item.objects.filter(name="two").update(name="deux")
        assert sorted(Item.objects.values_list("name", flat=True)) == ["deux", "one", "three"]
        print("ok")
    """)
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "matrix_settings", "PYTHONPATH": str(tmp_path)}
    for args in (
        ["-m", "django", "makemigrations", "matrixapp"],
        ["-m", "django", "migrate", "--noinput"],
        ["crud.py"],
    ):
        result = subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")


# --- other languages ---------------------------------------------------------------------------


def _node_pg() -> Path:
    """matrix/ with node-postgres installed from the lock file (npm ci, the first time)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed (.ci/run installs them)")
    if not (MATRIX_DIR / "node_modules" / "pg").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--silent"],
            cwd=MATRIX_DIR,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return MATRIX_DIR


def test_node_postgres(proc: PgtarnProcess) -> None:
    directory = _node_pg()
    url = f"postgres://app:app_pass@{proc.host}:{proc.port}/app"
    result = subprocess.run(
        ["node", "workload.js", url, "matrix_node"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


JDBC_JAR = Path("/usr/share/java/postgresql.jar")


def test_pgjdbc(proc: PgtarnProcess) -> None:
    if shutil.which("java") is None or not JDBC_JAR.exists():
        pytest.skip("a JDK and Debian's libpostgresql-jdbc-java are needed (.ci/run installs them)")
    url = f"jdbc:postgresql://{proc.host}:{proc.port}/app"
    result = subprocess.run(
        [
            "java",
            "-cp",
            str(JDBC_JAR),
            str(MATRIX_DIR / "Workload.java"),
            url,
            "app",
            "app_pass",
            "matrix_jdbc",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
