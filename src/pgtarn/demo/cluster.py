"""A throwaway PostgreSQL cluster in a temporary directory: initdb, start, psql, remove."""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from ..proto.build import quote_ident, quote_literal
from .ports import LOOPBACK, free_port, port_is_free

__all__ = [
    "SUPERUSER",
    "ClusterError",
    "PostgresNotFound",
    "ThrowawayCluster",
    "find_bindir",
]

SUPERUSER = "postgres"
"""Name of the superuser every ThrowawayCluster is created with."""

RUN_AS_USER = "postgres"
"""System user that runs initdb/pg_ctl/postgres when we are root (they refuse root)."""

_BINDIR_ENV = "PGTARN_PG_BINDIR"
_START_ATTEMPTS = 5
_MAX_SOCKET_DIR_LEN = 80  # sun_path is 108 bytes; leave room for "/.s.PGSQL.NNNNN.lock"
_PORT_IN_USE_MARKERS = ("Address already in use", "could not bind")


class ClusterError(RuntimeError):
    """A cluster operation (initdb, pg_ctl, psql) failed."""


class PostgresNotFound(ClusterError):
    """No PostgreSQL server binaries (initdb) could be found."""


def _version_key(path: Path) -> tuple[int, ...]:
    """Sort key for /usr/lib/postgresql/<version>/bin: numeric version, newest last."""
    name = path.parent.parent.name
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (0,)


def find_bindir(bindir: str | None = None) -> str:
    """Find the directory holding initdb/pg_ctl/postgres.

    Order: the `bindir` argument, $PGTARN_PG_BINDIR, the newest
    /usr/lib/postgresql/*/bin, initdb on PATH, `pg_config --bindir`.
    """
    candidates: list[str] = []
    if bindir:
        candidates.append(bindir)
    elif os.environ.get(_BINDIR_ENV):
        candidates.append(os.environ[_BINDIR_ENV])
    else:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=_version_key)
        candidates.extend(str(p.parent) for p in reversed(found))
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(str(Path(on_path).resolve().parent))
        pg_config = shutil.which("pg_config")
        if pg_config:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                out = subprocess.run(
                    [pg_config, "--bindir"], capture_output=True, text=True, timeout=10
                )
                if out.returncode == 0 and out.stdout.strip():
                    candidates.append(out.stdout.strip())
    for cand in candidates:
        if (Path(cand) / "initdb").is_file() and (Path(cand) / "pg_ctl").is_file():
            return str(Path(cand))
    where = ", ".join(candidates) if candidates else "/usr/lib/postgresql/*/bin, PATH"
    raise PostgresNotFound(
        f"no PostgreSQL server binaries (initdb, pg_ctl) found (looked in: {where}); "
        f"install PostgreSQL (e.g. `apt-get install postgresql`) or set {_BINDIR_ENV}"
    )


