"""Throwaway PostgreSQL clusters and pgtarn processes, for the demo and the tests."""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = [
    "ClusterError",
    "PgtarnProcess",
    "PgtarnStartError",
    "PostgresNotFound",
    "TempCluster",
    "find_bindir",
    "free_port",
    "make_dsn",
    "port_is_free",
    "userlist_line",
]

SUPERUSER = "postgres"
"""Name of the superuser every TempCluster is created with."""

RUN_AS_USER = "postgres"
"""System user that runs initdb/pg_ctl/postgres when we are root (they refuse root)."""

LOOPBACK = "127.0.0.1"

_BINDIR_ENV = "PGTARN_PG_BINDIR"
_START_ATTEMPTS = 5
_MAX_SOCKET_DIR_LEN = 80  # sun_path is 108 bytes; leave room for "/.s.PGSQL.NNNNN.lock"
_PORT_IN_USE_MARKERS = ("Address already in use", "could not bind")


class ClusterError(RuntimeError):
    """A TempCluster operation (initdb, pg_ctl, psql) failed."""


class PostgresNotFound(ClusterError):
    """No PostgreSQL server binaries (initdb) could be found."""


class PgtarnStartError(RuntimeError):
    """A pgtarn subprocess exited or did not start listening in time."""


# --------------------------------------------------------------------------- helpers


def free_port(host: str = LOOPBACK) -> int:
    """Return a TCP port on `host` that was free a moment ago (the OS picked it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    """Tell whether a server could bind `port` on `host` now (SO_REUSEADDR, like servers)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ipv6_loopback_works() -> bool:
    """Tell whether a TCP socket can be bound on ::1."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


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


def quote_ident(name: str) -> str:
    """Quote an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """Quote an SQL string literal (standard_conforming_strings=on)."""
    return "'" + value.replace("'", "''") + "'"


