"""The typed, immutable Config and its settings: names, kinds, defaults, value parsers.

inifile.py reads pgbouncer.ini into it.

Long: the Config's fields and the table of settings describe the same names; kept in one file
so that a setting is added in one place with its kind and default.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any

from pgtarn.errors import ConfigError

POOL_MODES = ("session", "transaction", "statement")
AUTH_TYPES = ("cert", "md5", "scram-sha-256", "plain", "trust", "any", "hba", "pam", "ldap")
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
LOAD_BALANCE_HOSTS = ("disable", "round-robin")
#: The highest peer_id: 14 bits of the cancel keys handed out (proto/cancelkey.py).
MAX_PEER_ID = 16383
TARGET_SESSION_ATTRS = ("any", "read-write", "read-only", "primary", "standby", "prefer-standby")
#: pgtarn's own: which transactions may go to a replica of a host list.
READ_WRITE_SPLIT = ("off", "explicit", "auto")
#: A client asking for NAME + this suffix gets NAME's entry for read-only work, when NAME splits.
READ_ONLY_SUFFIX = "_ro"
#: The admin console's database names (unless a [databases] entry takes "pgtarn").
ADMIN_DATABASES = ("pgbouncer", "pgtarn")
#: PgBouncer's refusal of the admin console as the database auth_query looks users up in.
RESERVED_AUTH_DBNAME = 'cannot use the reserved "{}" database as an auth_dbname'

_LINUX = sys.platform.startswith("linux")
_AUTH_QUERY = (
    "SELECT rolname, CASE WHEN rolvaliduntil < now() THEN NULL ELSE rolpassword END"
    " FROM pg_authid WHERE rolname=$1 AND rolcanlogin"
)
_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _empty_map() -> Mapping[str, Any]:
    return _EMPTY


def _no_peers() -> Mapping[int, PeerEntry]:
    return MappingProxyType({})


@dataclass(frozen=True)
class DatabaseEntry:
    """One `[databases]` line.  None means "not set here; use the global setting".

    `host` is None when the entry names no host: PgBouncer then connects through
    the Unix socket in `unix_socket_dir`; the caller decides.  A host that starts
    with '/' (or '@', abstract namespace) is a Unix socket directory.  With a
    comma list, `hosts` holds all of them and `host` the first; `ports` the matching
    port list when `port` is one too (libpq's form), `port` its first. Which host a new
    connection tries first is `load_balance_hosts`' business (net.sockets.HostChooser).

    `read_write_split` and the fields after it are pgtarn's own (PgBouncer has none of them);
    they say where reads may go, not what a server is, so server_identity leaves them out.
    `reads_only` is True only on the NAME_ro alias Config.find_database makes.
    """

    name: str
    host: str | None = None
    hosts: tuple[str, ...] = ()
    port: int = 5432
    ports: tuple[int, ...] = ()
    dbname: str = ""  # empty: same as `name`
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    auth_user: str | None = None
    auth_dbname: str | None = None
    auth_query: str | None = None
    pool_size: int | None = None
    min_pool_size: int | None = None
    reserve_pool_size: int | None = None
    pool_mode: str | None = None
    max_db_connections: int | None = None
    max_db_client_connections: int | None = None
    server_lifetime: float | None = None
    query_wait_timeout: float | None = None
    load_balance_hosts: str | None = None
    target_session_attrs: str | None = None
    connect_query: str | None = None
    read_write_split: str = "off"  # off | explicit | auto
    max_replica_lag_bytes: int | None = None  # at most one of the two set; None: no limit
    max_replica_lag_seconds: float | None = None
    primary_reads: bool = True  # reads may go to the primary too
    read_your_writes: bool = True
    health_check_period: float = 1.0
    reads_only: bool = False
    # client_encoding / DateStyle / TimeZone / application_name sent at server login
    startup_params: Mapping[str, str] = field(default_factory=_empty_map, hash=False)
    line: str = ""  # "file:line" where the entry was defined
    connstr: str = field(default="", repr=False)  # original text, to detect changes on reload
    explicit_dbname: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if not self.dbname:
            object.__setattr__(self, "dbname", self.name)

    @property
    def server_identity(self) -> str:
        """What makes a server connection of this entry: when it changes on reload, existing
        servers are closed as they are released (pool sizes and modes do not count)."""
        return repr(
            (
                self.hosts or (self.host,),
                self.ports or self.port,
                self.dbname,
                self.user,
                self.password,
                self.connect_query,
                sorted(self.startup_params.items()),
            )
        )

    def targets(self, socket_dir: str = "/tmp") -> list[tuple[str, int]]:
        """Its hosts with their ports, in the order of its list. An entry without host
        connects through the unix socket in unix_socket_dir, as PgBouncer."""
        ports = self.ports or (self.port,)
        return [
            (host or socket_dir or "/tmp", ports[i] if len(ports) > 1 else ports[0])
            for i, host in enumerate(self.hosts or (self.host,))
        ]

    @property
    def is_unix_socket(self) -> bool:
        """True when `host` names a Unix socket directory (or is unset)."""
        return self.host is None or self.host.startswith(("/", "@"))


@dataclass(frozen=True)
class UserEntry:
    """One `[users]` line; None means "not set for this user"."""

    name: str
    pool_mode: str | None = None
    pool_size: int | None = None
    reserve_pool_size: int | None = None
    max_user_connections: int | None = None
    max_user_client_connections: int | None = None
    query_timeout: float | None = None
    query_wait_timeout: float | None = None
    transaction_timeout: float | None = None
    idle_transaction_timeout: float | None = None
    client_idle_timeout: float | None = None
    line: str = ""


@dataclass(frozen=True)
class PeerEntry:
    """One `[peers]` line: another pgtarn (or PgBouncer) of the group, which gets the
    CancelRequests whose key names its peer_id. `host` None: the unix socket in
    unix_socket_dir; a host that starts with '/' is a unix socket directory."""

    peer_id: int
    host: str | None = None
    port: int = 6432
    pool_size: int | None = None  # cancels in flight to it at once; None: default_pool_size
    line: str = ""


@dataclass(frozen=True, repr=False)
class Config:
    """The whole configuration; attribute names are PgBouncer's setting names.

    Every setting attribute is described by `SETTINGS[name]` (kind, default,
    changeable at runtime).  Times are float seconds, lists are tuples.
    """

    logfile: str = ""
    pidfile: str = ""
    listen_addr: tuple[str, ...] = ()  # empty: no TCP listener; "*": all addresses
    listen_port: int = 6432
    unix_socket_dir: str = "/tmp"  # empty: no Unix socket
    unix_socket_mode: int = 0o777
    unix_socket_group: str = ""
    user: str = ""
    pool_mode: str = "session"
    max_client_conn: int = 100
    default_pool_size: int = 20
    min_pool_size: int = 0
    reserve_pool_size: int = 0
    reserve_pool_timeout: float = 5.0
    max_db_connections: int = 0
    max_db_client_connections: int = 0
    max_user_connections: int = 0
    max_user_client_connections: int = 0
    server_round_robin: bool = False
    track_extra_parameters: tuple[str, ...] = ("IntervalStyle",)
    ignore_startup_parameters: tuple[str, ...] = ()
    peer_id: int = 0
    disable_pqexec: bool = False
    application_name_add_host: bool = False
    conffile: str = ""
    job_name: str = "pgbouncer"
    stats_period: int = 60
    max_prepared_statements: int = 200
    scram_iterations: int = 4096
    auth_type: str = "md5"
    auth_file: str = ""
    auth_hba_file: str = ""
    auth_ident_file: str = ""
    auth_ldap_options: str = ""
    #: pgtarn's own: the PAM service (/etc/pam.d/NAME) of auth_type pam and HBA pam rules;
    #: PgBouncer's is always "pgbouncer".
    auth_pam_service: str = "pgbouncer"
    #: pgtarn's own: PAM and LDAP checks run on auth_threads threads (net/authpool.py), and
    #: at most auth_queue_size more wait for one: past that a login is refused. PgBouncer
    #: has one thread per method and a queue of 20.
    auth_threads: int = 4
    auth_queue_size: int = 20
    auth_user: str = ""
    auth_query: str = _AUTH_QUERY
    auth_dbname: str = ""
    syslog: bool = False
    syslog_ident: str = "pgbouncer"
    syslog_facility: str = "daemon"
    log_connections: bool = True
    log_disconnections: bool = True
    log_pooler_errors: bool = True
    log_stats: bool = True
    verbose: int = 0
    admin_users: tuple[str, ...] = ()
    stats_users: tuple[str, ...] = ()
    server_reset_query: str = "DISCARD ALL"
    server_reset_query_always: bool = False
    server_check_delay: float = 30.0
    server_check_query: str = "<empty>"  # "<empty>": send an empty query; "": no check
    server_fast_close: bool = False
    server_lifetime: float = 3600.0
    server_idle_timeout: float = 600.0
    server_connect_timeout: float = 15.0
    server_login_retry: float = 15.0
    client_login_timeout: float = 60.0
    autodb_idle_timeout: float = 3600.0
    #: A pool with no clients, no servers (and no min_pool_size) is dropped after this; 0: never.
    pool_idle_timeout: float = 0.0
    dns_max_ttl: float = 15.0
    dns_nxdomain_ttl: float = 15.0
    dns_zone_check_period: float = 0.0
    resolv_conf: str = ""
    query_wait_notify: int = 5  # seconds; an integer in PgBouncer
    login_notify_message: str = ""  # a NOTICE each client gets at login (empty: none)
    query_timeout: float = 0.0
    query_wait_timeout: float = 120.0
    cancel_wait_timeout: float = 10.0
    client_idle_timeout: float = 0.0
    idle_transaction_timeout: float = 0.0
    transaction_timeout: float = 0.0
    suspend_timeout: float = 10.0
    client_tls_sslmode: str = "disable"
    client_tls_key_file: str = ""
    client_tls_cert_file: str = ""
    client_tls_ca_file: str = ""
    client_tls_protocols: str = "secure"
    client_tls_ciphers: str = "default"
    client_tls13_ciphers: str = ""
    client_tls_ecdhcurve: str = "auto"
    client_tls_dheparams: str = "auto"
    server_tls_sslmode: str = "prefer"
    server_tls_ca_file: str = ""
    server_tls_key_file: str = ""
    server_tls_cert_file: str = ""
    server_tls_protocols: str = "secure"
    server_tls_ciphers: str = "default"
    server_tls13_ciphers: str = ""
    #: pgtarn's own: SCRAM-SHA-256-PLUS towards PostgreSQL over TLS (disable, prefer, require).
    server_channel_binding: str = "prefer"
    pkt_buf: int = 4096
    max_packet_size: int = 2147483647
    #: pgtarn's own: a client message longer than this is passed on in pieces as it
    #: arrives, never held whole (PgBouncer forwards every message in pkt_buf pieces).
    client_message_buffer: int = 262144
    listen_backlog: int = 128
    sbuf_loopcnt: int = 5
    so_reuseport: bool = False
    tcp_defer_accept: bool = _LINUX
    tcp_socket_buffer: int = 0
    tcp_keepalive: bool = True
    tcp_keepcnt: int = 0
    tcp_keepidle: int = 0
    tcp_keepintvl: int = 0
    tcp_user_timeout: int = 0  # milliseconds
    metrics_listen_addr: str = ""
    metrics_port: int = 0
    #: Transaction and statement mode: follow each client's session state (settings
    #: replayed, what cannot move pins the client to its server); 0: as PgBouncer.
    track_session_state: bool = True
    #: 0: what would pin a client is refused (0A000) instead.
    pin_session_state: bool = True
    #: Transaction and statement mode: notifications held for one client (its LISTENs are
    #: answered by pgtarn, one listener connection per pool); past it the client is closed.
    listen_queue_size: int = 1000
    #: Transaction and statement mode: a channel the pool's listener connection LISTENs to
    #: for schema changes made outside pgtarn (an event trigger's pg_notify): each
    #: notification renews the shared prepared statements. "": off.
    schema_change_channel: str = ""
    log_format: str = "text"
    workers: int = 1
    path: str = ""
    databases: Mapping[str, DatabaseEntry] = field(default_factory=_empty_map, hash=False)
    users: Mapping[str, UserEntry] = field(default_factory=_empty_map, hash=False)
    peers: Mapping[int, PeerEntry] = field(default_factory=_no_peers, hash=False)
    warnings: tuple[str, ...] = ()

    @classmethod
    def default(cls) -> Config:
        """All settings at PgBouncer's defaults, no databases, no users."""
        return cls()

    def __repr__(self) -> str:
        # Deliberately short: never shows connection strings or passwords.
        return (
            f"Config(path={self.path!r}, listen_addr={self.listen_addr!r}, "
            f"listen_port={self.listen_port}, pool_mode={self.pool_mode!r}, "
            f"databases={list(self.databases)!r}, users={list(self.users)!r}, "
            f"warnings={len(self.warnings)})"
        )

    def is_admin_database(self, name: str) -> bool:
        """Whether a client asking for database name gets the admin console."""
        return name in ADMIN_DATABASES and name not in self.databases

    def find_database(self, name: str) -> DatabaseEntry | None:
        """The entry for `name`, else NAME's read-only alias (`name` is NAME_ro, NAME splits
        reads from writes), else one made from the `*` fallback, else None.

        From `*`, the copy gets `name`; its dbname is `name` too unless `*` sets dbname.
        """
        entry = self.databases.get(name)
        if entry is not None and name != "*":
            return entry
        alias = self.read_only_aliases.get(name)
        if alias is not None:
            return alias
        auto = self.databases.get("*")
        if auto is None:
            return None
        return replace(auto, name=name, dbname=auto.dbname if auto.explicit_dbname else name)

    @cached_property
    def read_only_aliases(self) -> Mapping[str, DatabaseEntry]:
        """NAME_ro -> NAME's entry with that name and reads_only, for every NAME whose
        read_write_split is not off and that has no entry NAME_ro of its own.  Made once per
        Config (on first use) so that a login pays one dict lookup for it."""
        aliases = {
            name + READ_ONLY_SUFFIX: replace(db, name=name + READ_ONLY_SUFFIX, reads_only=True)
            for name, db in self.databases.items()
            if db.read_write_split != "off"
            and name != "*"
            and name + READ_ONLY_SUFFIX not in self.databases
        }
        return MappingProxyType(aliases)

    def pool_mode_for(self, db: DatabaseEntry, user: str) -> str:
        """Pool mode as PgBouncer picks it: `[users]` entry, else database entry, else global.

        `user` is the pool's user: the entry's forced `user=` if any, else the client's.
        """
        u = self.users.get(user)
        if u is not None and u.pool_mode is not None:
            return u.pool_mode
        return db.pool_mode if db.pool_mode is not None else self.pool_mode

    def pool_size_for(self, db: DatabaseEntry, user: str) -> int:
        """Pool size, same precedence: `[users]` pool_size, database pool_size, default."""
        u = self.users.get(user)
        if u is not None and u.pool_size is not None:
            return u.pool_size
        return db.pool_size if db.pool_size is not None else self.default_pool_size

    def min_pool_size_for(self, db: DatabaseEntry) -> int:
        """Database min_pool_size, else the global one."""
        return db.min_pool_size if db.min_pool_size is not None else self.min_pool_size

    def reserve_pool_size_for(self, db: DatabaseEntry, user: str) -> int:
        """Reserve pool size: `[users]`, database, then global."""
        u = self.users.get(user)
        if u is not None and u.reserve_pool_size is not None:
            return u.reserve_pool_size
        if db.reserve_pool_size is not None:
            return db.reserve_pool_size
        return self.reserve_pool_size

    def peer_pool_size_for(self, peer: PeerEntry) -> int:
        """How many cancels may be in flight to a peer: its pool_size, else default_pool_size."""
        return peer.pool_size if peer.pool_size is not None else self.default_pool_size

    def max_db_connections_for(self, db: DatabaseEntry) -> int:
        """Database max_db_connections if > 0, else the global one (0 = unlimited)."""
        n = db.max_db_connections
        return n if n is not None and n > 0 else self.max_db_connections

    def max_user_connections_for(self, user: str) -> int:
        """`[users]` max_user_connections if > 0, else the global one (0 = unlimited)."""
        u = self.users.get(user)
        n = u.max_user_connections if u is not None else None
        return n if n is not None and n > 0 else self.max_user_connections

    def max_db_client_connections_for(self, db: DatabaseEntry) -> int:
        """Database max_db_client_connections if > 0, else the global one (0 = unlimited)."""
        n = db.max_db_client_connections
        return n if n is not None and n > 0 else self.max_db_client_connections

    def max_user_client_connections_for(self, user: str) -> int:
        """`[users]` max_user_client_connections if > 0, else the global one (0 = unlimited)."""
        u = self.users.get(user)
        n = u.max_user_client_connections if u is not None else None
        return n if n is not None and n > 0 else self.max_user_client_connections

    def settings_rows(self) -> list[tuple[str, str, str, bool]]:
        """(key, value, default, changeable) for every setting, sorted as SHOW CONFIG."""
        return [
            (name, s.format(getattr(self, name)), s.format(s.default), s.changeable)
            for name, s in sorted(SETTINGS.items())
        ]

    def with_setting(self, key: str, value: str, where: str = "SET") -> Config:
        """A copy with one [pgbouncer] setting changed from its text form (admin SET)."""
        name = key.strip().lower()
        s = SETTINGS.get(name)
        if s is None:
            raise ConfigError(f"{where}: {key}: unknown setting")
        try:
            parsed = s.parse(value.strip())
        except ValueError as e:
            raise ConfigError(f"{where}: {name}: {e}") from None
        changes: dict[str, Any] = {name: parsed}
        return replace(self, **changes)


_NOT_SETTINGS = frozenset({"path", "databases", "users", "peers", "warnings"})
# CF_NO_RELOAD in PgBouncer: only read at startup, SHOW CONFIG says changeable = no.
_NO_RELOAD = frozenset({
    "disable_pqexec", "job_name", "listen_addr", "listen_backlog", "listen_port", "peer_id",
    "pidfile", "pkt_buf", "resolv_conf", "so_reuseport", "track_extra_parameters",
    "unix_socket_dir", "unix_socket_group", "unix_socket_mode", "user", "metrics_listen_addr",
    "metrics_port", "workers", "schema_change_channel",
})  # fmt: skip
_CHOICES: dict[str, tuple[str, ...]] = {
    "pool_mode": POOL_MODES, "auth_type": AUTH_TYPES, "client_tls_sslmode": SSLMODES,
    "server_tls_sslmode": SSLMODES, "log_format": ("text", "json"),
    "server_channel_binding": ("disable", "prefer", "require"),
}  # fmt: skip
_BOUNDS: dict[str, tuple[int, int | None]] = {
    "listen_port": (1, 65535), "metrics_port": (0, 65535), "peer_id": (0, MAX_PEER_ID),
    "unix_socket_mode": (0, 0o7777), "scram_iterations": (1, None), "workers": (1, None),
    "auth_threads": (1, 256), "auth_queue_size": (0, 100_000),
    "pkt_buf": (1, None), "max_packet_size": (1, 2**32 - 1), "listen_queue_size": (1, None),
    "client_message_buffer": (16384, 2**30),
}  # fmt: skip
_PGTARN_ONLY = frozenset(
    {
        "metrics_listen_addr",
        "metrics_port",
        "log_format",
        "workers",
        "auth_threads",
        "auth_queue_size",
        "auth_pam_service",
        "track_session_state",
        "pin_session_state",
        "listen_queue_size",
        "client_message_buffer",
        "schema_change_channel",
    }
)
DEPRECATED = {"service_name": "job_name"}  # old name -> current name

_INT_RE = re.compile(r"[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")  # C strtol, base 0
_DEC_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_BOOL_WORDS = {"on": True, "yes": True, "true": True, "off": False, "no": False, "false": False}
_SEP_RE = re.compile(r"[\s,]+")
#: ldapbindpasswd's value in auth_ldap_options (PgBouncer's syntax: auth/ldap.py), a secret.
_BIND_PASSWORD = re.compile(r'(ldapbindpasswd"?=)("(?:[^"]|"")*"?|[^\s,]*)')


def parse_int(text: str, c_style: bool = True) -> int:
    """Integer as PgBouncer's strtol(base 0): 0x.. hex, 0.. octal; or plain decimal."""
    if c_style and _INT_RE.fullmatch(text):
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        if digits[:2] in ("0x", "0X"):
            return sign * int(digits[2:], 16)
        return sign * (int(digits, 8) if digits.startswith("0") else int(digits))
    if not c_style and _DEC_RE.fullmatch(text):
        return int(text)
    raise ValueError(f"invalid integer {text!r}")


def parse_time(text: str) -> float:
    """Non-negative seconds, as PgBouncer: a decimal number, no unit suffix."""
    if not _FLOAT_RE.fullmatch(text):
        raise ValueError(f"invalid time {text!r} (seconds, e.g. 30 or 0.5)")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"invalid time {text!r}")
    return value


