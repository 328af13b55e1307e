"""Integration fixtures: a throwaway PostgreSQL cluster and pgtarn processes in front of it."""

from __future__ import annotations

import gc
import itertools
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import pytest

from tests.support import (
    PgtarnProcess,
    PgtarnStartError,
    PostgresNotFound,
    TempCluster,
    free_port,
    userlist_line,
)

from .certs import Pki, make_pki
from .fakepg import FakePostgres
from .faultproxy import FaultProxy

ROLE_PASSWORDS: dict[str, str] = {
    "scram_user": "scram_pass",
    "md5_user": "md5_pass",
    "password_user": "password_pass",
    "trust_user": "trust_pass",
    "app": "app_pass",
}
"""Every test role with its plaintext password (what the default userlist.txt holds)."""

ITEMS = [(1, "one"), (2, "two"), (3, "three")]
"""Rows of app.public.items."""

START_TIMEOUT = 20.0
_MAX_SOCKET_DIR_LEN = 80
_START_ATTEMPTS = 3


class PgtarnFactory(Protocol):
    """What the pgtarn_factory fixture gives: start(...) -> PgtarnProcess (see the fixture)."""

    def __call__(
        self,
        *,
        databases: Mapping[str, str] | None = None,
        settings: Mapping[str, object] | None = None,
        users: Mapping[str, str] | None = None,
        userlist: Mapping[str, str] | None = None,
        peers: Mapping[int, str] | None = None,
    ) -> PgtarnProcess: ...


def _setup_sql() -> str:
    items = ", ".join(f"({i}, '{name}')" for i, name in ITEMS)
    return (
        "CREATE TABLE items (id int PRIMARY KEY, name text);\n"
        f"INSERT INTO items VALUES {items};\n"
        "ALTER TABLE items OWNER TO app;\n"
        "GRANT ALL ON TABLE items TO PUBLIC;\n"
    )


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[TempCluster]:
    """A TempCluster for the whole session, with the test roles and the `app` database.

    Roles (all LOGIN): scram_user/scram_pass (SCRAM), md5_user/md5_pass (md5
    stored, md5 in pg_hba), password_user/password_pass (cleartext `password`
    in pg_hba), trust_user/trust_pass (trust in pg_hba), app/app_pass (SCRAM).
    Database `app` is owned by `app`; app.public.items has 3 rows.
    """
    cluster = _started_cluster(ROLE_PASSWORDS)
    try:
        yield cluster
    finally:
        cluster.cleanup()


def _started_cluster(roles: Mapping[str, str | None]) -> TempCluster:
    """A started TempCluster with these roles (md5_user's password stored as md5) and the
    `app` database; the test is skipped without PostgreSQL binaries."""
    try:
        cluster = TempCluster()
    except PostgresNotFound as exc:
        pytest.skip(f"integration tests need PostgreSQL server binaries: {exc}")
    cluster.start()
    try:
        for role, password in roles.items():
            cluster.create_role(role, password, md5=(role == "md5_user"))
        cluster.psql("CREATE DATABASE app OWNER app;\nGRANT CONNECT ON DATABASE app TO PUBLIC;\n")
        cluster.psql(_setup_sql(), dbname="app")
    except BaseException:
        cluster.cleanup()
        raise
    return cluster


