"""TempCluster: the demo's throwaway PostgreSQL made fit for the tests and the benchmarks."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from pgtarn.demo.cluster import SUPERUSER, ClusterError, ThrowawayCluster
from pgtarn.proto.build import quote_ident, quote_literal

from .conninfo import make_dsn

__all__ = ["TempCluster", "ipv6_loopback_works"]

TEST_HOST_RULES = [
    ("trust_user", "trust"),
    ("password_user", "password"),
    ("md5_user", "md5"),
]
"""pg_hba.conf methods of the test roles that do not use SCRAM (conftest.py creates them)."""


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


class TempCluster(ThrowawayCluster):
    """A ThrowawayCluster for the tests: also on ::1 (when the machine has it),
    max_connections 300, trust/password/md5 logins for the test roles of those names,
    md5 and superuser roles, TLS on demand, libpq DSNs, and keep() for a person to look.
    """

    def __init__(self, bindir: str | None = None) -> None:
        super().__init__(bindir)
        self._ipv6 = ipv6_loopback_works()

    def _listen_addresses(self) -> tuple[str, ...]:
        addresses = super()._listen_addresses()
        return (*addresses, "::1") if self._ipv6 else addresses

    def _settings(self) -> dict[str, str]:
        return {**super()._settings(), "max_connections": "300"}

    def _host_rules(self) -> list[tuple[str, str]]:
        return [*TEST_HOST_RULES, *super()._host_rules()]

    @property
    def ipv6(self) -> bool:
        """Whether the server also listens on ::1."""
        return self._ipv6

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

    def keep(self) -> str:
        """Stop the server and leave its directory for a person to look at (no cleanup at
        exit); return the directory."""
        self.stop()
        if self._atexit_registered:
            atexit.unregister(self.cleanup)
            self._atexit_registered = False
        return self.base_dir

    def crash(self) -> None:
        """pg_ctl stop -m immediate: the server goes as in a crash (no checkpoint, every
        connection dropped), as a failover test wants."""
        self._started = False
        self._run_pg(
            [self._bin("pg_ctl"), "stop", "-D", self.data_dir, "-m", "immediate", "-w", "-t", "30"],
            check=False,
        )

    def enable_tls(
        self,
        cert_file: str,
        key_file: str,
        ca_file: str | None = None,
        hba_first: tuple[str, ...] = (),
    ) -> None:
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
        if self.running:
            self.psql("SELECT pg_reload_conf()")
            # reloading is asynchronous: wait until the new ssl setting is in effect
            for _ in range(200):
                if self.psql("SHOW ssl").strip() == "on":
                    break
                time.sleep(0.05)
            else:
                raise ClusterError("ssl did not turn on after reload")


class PrimaryCluster(TempCluster):
    """A TempCluster that standbys may copy and follow: replication connections over its
    unix socket are trusted (pg_basebackup, and the standbys' WAL receivers)."""

    def _initdb(self) -> None:
        super()._initdb()
        with open(Path(self.data_dir) / "pg_hba.conf", "a", encoding="utf-8") as fh:
            fh.write("local replication all trust\n")


class StandbyCluster(TempCluster):
    """A streaming standby of a running PrimaryCluster: pg_basebackup -R into its own
    directory, its own port and socket; it follows the primary until promoted."""

    def __init__(self, primary: TempCluster, bindir: str | None = None, port: int = 0) -> None:
        """primary: a PrimaryCluster, or a promoted StandbyCluster; port: a given one (an
        old primary's, joining again as a standby), else a free one."""
        super().__init__(bindir)
        self.primary = primary
        self._port = port

    def _initdb(self) -> None:
        self._run_pg([
            self._bin("pg_basebackup"), "-D", self.data_dir, "-R", "-X", "stream",
            "-h", self.primary.socket_dir, "-p", str(self.primary.port), "-U", "postgres",
            "--no-sync", "--checkpoint=fast",  # a spread one takes minutes after CREATE DATABASE
        ])  # fmt: skip
        # the copied postgresql.conf names the primary's socket directory: ours win
        settings = "".join(f"{key} = '{value}'\n" for key, value in self._settings().items())
        with open(Path(self.data_dir) / "postgresql.conf", "a", encoding="utf-8") as fh:
            fh.write(f"\n# --- {type(self).__name__}: its own socket\n{settings}")

    def promote(self) -> None:
        """pg_ctl promote: the standby becomes a primary (and may be copied by standbys:
        local replication connections are trusted already, copied from its primary)."""
        self._run_pg([self._bin("pg_ctl"), "promote", "-w", "-D", self.data_dir])


@contextlib.contextmanager
def primary_and_standby(
    *setup_sql: tuple[str, str],
) -> Iterator[tuple[PrimaryCluster, StandbyCluster]]:
    """A primary with role app (password app_pass) owning database app, setup_sql run on it
    as (sql, dbname) pairs, then a streaming standby of it; both removed at the end."""
    primary = PrimaryCluster()
    primary.start()
    standby = StandbyCluster(primary)
    try:
        primary.create_role("app", "app_pass")
        primary.psql("CREATE DATABASE app OWNER app;")
        for sql, dbname in setup_sql:
            primary.psql(sql, dbname=dbname)
        standby.start()
        yield primary, standby
    finally:
        standby.cleanup()
        primary.cleanup()