def parse_bool(text: str) -> bool:
    """PgBouncer stores booleans as integers (nonzero = on); on/off, yes/no, true/false too."""
    word = _BOOL_WORDS.get(text.lower())
    if word is not None:
        return word
    try:
        return parse_int(text) != 0
    except ValueError:
        raise ValueError(f"invalid boolean {text!r}") from None


def _cpu_count() -> int:
    """workers = auto: the CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(item for item in _SEP_RE.split(text) if item)


@dataclass(frozen=True)
class Setting:
    """How one [pgbouncer] key is parsed, its default and whether RELOAD/SET may change it."""

    name: str
    kind: str  # "str" | "int" | "bool" | "time" | "list" | "enum" | "mode"
    default: object
    changeable: bool
    choices: tuple[str, ...] = ()
    bounds: tuple[int, int | None] = (0, None)
    pgtarn_only: bool = False

    def parse(self, text: str) -> object:
        """Typed value from the ini text; ValueError with a short reason if invalid."""
        kind = self.kind
        if kind == "str":
            if self.name == "auth_dbname" and text == ADMIN_DATABASES[0]:
                raise ValueError(RESERVED_AUTH_DBNAME.format(text))
            return text
        if kind == "list":
            return _parse_list(text)
        if kind == "bool":
            return parse_bool(text)
        if kind == "time":
            return parse_time(text)
        if kind == "enum":
            low = text.lower()
            if low not in self.choices:
                raise ValueError(f"invalid value {text!r}; expected {'|'.join(self.choices)}")
            return low
        if self.name == "workers" and text.strip().lower() == "auto":
            return _cpu_count()
        if kind == "mode":
            digits = text[2:] if text[:2] in ("0o", "0O") else text
            if not re.fullmatch(r"[0-7]+", digits):
                raise ValueError(f"invalid octal mode {text!r}")
            value = int(digits, 8)
        else:
            value = parse_int(text)
        lo, hi = self.bounds
        if value < lo or (hi is not None and value > hi):
            limit = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
            raise ValueError(f"value {text} out of range (must be {limit})")
        return value

    def format(self, value: object) -> str:
        """The value as SHOW CONFIG shows it (ldapbindpasswd's value masked)."""
        if self.name == "auth_ldap_options" and isinstance(value, str):
            return _BIND_PASSWORD.sub(r"\1********", value)
        if isinstance(value, bool):
            return "1" if value else "0"
        if self.kind == "mode" and isinstance(value, int):
            return f"0{value:o}"
        if isinstance(value, float):
            return f"{value:g}"
        if isinstance(value, tuple):
            return ",".join(str(v) for v in value)
        return str(value)


def _kind_of(name: str, default: object) -> str:
    if name in _CHOICES:
        return "enum"
    if name == "unix_socket_mode":
        return "mode"
    for typ, kind in ((bool, "bool"), (int, "int"), (float, "time"), (tuple, "list")):
        if isinstance(default, typ):
            return kind
    return "str"


SETTINGS: dict[str, Setting] = {
    f.name: Setting(
        name=f.name,
        kind=_kind_of(f.name, f.default),
        default=f.default,
        changeable=f.name not in _NO_RELOAD,
        choices=_CHOICES.get(f.name, ()),
        bounds=_BOUNDS.get(f.name, (0, None)),
        pgtarn_only=f.name in _PGTARN_ONLY,
    )
    for f in fields(Config)
    if f.name not in _NOT_SETTINGS
}