TLS_ROLES: dict[str, str | None] = {
    "app": "app_pass",
    "scram_user": "scram_pass",
    "tls_only": "tls_only_pass",
    "cert_user": None,
}
"""Roles of the TLS cluster: tls_only may log in over TLS only, cert_user with a certificate
(no password at all)."""


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The test CA and certificates (see certs.py), with a client certificate per role."""
    return make_pki(tmp_path_factory.mktemp("pki"), ("app", "scram_user", "cert_user"))


@pytest.fixture(scope="session")
def pg_tls_cluster(pki: Pki) -> Iterator[TempCluster]:
    """A second cluster with ssl = on (the test CA's certificate for localhost/127.0.0.1).

    Roles: see TLS_ROLES; pg_hba lets tls_only in over hostssl only and cert_user only with
    a client certificate of the test CA (method cert). Database app as in pg_cluster.
    """
    cluster = _started_cluster(TLS_ROLES)
    try:
        hba = []
        for addr in ("127.0.0.1/32", "::1/128"):
            hba += [
                f"hostssl all tls_only {addr} scram-sha-256",
                f"host all tls_only {addr} reject",
                f"hostssl all cert_user {addr} cert",
                f"host all cert_user {addr} reject",
            ]
        cluster.enable_tls(pki.server.cert, pki.server.key, pki.ca, hba_first=tuple(hba))
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture(scope="session")
def pg_roles() -> dict[str, str]:
    """Test role name -> plaintext password."""
    return dict(ROLE_PASSWORDS)


@pytest.fixture(scope="session")
def pg_dsn(pg_cluster: TempCluster) -> str:
    """Direct (no pooler) libpq DSN to the cluster's `app` database as `app` over TCP."""
    return pg_cluster.dsn("app", ROLE_PASSWORDS["app"], dbname="app")


def _ini_value(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _client_host(listen_addr: str) -> str:
    first = listen_addr.split(",")[0].strip()
    if first in ("*", "0.0.0.0", ""):
        return "127.0.0.1"
    if first == "::":
        return "::1"
    return first


def _write_ini(
    path: Path,
    databases: Mapping[str, str],
    settings: Mapping[str, str],
    users: Mapping[str, str] | None,
    peers: Mapping[int, str] | None = None,
) -> None:
    lines = ["[databases]"]
    lines += [f"{name} = {conn}" for name, conn in databases.items()]
    lines += ["", "[pgbouncer]"]
    lines += [f"{key} = {val}" for key, val in settings.items()]
    if users:
        lines += ["", "[users]"]
        lines += [f"{name} = {val}" for name, val in users.items()]
    if peers:
        lines += ["", "[peers]"]
        lines += [f"{peer_id} = {val}" for peer_id, val in peers.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def pgtarn_factory(pg_cluster: TempCluster, tmp_path: Path) -> Iterator[PgtarnFactory]:
    """Callable that writes a pgbouncer.ini + userlist.txt and starts pgtarn on them.

    ``start(*, databases=None, settings=None, users=None, userlist=None)``:

    - databases: the [databases] section (replaces the default ``app`` + ``*``).
    - settings: merged over the [pgbouncer] defaults; a value of None removes
      a default, bools are written as 1/0.
    - users: the [users] section (per-user settings), left out if None.
    - peers: the [peers] section (peer_id -> connection string), left out if None.
    - userlist: user -> password/verifier for auth_file (replaces the default:
      every test role with its plaintext password).

    The first start in a test uses tmp_path itself, later ones tmp_path/pgtarnN.
    At teardown every process is stopped and the test fails if any output or
    log of pgtarn contains "Traceback".
    """
    started: list[PgtarnProcess] = []
    temp_dirs: list[str] = []
    counter = itertools.count(1)

    def start(
        *,
        databases: Mapping[str, str] | None = None,
        settings: Mapping[str, object] | None = None,
        users: Mapping[str, str] | None = None,
        userlist: Mapping[str, str] | None = None,
        peers: Mapping[int, str] | None = None,
    ) -> PgtarnProcess:
        n = next(counter)
        workdir = tmp_path if n == 1 else tmp_path / f"pgtarn{n}"
        workdir.mkdir(parents=True, exist_ok=True)
        socket_dir = str(workdir)
        if len(socket_dir) > _MAX_SOCKET_DIR_LEN:  # unix socket paths are limited to 107 bytes
            socket_dir = tempfile.mkdtemp(prefix="pgtarn-sock-", dir="/tmp")
            temp_dirs.append(socket_dir)

        if databases is None:
            base = f"host={pg_cluster.host} port={pg_cluster.port}"
            databases = {"app": f"{base} dbname=app", "*": base}
        auth_file = workdir / "userlist.txt"
        entries = ROLE_PASSWORDS if userlist is None else userlist
        auth_file.write_text(
            "".join(userlist_line(u, p) for u, p in entries.items()), encoding="utf-8"
        )
        logfile = workdir / "pgtarn.log"
        overrides = dict(settings or {})
        fixed_port = "listen_port" in overrides
        ini_path = workdir / "pgbouncer.ini"

        last_error: PgtarnStartError | None = None
        for _attempt in range(_START_ATTEMPTS):
            defaults: dict[str, object] = {
                "listen_addr": "127.0.0.1",
                "listen_port": free_port(),
                "unix_socket_dir": socket_dir,
                "auth_type": "scram-sha-256",
                "auth_file": str(auth_file),
                "pool_mode": "transaction",
                "default_pool_size": 5,
                "admin_users": "app",
                "logfile": str(logfile),
            }
            defaults.update(overrides)
            final = {k: _ini_value(v) for k, v in defaults.items() if v is not None}
            _write_ini(ini_path, databases, final, users, peers)
            logfile.unlink(missing_ok=True)
            try:
                proc = PgtarnProcess.launch(
                    str(ini_path),
                    host=_client_host(final.get("listen_addr", "127.0.0.1")),
                    port=int(final["listen_port"]),
                    socket_dir=final.get("unix_socket_dir", socket_dir),
                    workdir=str(workdir),
                    args=["-v"],
                    logfile=final.get("logfile"),
                    timeout=START_TIMEOUT,
                )
            except PgtarnStartError as exc:
                if fixed_port or "Address already in use" not in str(exc):
                    raise
                last_error = exc  # lost a race for the port: try another one
                continue
            started.append(proc)
            return proc
        assert last_error is not None
        raise last_error

    yield start

    problems: list[str] = []
    for proc in started:
        try:
            proc.stop(timeout=10)
        except Exception as exc:
            problems.append(f"could not stop pgtarn (pid {proc.proc.pid}): {exc!r}")
    for proc in started:
        text = proc.log_text()
        if "Traceback" in text:
            problems.append(f"pgtarn ({proc.ini_path}) logged a Traceback:\n{text}")
    for directory in temp_dirs:
        shutil.rmtree(directory, ignore_errors=True)
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def fake_pg() -> Iterator[FakePostgres]:
    """A scripted fake PostgreSQL (see fakepg.py)."""
    with FakePostgres() as fake:
        yield fake


@pytest.fixture
def fault_proxy(pg_cluster: TempCluster) -> Iterator[FaultProxy]:
    """A started FaultProxy in front of the cluster (see faultproxy.py), closed at teardown."""
    with FaultProxy(pg_cluster.host, pg_cluster.port) as proxy:
        yield proxy


@pytest.fixture(autouse=True)
def _collect_garbage_after_test() -> Iterator[None]:
    """Collect cycles after each test, so that a leaked connection's ResourceWarning fails the
    test that leaked it instead of whichever test the collector happens to run in."""
    yield
    gc.collect()