def _clean_env() -> dict[str, str]:
    """The environment without PG* variables, which could redirect libpq or the server."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PG")}


def _world_traversable(path: Path) -> bool:
    """Tell whether every directory from / down to `path` can be entered by anyone."""
    current = path.resolve()
    for directory in (current, *current.parents):
        try:
            if not directory.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _cidr(address: str) -> str:
    """The pg_hba.conf address of one host: 127.0.0.1/32, ::1/128."""
    return f"{address}/{128 if ':' in address else 32}"


class ThrowawayCluster:
    """A PostgreSQL cluster in a temporary directory, removed by cleanup() or at exit.

    The directory holds the data directory (`data/`), the server log
    (`postgres.log`) and the unix socket, so it never collides with a system
    cluster. The superuser is `postgres`; local (unix socket) connections are
    trusted, TCP ones need a SCRAM password. Durability is off (fsync): the data
    is thrown away. As root, initdb and the server run as the `postgres` system
    user, which owns the directory. A subclass may listen on more addresses, add
    settings and put pg_hba.conf rules first (the test harness does).
    """

    def __init__(self, bindir: str | None = None) -> None:
        self._bindir = find_bindir(bindir)
        self._port = 0
        self._base: Path | None = None
        self._started = False
        self._atexit_registered = False

    # -- what a subclass may widen

    def _listen_addresses(self) -> tuple[str, ...]:
        """The TCP addresses the server listens on."""
        return (LOOPBACK,)

    def _settings(self) -> dict[str, str]:
        """postgresql.conf settings added after initdb."""
        return {
            "listen_addresses": ",".join(self._listen_addresses()),
            "unix_socket_directories": self.socket_dir,
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "password_encryption": "scram-sha-256",
        }

    def _host_rules(self) -> list[tuple[str, str]]:
        """(role, auth method) of the pg_hba.conf `host` lines, first match wins."""
        return [("all", "scram-sha-256")]

    # -- properties

    @property
    def bindir(self) -> str:
        """Directory of the PostgreSQL server binaries in use."""
        return self._bindir

    @property
    def host(self) -> str:
        """TCP address the server listens on."""
        return LOOPBACK

    @property
    def port(self) -> int:
        """TCP port (and unix socket number) of the server."""
        if not self._port:
            raise ClusterError("the cluster has no port yet: call start() first")
        return self._port

    @property
    def base_dir(self) -> str:
        """The temporary directory owning everything of this cluster."""
        if self._base is None:
            raise ClusterError("the cluster has no directory yet: call start() first")
        return str(self._base)

    @property
    def socket_dir(self) -> str:
        """Directory of the server's unix socket (the temporary directory)."""
        return self.base_dir

    @property
    def data_dir(self) -> str:
        """The cluster's data directory."""
        return str(Path(self.base_dir) / "data")

    @property
    def log_path(self) -> str:
        """The server's log file."""
        return str(Path(self.base_dir) / "postgres.log")

    @property
    def running(self) -> bool:
        """Whether start() succeeded and stop() has not been called since."""
        return self._started

    # -- context manager

    def __enter__(self) -> ThrowawayCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    # -- lifecycle

    def start(self) -> None:
        """Create (initdb, first call only) and start the cluster; wait until it is up."""
        if self._started:
            return
        try:
            if self._base is None:
                self._make_base_dir()
                self._initdb()
            self._start_server()
        except BaseException as exc:
            log = self._log_tail()
            self.cleanup()
            if isinstance(exc, ClusterError) and log and log not in str(exc):
                raise ClusterError(f"{exc}\n--- postgres.log ---\n{log}") from exc
            raise
        if not self._atexit_registered:
            atexit.register(self.cleanup)
            self._atexit_registered = True

    def stop(self) -> None:
        """Stop the server (pg_ctl stop -m fast, else -m immediate); a no-op if not running."""
        self._started = False
        if not self._has_pidfile():
            return
        for mode, wait in (("fast", "60"), ("immediate", "30")):
            res = self._run_pg(
                [self._bin("pg_ctl"), "stop", "-D", self.data_dir, "-m", mode, "-w", "-t", wait],
                check=False,
            )
            if res.returncode == 0 or not self._has_pidfile():
                return
        raise ClusterError(f"pg_ctl stop failed: {res.stderr.strip()}")

    def cleanup(self) -> None:
        """Stop the server and remove the temporary directory."""
        try:
            self.stop()
        finally:
            if self._base is not None:
                shutil.rmtree(self._base, ignore_errors=True)
                self._base = None
            self._port = 0
            if self._atexit_registered:
                atexit.unregister(self.cleanup)
                self._atexit_registered = False

    # -- SQL

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run `sql` through psql as the superuser over the unix socket; return stdout.

        Output is unaligned and tuples-only (-A -t); the first error stops the
        script (ON_ERROR_STOP) and raises ClusterError. Each statement runs in
        its own transaction, so CREATE DATABASE works.
        """
        if not self._started:
            raise ClusterError("the cluster is not running")
        cmd = [
            self._client_bin("psql"), "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1",
            "-h", self.socket_dir, "-p", str(self.port), "-U", SUPERUSER, "-d", dbname,
            "-f", "-",
        ]  # fmt: skip
        try:
            res = subprocess.run(
                cmd,
                input=sql,
                capture_output=True,
                text=True,
                env=_clean_env(),
                timeout=300,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"psql timed out running: {sql!r}") from exc
        if res.returncode != 0:
            raise ClusterError(
                f"psql failed (exit {res.returncode}) on database {dbname!r}: "
                f"{res.stderr.strip()}\nSQL: {sql}"
            )
        return res.stdout

    def create_role(self, name: str, password: str) -> None:
        """CREATE ROLE ... LOGIN with the password stored as a SCRAM-SHA-256 verifier."""
        self.psql(
            "SET password_encryption = 'scram-sha-256';\n"
            f"CREATE ROLE {quote_ident(name)} LOGIN PASSWORD {quote_literal(password)};\n"
        )

    def stored_password(self, role: str) -> str:
        """rolpassword of `role` from pg_authid ('' if it has none)."""
        out = self.psql(
            f"SELECT coalesce(rolpassword, '') FROM pg_authid WHERE rolname = {quote_literal(role)}"
        )
        if not out.strip("\n"):
            raise ClusterError(f"no such role: {role!r}")
        return out.strip()

    def scram_verifier(self, role: str) -> str:
        """The SCRAM-SHA-256 verifier stored for `role` (rolpassword from pg_authid)."""
        stored = self.stored_password(role)
        if not stored.startswith("SCRAM-SHA-256$"):
            raise ClusterError(f"role {role!r} has no SCRAM verifier stored")
        return stored

    # -- running the server binaries

    def _bin(self, name: str) -> str:
        return str(Path(self._bindir) / name)

    def _client_bin(self, name: str) -> str:
        path = Path(self._bindir) / name
        if path.is_file():
            return str(path)
        return shutil.which(name) or name

    def _has_pidfile(self) -> bool:
        return self._base is not None and (Path(self.data_dir) / "postmaster.pid").exists()

    def _run_as_postgres(self) -> pwd.struct_passwd | None:
        """The system account the server binaries run as: `postgres` when we are root."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(RUN_AS_USER)
        except KeyError as exc:
            raise ClusterError(
                f"running as root, but there is no {RUN_AS_USER!r} system user to run "
                f"PostgreSQL as (initdb/postgres refuse root); create it, e.g. "
                f"`useradd --system --user-group --home-dir /var/lib/postgresql {RUN_AS_USER}`"
            ) from exc

    def _make_base_dir(self) -> None:
        account = self._run_as_postgres()
        tmp = Path(tempfile.gettempdir())
        if len(str(tmp)) > _MAX_SOCKET_DIR_LEN - 20 or (
            account is not None and not _world_traversable(tmp)
        ):
            tmp = Path("/tmp")
        base = Path(tempfile.mkdtemp(prefix="pgtarn-pg-", dir=tmp))
        if account is not None:
            os.chown(base, account.pw_uid, account.pw_gid)
        self._base = base

    def _run_pg(
        self, cmd: list[str], *, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """Run a server binary, as the postgres system user when we are root."""
        account = self._run_as_postgres()
        env = _clean_env()
        if account is not None:
            env.update(HOME=account.pw_dir, USER=account.pw_name, LOGNAME=account.pw_name)
        try:
            res = subprocess.run(
                cmd,
                cwd=self.base_dir,
                env=env,
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
                user=account.pw_uid if account is not None else None,
                group=account.pw_gid if account is not None else None,
                extra_groups=[] if account is not None else None,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{Path(cmd[0]).name} timed out after {timeout}s") from exc
        if check and res.returncode != 0:
            raise ClusterError(
                f"{Path(cmd[0]).name} failed (exit {res.returncode}): "
                f"{(res.stderr or res.stdout).strip()}"
            )
        return res

    def _initdb(self) -> None:
        self._run_pg([
            self._bin("initdb"), "-D", self.data_dir, "-U", SUPERUSER,
            "--auth-host=scram-sha-256", "--auth-local=trust",
            "-E", "UTF8", "--no-locale", "--no-sync",
        ])  # fmt: skip
        data = Path(self.data_dir)
        settings = "".join(f"{key} = '{value}'\n" for key, value in self._settings().items())
        with open(data / "postgresql.conf", "a", encoding="utf-8") as fh:
            fh.write(f"\n# --- {type(self).__name__}: a throwaway cluster, durability off\n")
            fh.write(settings)
        hba = [f"# pgtarn {type(self).__name__}: first matching line wins", "local all all trust"]
        for role, method in self._host_rules():
            hba.extend(
                f"host all {role} {_cidr(address)} {method}" for address in self._listen_addresses()
            )
        (data / "pg_hba.conf").write_text("\n".join(hba) + "\n", encoding="utf-8")

    def _log_tail(self, offset: int = 0, limit: int = 4000) -> str:
        if self._base is None:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return text[-limit:].strip()

    def _log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def _start_server(self) -> None:
        """pg_ctl start on a free port; another port when a race for it was lost."""
        last_error = ""
        for _attempt in range(_START_ATTEMPTS):
            if not self._port or not self._port_free(self._port):
                self._port = free_port()
            offset = self._log_size()
            res = self._run_pg(
                [
                    self._bin("pg_ctl"), "start", "-w", "-t", "60", "-D", self.data_dir,
                    "-l", self.log_path, "-o", f"-p {self._port}",
                ],
                check=False,
            )  # fmt: skip
            log = self._log_tail(offset, limit=100_000)
            port_taken = any(m in log for m in _PORT_IN_USE_MARKERS)
            if res.returncode == 0:
                self._started = True
                if not port_taken:
                    return
                # postgres starts when it could bind at least one of its addresses
                # (say ::1 but not 127.0.0.1): that is a lost race too, not a success.
                self.stop()
                last_error = f"port {self._port} is in use on some address:\n{log[-4000:]}"
                self._port = 0
                continue
            last_error = (
                f"pg_ctl start failed (exit {res.returncode}): {res.stderr.strip()}\n{log[-4000:]}"
            )
            if not port_taken:
                raise ClusterError(last_error)
            self._port = 0  # lost a race for the port: pick another one
        raise ClusterError(
            f"could not find a free port after {_START_ATTEMPTS} tries: {last_error}"
        )

    def _port_free(self, port: int) -> bool:
        return all(port_is_free(port, address) for address in self._listen_addresses())
