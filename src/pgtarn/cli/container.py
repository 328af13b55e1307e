"""The container image's entrypoint: pgbouncer.ini and userlist.txt from the environment."""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Mapping
from urllib.parse import parse_qs, unquote, urlsplit

from ..auth.md5 import is_md5_secret, md5_secret
from ..auth.scram import make_verifier, parse_verifier
from ..auth.userlist import userlist_line
from ..config.inifile import quote_connstr_value
from ..config.settings import Config

__all__ = [
    "MOUNTED_INI",
    "EnvConfigError",
    "Generated",
    "chosen_ini",
    "generate",
    "health_check",
    "main",
    "write_generated",
]

MOUNTED_INI = "/etc/pgtarn/pgbouncer.ini"
"""Where a mounted configuration is looked for (a ConfigMap, a bind mount)."""

DEFAULT_RUN_DIR = "/run/pgtarn"
"""Where the generated files and the unix socket go: writable even with a read-only root."""

# The variables the community PgBouncer images read, by the setting each sets. Any other
# setting is PGBOUNCER_<NAME>; unprefixed names are kept to this list so that the
# environment every container has (PATH, USER, HOME...) never becomes a setting.
COMMON_SETTINGS = (
    "listen_addr",
    "listen_port",
    "pool_mode",
    "max_client_conn",
    "default_pool_size",
    "min_pool_size",
    "reserve_pool_size",
    "reserve_pool_timeout",
    "max_db_connections",
    "max_user_connections",
    "server_reset_query",
    "server_reset_query_always",
    "server_check_query",
    "server_check_delay",
    "server_lifetime",
    "server_idle_timeout",
    "server_connect_timeout",
    "server_login_retry",
    "query_timeout",
    "query_wait_timeout",
    "client_idle_timeout",
    "client_login_timeout",
    "idle_transaction_timeout",
    "ignore_startup_parameters",
    "max_prepared_statements",
    "admin_users",
    "stats_users",
    "auth_type",
    "auth_user",
    "auth_query",
    "auth_dbname",
    "auth_hba_file",
    "log_connections",
    "log_disconnections",
    "log_pooler_errors",
    "stats_period",
    "client_tls_sslmode",
    "client_tls_key_file",
    "client_tls_cert_file",
    "client_tls_ca_file",
    "server_tls_sslmode",
    "server_tls_ca_file",
    "server_tls_key_file",
    "server_tls_cert_file",
    "tcp_keepalive",
    "metrics_port",
    "metrics_listen_addr",
    "log_format",
)
_NOT_SETTINGS = frozenset({"path", "conffile", "databases", "users", "peers", "warnings"})
_SETTINGS = frozenset(f.name for f in dataclasses.fields(Config)) - _NOT_SETTINGS
_NO_PASSWORD_NEEDED = frozenset({"trust", "any", "cert"})
_USERLIST_SECRETS = ("plain", "md5", "scram")
_INFO_FLAGS = frozenset({"-V", "--version", "-h", "--help"})
_SSLREQUEST = struct.pack("!ii", 8, 80877103)


class EnvConfigError(ValueError):
    """The environment does not describe a configuration; the text names variables only."""


@dataclasses.dataclass(frozen=True)
class Generated:
    """The generated files' contents: the ini (no secret in it) and the userlist."""

    ini: str
    userlist: str = dataclasses.field(repr=False)
    summary: str  # one line for the log: where clients are sent, no credential


@dataclasses.dataclass
class _Target:
    host: str = ""
    port: str = "5432"
    user: str = ""
    password: str | None = None
    dbname: str = ""
    sslmode: str = ""