def _dsn_value(value: object) -> str:
    text = str(value)
    if text and not re.search(r"[\s'\\]", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def make_dsn(**params: object) -> str:
    """Build a libpq keyword/value connection string; None values are left out."""
    return " ".join(f"{key}={_dsn_value(val)}" for key, val in params.items() if val is not None)


def userlist_line(user: str, password: str) -> str:
    """One line of a PgBouncer-style auth_file: both fields quoted, quotes doubled."""

    def q(text: str) -> str:
        return '"' + text.replace('"', '""') + '"'

    return f"{q(user)} {q(password)}\n"


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


# --------------------------------------------------------------------------- TempCluster


class TempCluster:
    """A PostgreSQL cluster in a temporary directory, for tests and the demo.

    The directory holds the data directory (`data/`), the server log
    (`postgres.log`) and the unix socket, so it never collides with a system
    cluster. The superuser is `postgres`; local (unix socket) connections are
    trusted, TCP ones use the method pg_hba.conf gives the role (see `start`).
    """

    def __init__(self, port: int | None = None, bindir: str | None = None) -> None:
        self._bindir = find_bindir(bindir)
        self._fixed_port = port
        self._port = port or 0
        self._base: Path | None = None
        self._started = False
        self._ipv6 = False
        self._atexit_registered = False

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
    def ipv6(self) -> bool:
        """Whether the server also listens on ::1."""
        return self._ipv6

    @property
    def running(self) -> bool:
        """Whether start() succeeded and stop() has not been called since."""
        return self._started

    # -- context manager

    def __enter__(self) -> TempCluster:
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
        """Stop the server (pg_ctl stop -m fast); a no-op if it is not running."""
        self._started = False
        if self._base is None or not (Path(self.data_dir) / "postmaster.pid").exists():
            return
        res = self._run_pg(
            [self._bin("pg_ctl"), "stop", "-D", self.data_dir, "-m", "fast", "-w", "-t", "60"],
            check=False,
        )
        if res.returncode != 0 and (Path(self.data_dir) / "postmaster.pid").exists():
            res = self._run_pg(
                [
                    self._bin("pg_ctl"),
                    "stop",
                    "-D",
                    self.data_dir,
                    "-m",
                    "immediate",
                    "-w",
                    "-t",
                    "30",
                ],
                check=False,
            )
            if res.returncode != 0 and (Path(self.data_dir) / "postmaster.pid").exists():
                raise ClusterError(f"pg_ctl stop failed: {res.stderr.strip()}")

    def keep(self) -> str:
        """Stop the server and leave its directory for a person to look at (no cleanup at
        exit); return the directory."""
        self.stop()
        if self._atexit_registered:
            atexit.unregister(self.cleanup)
            self._atexit_registered = False
        return self.base_dir

    def cleanup(self) -> None:
        """Stop the server and remove the temporary directory."""
        try:
            self.stop()
        finally:
            if self._base is not None:
                shutil.rmtree(self._base, ignore_errors=True)
                self._base = None
            if not self._fixed_port:
                self._port = 0
            if self._atexit_registered:
                atexit.unregister(self.cleanup)
                self._atexit_registered = False

    def enable_tls(self, cert_file: str, key_file: str, ca_file: str | None = None,
                   hba_first: tuple[str, ...] = ()) -> None:
        """Turn on ssl with this certificate (copied into the data directory) and reload.

        hba_first: pg_hba.conf lines put before the others (say, hostssl-only roles).
        ca_file: clients' certificates are checked against it when they present one.
        """
        data = Path(self.data_dir)
        account = self._run_as_postgres()
        settings = {"ssl": "on", "ssl_cert_file": "server.crt", "ssl_key_file": "server.key"}
        copies = [(cert_file, "server.crt"), (key_file, "server.key")]
        if ca_file:
            copies.append((ca_file, "root.crt"))
            settings["ssl_ca_file"] = "root.crt"
        for source, name in copies:
            target = data / name
            shutil.copyfile(source, target)
            os.chmod(target, 0o600)  # postgres refuses a key others can read
            if account is not None:
                os.chown(target, account.pw_uid, account.pw_gid)
        with open(data / "postgresql.conf", "a", encoding="utf-8") as fh:
            fh.write("".join(f"{key} = '{value}'\n" for key, value in settings.items()))
        if hba_first:
            hba = data / "pg_hba.conf"
            lines = hba.read_text(encoding="utf-8").splitlines()
            hba.write_text("\n".join([*hba_first, *lines]) + "\n", encoding="utf-8")
        if self._started:
            self.psql("SELECT pg_reload_conf()")
            # reloading is asynchronous: wait until the new ssl setting is in effect
            for _ in range(200):
                if self.psql("SHOW ssl").strip() == "on":
                    break
                time.sleep(0.05)
            else:
                raise ClusterError("ssl did not turn on after reload")

    # -- SQL helpers

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

    def create_role(
        self,
        name: str,
        password: str | None,
        *,
        md5: bool = False,
        superuser: bool = False,
    ) -> None:
        """CREATE ROLE ... LOGIN; with md5=True the password is stored as an md5 hash."""
        stmt = f"CREATE ROLE {quote_ident(name)} LOGIN"
        if superuser:
            stmt += " SUPERUSER"
        if password is not None:
            stmt += f" PASSWORD {quote_literal(password)}"
        encryption = "md5" if md5 else "scram-sha-256"
        self.psql(f"SET password_encryption = '{encryption}';\n{stmt};\n")

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

    def dsn(
        self,
        user: str = SUPERUSER,
        password: str | None = None,
        dbname: str = "postgres",
        **extra: object,
    ) -> str:
        """libpq connection string to this cluster over TCP."""
        return make_dsn(
            host=self.host, port=self.port, dbname=dbname, user=user, password=password, **extra
        )

    # -- internals

    def _bin(self, name: str) -> str:
        return str(Path(self._bindir) / name)

    def _client_bin(self, name: str) -> str:
        path = Path(self._bindir) / name
        if path.is_file():
            return str(path)
        return shutil.which(name) or name

    def _run_as_postgres(self) -> pwd.struct_passwd | None:
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
        self._ipv6 = ipv6_loopback_works()
        listen = "127.0.0.1,::1" if self._ipv6 else "127.0.0.1"
        data = Path(self.data_dir)
        conf = (
            "\n# --- pgtarn TempCluster settings (throwaway cluster: durability off)\n"
            f"listen_addresses = '{listen}'\n"
            f"unix_socket_directories = '{self.socket_dir}'\n"
            "max_connections = 300\n"
            "fsync = off\n"
            "synchronous_commit = off\n"
            "full_page_writes = off\n"
            "password_encryption = 'scram-sha-256'\n"
        )
        with open(data / "postgresql.conf", "a", encoding="utf-8") as fh:
            fh.write(conf)
        addrs = ["127.0.0.1/32", "::1/128"]
        hba = ["# pgtarn TempCluster: first matching line wins", "local all all trust"]
        for user, method in (
            ("trust_user", "trust"),
            ("password_user", "password"),
            ("md5_user", "md5"),
            ("all", "scram-sha-256"),
        ):
            hba.extend(f"host all {user} {addr} {method}" for addr in addrs)
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
        last_error = ""
        for _attempt in range(_START_ATTEMPTS):
            if not self._fixed_port and (not self._port or not self._port_free(self._port)):
                self._port = free_port()
            if self._fixed_port and not self._port_free(self._fixed_port):
                raise ClusterError(f"port {self._fixed_port} is already in use")
            offset = self._log_size()
            res = self._run_pg(
                [
                    self._bin("pg_ctl"),
                    "start",
                    "-w",
                    "-t",
                    "60",
                    "-D",
                    self.data_dir,
                    "-l",
                    self.log_path,
                    "-o",
                    f"-p {self._port}",
                ],
                check=False,
            )
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
                if self._fixed_port:
                    raise ClusterError(last_error)
                self._port = 0
                continue
            last_error = (
                f"pg_ctl start failed (exit {res.returncode}): {res.stderr.strip()}\n{log[-4000:]}"
            )
            if self._fixed_port or not port_taken:
                raise ClusterError(last_error)
            self._port = 0  # lost a race for the port: pick another one
        raise ClusterError(
            f"could not find a free port after {_START_ATTEMPTS} tries: {last_error}"
        )

    def _port_free(self, port: int) -> bool:
        if not port_is_free(port, LOOPBACK):
            return False
        return not self._ipv6 or port_is_free(port, "::1")


# --------------------------------------------------------------------------- pgtarn process


class PgtarnProcess:
    """A pgtarn server running as a subprocess (`python -m pgtarn ... <ini>`)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        *,
        ini_path: str,
        host: str,
        port: int,
        socket_dir: str,
        stdout_path: str,
        stderr_path: str,
        logfile: str | None = None,
    ) -> None:
        self.proc = proc
        self.ini_path = ini_path
        self.host = host
        self.port = port
        self.socket_dir = socket_dir
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.logfile = logfile

    @classmethod
    def launch(
        cls,
        ini_path: str,
        *,
        host: str,
        port: int,
        socket_dir: str,
        workdir: str,
        args: tuple[str, ...] | list[str] = (),
        logfile: str | None = None,
        timeout: float = 15.0,
        name: str = "pgtarn",
    ) -> PgtarnProcess:
        """Start pgtarn on `ini_path` and wait until `host:port` accepts TCP connections.

        stdout/stderr go to `<workdir>/<name>.stdout` and `.stderr`. Raises
        PgtarnStartError (with pgtarn's stderr) if it exits or is not
        listening within `timeout` seconds; the process is stopped then.
        """
        stdout_path = str(Path(workdir) / f"{name}.stdout")
        stderr_path = str(Path(workdir) / f"{name}.stderr")
        env = dict(os.environ)
        env.setdefault("PYTHONFAULTHANDLER", "1")
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pgtarn", *args, ini_path],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
        self = cls(
            proc,
            ini_path=ini_path,
            host=host,
            port=port,
            socket_dir=socket_dir,
            stdout_path=stdout_path,
            stderr_path=stderr_path,
            logfile=logfile,
        )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop(timeout=5)
            raise
        return self

    def wait_ready(self, timeout: float = 15.0) -> None:
        """Poll until the TCP port accepts a connection; raise if the process dies first."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise PgtarnStartError(
                    f"pgtarn exited with code {self.proc.returncode} before listening on "
                    f"{self.host}:{self.port}\n--- output ---\n{self.log_text()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    pass
            except OSError:
                pass
            else:
                if self.proc.poll() is None:
                    return
                continue  # someone else's listener, and ours died: report that above
            if time.monotonic() > deadline:
                raise PgtarnStartError(
                    f"pgtarn did not listen on {self.host}:{self.port} within {timeout}s"
                    f"\n--- output ---\n{self.log_text()}"
                )
            time.sleep(0.05)

    @staticmethod
    def _read(path: str | None) -> str:
        if not path:
            return ""
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def stderr_text(self) -> str:
        """What pgtarn wrote to stderr so far."""
        return self._read(self.stderr_path)

    def log_text(self) -> str:
        """pgtarn's logfile (if any), then its stderr and stdout."""
        parts = [self._read(self.logfile), self.stderr_text(), self._read(self.stdout_path)]
        return "\n".join(p for p in parts if p)

    def dsn(self, user: str, password: str | None, dbname: str = "app", **extra: object) -> str:
        """libpq connection string to this pgtarn over TCP."""
        return make_dsn(
            host=self.host, port=self.port, dbname=dbname, user=user, password=password, **extra
        )

    def send_signal(self, sig: int) -> None:
        """Send a signal to the pgtarn process."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to `timeout` s, then SIGKILL (its whole session); return the code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