def _from_url(url: str) -> _Target:
    """DATABASE_URL's parts, percent-decoded; errors never repeat the URL (it has a password)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EnvConfigError("DATABASE_URL is not a valid URL (bad port or host?)") from exc
    if parts.scheme not in ("postgres", "postgresql"):
        raise EnvConfigError("DATABASE_URL must start with postgres:// or postgresql://")
    target = _Target(
        host=unquote(parts.hostname or ""),
        user=unquote(parts.username or ""),
        dbname=unquote(parts.path.lstrip("/")),
    )
    if port is not None:
        target.port = str(port)
    if parts.password is not None:
        target.password = unquote(parts.password)
    sslmode = parse_qs(parts.query).get("sslmode")
    if sslmode:
        target.sslmode = sslmode[-1]
    return target


def _target(env: Mapping[str, str]) -> _Target:
    target = _from_url(env["DATABASE_URL"]) if env.get("DATABASE_URL") else _Target()
    target.host = env.get("DB_HOST") or target.host
    target.port = env.get("DB_PORT") or target.port
    target.user = env.get("DB_USER") or target.user
    target.dbname = env.get("DB_NAME") or target.dbname
    if "DB_PASSWORD" in env:
        target.password = env["DB_PASSWORD"]
    if not target.host:
        raise EnvConfigError(
            f"set DATABASE_URL or DB_HOST (or mount a pgbouncer.ini at {MOUNTED_INI}, "
            "or name one in PGTARN_CONFIG)"
        )
    if not target.port.isdigit():
        raise EnvConfigError("DB_PORT (or DATABASE_URL's port) must be a number")
    return target


def _settings(env: Mapping[str, str]) -> dict[str, str]:
    """The [pgbouncer] settings the environment names: common names, then PGBOUNCER_*."""
    chosen: dict[str, tuple[str, str]] = {}
    for name in COMMON_SETTINGS:
        if name.upper() in env:
            chosen[name] = (name.upper(), env[name.upper()])
    for variable, value in env.items():
        name = variable.removeprefix("PGBOUNCER_").lower()
        if variable.startswith("PGBOUNCER_") and name in _SETTINGS:
            chosen[name] = (variable, value)
    for variable, value in chosen.values():
        if "\n" in value or "\r" in value:
            raise EnvConfigError(f"{variable} must be one line")
    return {name: value for name, (_variable, value) in chosen.items()}


def _secret(target: _Target, auth_type: str, env: Mapping[str, str]) -> str:
    """What the userlist stores for the user.

    A secret already hashed (md5..., SCRAM-SHA-256$...) is kept: with PostgreSQL's own
    verifier, SCRAM passthrough logs in without any plaintext. Otherwise the password itself
    for scram-sha-256 and plain, since pgtarn logs in to PostgreSQL with it; a fresh SCRAM
    verifier (USERLIST_SECRET=scram) has its own salt and so works for clients only.
    """
    password = target.password
    if password is None:
        if auth_type in _NO_PASSWORD_NEEDED:
            return ""
        raise EnvConfigError(
            f"DB_PASSWORD (or a password in DATABASE_URL) is needed with AUTH_TYPE={auth_type}"
        )
    if is_md5_secret(password) or parse_verifier(password) is not None:
        return password
    kind = env.get("USERLIST_SECRET") or ("md5" if auth_type == "md5" else "plain")
    if kind not in _USERLIST_SECRETS:
        raise EnvConfigError(f"USERLIST_SECRET must be one of {', '.join(_USERLIST_SECRETS)}")
    if kind == "md5":
        return md5_secret(password, target.user)
    if kind == "scram":
        return make_verifier(password).to_string()
    return password


def generate(env: Mapping[str, str], run_dir: str) -> Generated:
    """The ini and userlist the environment describes, with files and socket in `run_dir`.

    Pure: no file is read or written. EnvConfigError names the variable at fault.
    """
    target = _target(env)
    settings = {
        "listen_addr": "*",
        "listen_port": "6432",
        "unix_socket_dir": run_dir,
        "auth_type": "scram-sha-256",
        "auth_file": f"{run_dir}/userlist.txt",
    }
    if target.user:
        settings["admin_users"] = target.user
    if target.sslmode:
        settings["server_tls_sslmode"] = target.sslmode
    settings.update(_settings(env))
    connstr = f"host={quote_connstr_value(target.host)} port={target.port}"
    if target.dbname:
        name = target.dbname
        connstr += f" dbname={quote_connstr_value(target.dbname)}"
    else:
        name = "*"
    userlist = ""
    if target.user:
        userlist = userlist_line(target.user, _secret(target, settings["auth_type"], env))
    lines = [
        "; generated by pgtarn's container entrypoint from the environment",
        "[databases]",
        f"{_ini_key(name)} = {connstr}",
        "",
        "[pgbouncer]",
    ]
    lines += [f"{key} = {value}" for key, value in settings.items()]
    summary = (
        f"database {name} -> {target.host}:{target.port}, user "
        f"{target.user or '(none)'}, auth_type {settings['auth_type']}"
    )
    return Generated(ini="\n".join(lines) + "\n", userlist=userlist, summary=summary)


def _ini_key(name: str) -> str:
    """A database name as an ini key: quoted when it has characters the key cannot."""
    if name == "*" or name.replace("_", "").replace("-", "").isalnum():
        return name
    return '"' + name.replace('"', '""') + '"'


def chosen_ini(
    env: Mapping[str, str], exists: Callable[[str], bool] = os.path.exists
) -> str | None:
    """The ini to run as is: PGTARN_CONFIG, else one mounted at MOUNTED_INI; None: generate."""
    if env.get("PGTARN_CONFIG"):
        return env["PGTARN_CONFIG"]
    return MOUNTED_INI if exists(MOUNTED_INI) else None


def write_generated(generated: Generated, run_dir: str) -> str:
    """Write both files into `run_dir` (the userlist readable by its owner only); the ini path."""
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    userlist = os.path.join(run_dir, "userlist.txt")
    fd = os.open(userlist + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(generated.userlist)
    os.replace(userlist + ".tmp", userlist)
    ini = os.path.join(run_dir, "pgbouncer.ini")
    with open(ini + ".tmp", "w", encoding="utf-8") as f:
        f.write(generated.ini)
    os.replace(ini + ".tmp", ini)
    return ini


def health_check(host: str, port: int, timeout: float = 3.0) -> bool:
    """Whether a pooler answers on host:port: an SSLRequest gets its one-byte S or N.

    More than a TCP connect, which the kernel accepts even when the process hangs.
    """
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(max(0.01, deadline - time.monotonic()))
            conn.sendall(_SSLREQUEST)
            return conn.recv(1) in (b"S", b"N")
    except OSError:
        return False


def _health_main(env: Mapping[str, str]) -> int:
    host = env.get("PGTARN_HEALTH_HOST", "127.0.0.1")
    port = env.get("LISTEN_PORT") or env.get("PGBOUNCER_LISTEN_PORT") or "6432"
    ok = health_check(host, int(port))
    print(f"pgtarn health: {host}:{port} {'answers' if ok else 'does not answer'}", file=sys.stderr)
    return 0 if ok else 1


def main(
    argv: list[str],
    env: Mapping[str, str] | None = None,
    execv: Callable[[str, list[str]], object] = os.execv,
) -> int:
    """`pgtarn container [health | PGTARN-ARGS...]`: the config, then exec pgtarn on it.

    Returns only on an error (or when `execv` returns, as a test's does).
    """
    environ = os.environ if env is None else env
    if argv[:1] == ["health"]:
        return _health_main(environ)
    if _INFO_FLAGS & set(argv):  # --version, --help: no configuration needed
        execv(sys.executable, [sys.executable, "-m", "pgtarn", *argv])
        return 0
    ini = chosen_ini(environ)
    if ini is None:
        run_dir = environ.get("PGTARN_RUN_DIR", DEFAULT_RUN_DIR)
        try:
            generated = generate(environ, run_dir)
            ini = write_generated(generated, run_dir)
        except EnvConfigError as exc:
            print(f"pgtarn container: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"pgtarn container: cannot write to {run_dir}: {exc.strerror}", file=sys.stderr)
            return 1
        print(f"pgtarn container: wrote {ini} ({generated.summary})", file=sys.stderr)
    else:
        print(f"pgtarn container: using {ini} as it is", file=sys.stderr)
    sys.stderr.flush()
    execv(sys.executable, [sys.executable, "-m", "pgtarn", *argv, ini])
    return 0
