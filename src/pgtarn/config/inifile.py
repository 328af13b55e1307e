"""Reading PgBouncer's pgbouncer.ini (sections, %include, connection strings) into a Config.

Long: one reader for one file format (sections, %include, connection strings, [users], [peers])
whose parts share the line and error-position handling.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, TypeVar

from ..errors import ConfigError, Problems
from .settings import (
    DEPRECATED,
    LOAD_BALANCE_HOSTS,
    MAX_PEER_ID,
    POOL_MODES,
    READ_WRITE_SPLIT,
    SETTINGS,
    TARGET_SESSION_ATTRS,
    Config,
    DatabaseEntry,
    PeerEntry,
    UserEntry,
    parse_bool,
    parse_int,
    parse_time,
)

_T = TypeVar("_T")
MAX_INCLUDE_DEPTH = 10  # as PgBouncer: at most 10 nested %include levels


def parse_connstr(text: str) -> list[tuple[str, str]]:
    """Split `key=value key='quoted value' ...` into pairs, in order.

    As PgBouncer: whitespace separates pairs and may surround '='; a value may be
    single-quoted, with '' for a quote; empty values are rejected.  As libpq,
    \\' and \\\\ inside quotes also stand for ' and \\ (any other backslash is kept).
    Raises ValueError on a syntax error.
    """
    pairs: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            return pairs
        start = i
        while i < n and text[i] != "=" and not text[i].isspace():
            i += 1
        key = text[start:i]
        while i < n and text[i].isspace():
            i += 1
        if i >= n or text[i] != "=" or not key:
            raise ValueError(f"syntax error near {text[start : start + 20]!r}: expected key=value")
        i += 1
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == "'":
            i += 1
            buf: list[str] = []
            while True:
                if i >= n:
                    raise ValueError(f"{key}: unterminated quoted string")
                ch = text[i]
                if ch == "'" and text[i + 1 : i + 2] == "'":
                    buf.append("'")
                    i += 2
                elif ch == "'":
                    i += 1
                    break
                elif ch == "\\" and text[i + 1 : i + 2] in ("'", "\\"):
                    buf.append(text[i + 1])
                    i += 2
                else:
                    buf.append(ch)
                    i += 1
            if i < n and not text[i].isspace():
                raise ValueError(f"{key}: unexpected {text[i]!r} after quoted value")
            value = "".join(buf)
        else:
            start = i
            while i < n and not text[i].isspace():
                i += 1
            value = text[start:i]
        if not value:
            raise ValueError(f"{key}: empty value")
        pairs.append((key, value))


def quote_connstr_value(value: str) -> str:
    """`value` single-quoted so that parse_connstr gives it back unchanged."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


_DB_PARAMS = {
    "client_encoding": "client_encoding",
    "datestyle": "DateStyle",
    "timezone": "TimeZone",
    "application_name": "application_name",
}
_DB_KEYS = frozenset({
    "host", "port", "dbname", "user", "password", "auth_user", "auth_dbname", "auth_query",
    "pool_size", "min_pool_size", "reserve_pool", "reserve_pool_size", "pool_mode",
    "max_db_connections", "max_db_client_connections", "connect_query", "server_lifetime",
    "query_wait_timeout", "load_balance_hosts", "target_session_attrs", *_DB_PARAMS,
    # pgtarn's own: read/write split
    "read_write_split", "max_replica_lag", "primary_reads", "read_your_writes",
    "health_check_period",
})  # fmt: skip
_USER_KEYS = frozenset({
    "pool_mode", "pool_size", "reserve_pool", "reserve_pool_size", "max_user_connections",
    "max_user_client_connections", "query_timeout", "query_wait_timeout",
    "transaction_timeout", "idle_transaction_timeout", "client_idle_timeout",
})  # fmt: skip


class _Params:
    """Typed access to the pairs of one connection string."""

    def __init__(self, text: str, known: frozenset[str], what: str) -> None:
        self.values: dict[str, str] = {}
        for key, value in parse_connstr(text):
            key = key.lower()
            if key not in known:
                raise ValueError(f"unknown {what} parameter {key!r}")
            self.values[key] = value  # a repeated key: later wins

    def get_str(self, key: str) -> str | None:
        return self.values.get(key)

    def get_int(self, key: str, *alias: str) -> int | None:
        for k in (key, *alias):
            if k in self.values:
                value = parse_int(self.values[k], c_style=False)
                if value < 0:
                    raise ValueError(f"{k}: must be >= 0, got {value}")
                return value
        return None

    def get_time(self, key: str) -> float | None:
        text = self.values.get(key)
        return None if text is None else parse_time(text)

    def get_choice(self, key: str, choices: tuple[str, ...]) -> str | None:
        text = self.values.get(key)
        if text is not None and text.lower() not in choices:
            raise ValueError(f"{key}: invalid value {text!r}; expected {'|'.join(choices)}")
        return None if text is None else text.lower()

    def get_bool(self, key: str, default: bool) -> bool:
        text = self.values.get(key)
        if text is None:
            return default
        try:
            return parse_bool(text)
        except ValueError as e:
            raise ValueError(f"{key}: {e}") from None


# PostgreSQL's units for memory and time settings, case-sensitive as PostgreSQL's are
# (1024-based); pgtarn's own keys take them, PgBouncer's settings take plain numbers.
_BYTE_UNITS = {"": 1, "kB": 1024, "MB": 1024**2, "GB": 1024**3}
_TIME_UNITS = {"ms": 0.001, "s": 1.0, "min": 60.0}
_QUANTITY_RE = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)")
_WHOLE_RE = re.compile(r"[+-]?[0-9]+")  # a negative one is refused before


def _quantity(key: str, text: str, units: Mapping[str, float]) -> tuple[str, float, str]:
    """(number as written, its value, unit) of `text`: a number, then one of `units` (none
    when "" is one of them), a space between them allowed as PostgreSQL does."""
    m = _QUANTITY_RE.fullmatch(text.strip())
    value = float(m.group(1)) if m is not None else math.nan
    if m is None or not math.isfinite(value):
        raise ValueError(f"{key}: invalid value {text!r}")
    unit = m.group(2)
    if unit not in units:
        valid = ", ".join(u for u in units if u)
        hint = (
            " (units are case-sensitive, as in PostgreSQL)"
            if unit.lower() in {u.lower() for u in units}
            else ""
        )
        raise ValueError(f"{key}: invalid unit {unit!r}{hint}; valid units: {valid}")
    return m.group(1), value, unit


def _replica_lag(text: str | None) -> tuple[int | None, float | None]:
    """max_replica_lag: (bytes of WAL, None) or (None, seconds); (None, None) when unset."""
    if text is None:
        return None, None
    number, value, unit = _quantity("max_replica_lag", text, {**_BYTE_UNITS, **_TIME_UNITS})
    if value < 0:
        raise ValueError(f"max_replica_lag: must be >= 0, got {text}")
    if unit in _TIME_UNITS:
        return None, value * _TIME_UNITS[unit]
    if not _WHOLE_RE.fullmatch(number):
        raise ValueError(f"max_replica_lag: bytes must be a whole number, got {text!r}")
    return int(number) * _BYTE_UNITS[unit], None


_PERIOD_UNITS = {"": 1.0, **_TIME_UNITS}


def _period(key: str, text: str | None, default: float) -> float:
    """A time in seconds, plain or with a unit of _TIME_UNITS; > 0."""
    if text is None:
        return default
    _number, value, unit = _quantity(key, text, _PERIOD_UNITS)
    seconds = value * _PERIOD_UNITS[unit]
    if seconds <= 0:
        raise ValueError(f"{key}: must be > 0, got {text}")
    return seconds


def _database_entry(name: str, connstr: str, loc: str) -> DatabaseEntry:
    p = _Params(connstr, _DB_KEYS, "connection")
    hosts: tuple[str, ...] = ()
    if "host" in p.values:
        hosts = tuple(h.strip() for h in p.values["host"].split(","))
        if not all(hosts):
            raise ValueError(f"host: empty host name in {p.values['host']!r}")
    ports = _ports(p.values.get("port"), len(hosts))
    port = ports[0] if ports else None
    dbname = p.get_str("dbname")
    lag_bytes, lag_seconds = _replica_lag(p.get_str("max_replica_lag"))
    return DatabaseEntry(
        name=name,
        host=hosts[0] if hosts else None,
        hosts=hosts,
        port=5432 if port is None else port,
        ports=ports if len(ports) > 1 else (),
        dbname=dbname or name,
        user=p.get_str("user"),
        password=p.get_str("password"),
        auth_user=p.get_str("auth_user"),
        auth_dbname=p.get_str("auth_dbname"),
        auth_query=p.get_str("auth_query"),
        pool_size=p.get_int("pool_size"),
        min_pool_size=p.get_int("min_pool_size"),
        reserve_pool_size=p.get_int("reserve_pool_size", "reserve_pool"),
        pool_mode=p.get_choice("pool_mode", POOL_MODES),
        max_db_connections=p.get_int("max_db_connections"),
        max_db_client_connections=p.get_int("max_db_client_connections"),
        server_lifetime=p.get_time("server_lifetime"),
        query_wait_timeout=p.get_time("query_wait_timeout"),
        load_balance_hosts=p.get_choice("load_balance_hosts", LOAD_BALANCE_HOSTS),
        target_session_attrs=p.get_choice("target_session_attrs", TARGET_SESSION_ATTRS),
        connect_query=p.get_str("connect_query"),
        read_write_split=p.get_choice("read_write_split", READ_WRITE_SPLIT) or "off",
        max_replica_lag_bytes=lag_bytes,
        max_replica_lag_seconds=lag_seconds,
        primary_reads=p.get_bool("primary_reads", True),
        read_your_writes=p.get_bool("read_your_writes", True),
        health_check_period=_period("health_check_period", p.get_str("health_check_period"), 1.0),
        startup_params=MappingProxyType(
            {pg: p.values[k] for k, pg in _DB_PARAMS.items() if k in p.values}
        ),
        line=loc,
        connstr=connstr,
        explicit_dbname=dbname is not None,
    )


def _ports(text: str | None, hosts: int) -> tuple[int, ...]:
    """A port, or libpq's port list: one per host, or one for all."""
    if text is None:
        return ()
    ports = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or not 1 <= int(item) <= 65535:
            raise ValueError(f"port: invalid port {text!r}")
        ports.append(int(item))
    if len(ports) > 1 and len(ports) != max(hosts, 1):
        raise ValueError(f"port: {len(ports)} ports for {hosts} hosts; give one, or one per host")
    return tuple(ports)


def _user_entry(name: str, text: str, loc: str) -> UserEntry:
    p = _Params(text, _USER_KEYS, "user")
    return UserEntry(
        name=name,
        pool_mode=p.get_choice("pool_mode", POOL_MODES),
        pool_size=p.get_int("pool_size"),
        reserve_pool_size=p.get_int("reserve_pool_size", "reserve_pool"),
        max_user_connections=p.get_int("max_user_connections"),
        max_user_client_connections=p.get_int("max_user_client_connections"),
        query_timeout=p.get_time("query_timeout"),
        query_wait_timeout=p.get_time("query_wait_timeout"),
        transaction_timeout=p.get_time("transaction_timeout"),
        idle_transaction_timeout=p.get_time("idle_transaction_timeout"),
        client_idle_timeout=p.get_time("client_idle_timeout"),
        line=loc,
    )


_PEER_KEYS = frozenset({"host", "port", "pool_size"})


def _peer_entry(name: str, text: str, loc: str) -> PeerEntry:
    """A [peers] line: `peer_id = host=... port=... pool_size=...`."""
    try:
        peer_id = parse_int(name, c_style=False)
    except ValueError:
        raise ValueError(
            f"a peer's name is its peer_id, a number from 1 to {MAX_PEER_ID}"
        ) from None
    if not 1 <= peer_id <= MAX_PEER_ID:
        raise ValueError(f"peer_id out of range (must be between 1 and {MAX_PEER_ID})")
    p = _Params(text, _PEER_KEYS, "peer")
    ports = _ports(p.values.get("port"), 1)
    pool_size = p.get_int("pool_size")
    if pool_size == 0:
        raise ValueError("pool_size: must be >= 1 (cancels in flight to the peer at once)")
    return PeerEntry(
        peer_id=peer_id,
        host=p.get_str("host"),
        port=ports[0] if ports else 6432,
        pool_size=pool_size,
        line=loc,
    )


_SECTIONS = {
    "databases": "databases",
    "users": "users",
    "pgbouncer": "pgbouncer",
    "pgtarn": "pgbouncer",
    "peers": "peers",
}
_SECTION_RE = re.compile(r"\[([^\]]*)\]\s*([;#].*)?")


def _read_file(path: str, where: str) -> str:
    try:
        with open(path, encoding="utf-8-sig") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{where}cannot read {path!r}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}{path}: not valid UTF-8: {e.reason}") from None


def _resolve_include(target: str, including: str) -> str:
    """Relative names are looked up next to the including file first, then (as
    PgBouncer does) relative to the current directory."""
    target = os.path.expanduser(target)
    if os.path.isabs(target):
        return target
    beside = os.path.join(os.path.dirname(including), target)
    return beside if os.path.exists(beside) or not os.path.exists(target) else target


def _lines(
    text: str, path: str, stack: tuple[str, ...], problems: Problems
) -> Iterator[tuple[str, int, str]]:
    """(file, line number, stripped line) for every line, with %include expanded; a bad
    %include goes to `problems` and, when they are collected, is skipped."""
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if line.startswith("%include") and (len(line) == 8 or line[8].isspace()):
            try:
                resolved, sub = _include(line[8:].strip(), f"{path}:{lineno}", path, stack)
            except ConfigError as e:
                problems.add(e)
                continue
            yield from _lines(sub, resolved, (*stack, os.path.realpath(resolved)), problems)
        else:
            yield path, lineno, line


def _include(target: str, loc: str, path: str, stack: tuple[str, ...]) -> tuple[str, str]:
    """The path and text of the file an `%include target` line at `loc` names."""
    if not target:
        raise ConfigError(f"{loc}: %include: missing file name")
    if len(stack) > MAX_INCLUDE_DEPTH:
        raise ConfigError(f"{loc}: %include: nesting deeper than {MAX_INCLUDE_DEPTH}")
    resolved = _resolve_include(target, path)
    if os.path.realpath(resolved) in stack:
        raise ConfigError(f"{loc}: %include: include loop via {target!r}")
    return resolved, _read_file(resolved, f"{loc}: %include: ")


def _split_key(line: str, loc: str) -> tuple[str, str]:
    """`name = value` -> (name, value); the name may be '…' or "…" quoted ("" = ")."""
    if line[0] in "\"'":
        quote, i, parts = line[0], 1, []
        while True:
            j = line.find(quote, i)
            if j < 0:
                raise ConfigError(f"{loc}: unterminated quoted name")
            parts.append(line[i:j])
            if quote == '"' and line[j + 1 : j + 2] == '"':
                parts.append('"')
                i = j + 2
                continue
            break
        key, rest = "".join(parts), line[j + 1 :].lstrip()
    else:
        eq = line.find("=")
        key, rest = (line, "") if eq < 0 else (line[:eq].strip(), line[eq:])
        if any(c.isspace() for c in key):
            raise ConfigError(f"{loc}: syntax error: expected 'name = value' in {line[:40]!r}")
    if not key or not rest.startswith("="):
        raise ConfigError(f"{loc}: syntax error: expected 'name = value' in {line[:40]!r}")
    return key, rest[1:].strip()


def load_config(path: str) -> Config:
    """Read and check a pgbouncer.ini; ConfigError names file:line: key on failure."""
    return parse_config(_read_file(path, ""), path)


def parse_config(text: str, path: str = "<string>") -> Config:
    """Parse ini text; `%include` names are relative to dirname(path). The first error
    raises ConfigError."""
    return _Reader(path, Problems()).read(text).config


@dataclass(frozen=True)
class ConfigReport:
    """A configuration read to its end: what could be read (a setting or entry in error
    left out), every error in order, and the file:line where each setting was set."""

    config: Config
    errors: tuple[str, ...]
    origins: Mapping[str, str]
    #: [pgbouncer] keys that are no setting (also among the config's warnings): startup
    #: ignores them, as PgBouncer does; `pgtarn check` calls them errors.
    unknown: tuple[str, ...] = ()


def read_config_report(path: str) -> ConfigReport:
    """Read a pgbouncer.ini collecting every error instead of stopping at the first."""
    try:
        text = _read_file(path, "")
    except ConfigError as e:
        return ConfigReport(Config(path=path), (str(e),), MappingProxyType({}))
    return parse_config_report(text, path)


def parse_config_report(text: str, path: str = "<string>") -> ConfigReport:
    """parse_config, collecting every error instead of raising the first."""
    return _Reader(path, Problems(collect=True)).read(text)


_SKIPPED = "?"  # the section of lines under a bad header, when errors are collected


class _Reader:
    """One reading of an ini text: the lines in order into settings and entries; each
    error goes to `problems` (raised there, or collected and the line left out)."""

    def __init__(self, path: str, problems: Problems) -> None:
        self.path, self.problems = path, problems
        self.values: dict[str, Any] = {}
        self.origins: dict[str, str] = {}
        self.databases: dict[str, DatabaseEntry] = {}
        self.users: dict[str, UserEntry] = {}
        self.peers: dict[int, PeerEntry] = {}
        self.warnings: list[str] = []
        self.unknown: list[str] = []
        self.section: str | None = None
        self.seen_main = False

    def read(self, text: str) -> ConfigReport:
        stack = (os.path.realpath(self.path),)
        for fname, lineno, line in _lines(text, self.path, stack, self.problems):
            if not line or line[0] in ";#":
                continue
            try:
                self._line(f"{fname}:{lineno}", line)
            except ConfigError as e:
                self.problems.add(e)
        if not self.seen_main:
            self.warnings.append(f"{self.path}: no [pgbouncer] section; using defaults")
        config = replace(
            Config(
                path=self.path,
                databases=MappingProxyType(self.databases),
                users=MappingProxyType(self.users),
                peers=MappingProxyType(self.peers),
            ),
            **self.values,
        )
        self.warnings.extend(_cross_check(config, self.origins))
        return ConfigReport(
            replace(config, warnings=tuple(self.warnings)),
            tuple(self.problems.errors),
            MappingProxyType(self.origins),
            tuple(self.unknown),
        )

    def _line(self, loc: str, line: str) -> None:
        if line[0] == "[":
            self.section = _SKIPPED  # until the header is known good
            m = _SECTION_RE.fullmatch(line)
            if m is None:
                raise ConfigError(f"{loc}: syntax error in section header {line!r}")
            section = _SECTIONS.get(m.group(1).strip().lower())
            if section is None:
                raise ConfigError(f"{loc}: [{m.group(1)}]: unknown section")
            self.section = section
            self.seen_main = self.seen_main or section == "pgbouncer"
            return
        key, value = _split_key(line, loc)
        if self.section is None:
            raise ConfigError(f"{loc}: {key}: setting outside of any section")
        try:
            self._entry(self.section, key, value, loc)
        except ValueError as e:
            raise ConfigError(f"{loc}: {e}") from None

    def _entry(self, section: str, key: str, value: str, loc: str) -> None:
        """One `key = value` of a section; ValueError says what is wrong, key first."""
        if section == "databases":
            if key == "pgbouncer":
                raise ValueError(
                    f"{key}: database name 'pgbouncer' is reserved for the admin console"
                )
            self.databases[key] = _keyed(key, _database_entry, key, value, loc)
        elif section == "users":
            self.users[key] = _keyed(key, _user_entry, key, value, loc)
        elif section == "peers":
            peer = _keyed(key, _peer_entry, key, value, loc)
            self.peers[peer.peer_id] = peer
        elif section == "pgbouncer":
            name = key.lower()
            if name in DEPRECATED:
                self.warnings.append(f"{loc}: {key}: deprecated, use {DEPRECATED[name]}")
                name = DEPRECATED[name]
            setting = SETTINGS.get(name)
            if setting is None:
                message = f"{loc}: {key}: unknown setting, ignored{_did_you_mean(name)}"
                self.warnings.append(message)
                self.unknown.append(message)
                return
            self.values[name] = _keyed(name, setting.parse, value)
            self.origins[name] = loc


def load_close_matches() -> Callable[..., list[str]]:
    """difflib's get_close_matches, imported at the first unknown setting: difflib would
    otherwise sit in the memory of every pooler, whose configuration has no misspelt name."""
    from difflib import get_close_matches  # lazy, for the memory (see the docstring)

    return get_close_matches


def _did_you_mean(name: str) -> str:
    """A setting whose name is close to a misspelt one, as a hint ("" when none is)."""
    close = load_close_matches()(name, [*SETTINGS, *DEPRECATED], n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _keyed(key: str, parse: Callable[..., _T], *args: str) -> _T:
    """parse(*args), its ValueError prefixed with the key it is about."""
    try:
        return parse(*args)
    except ValueError as e:
        raise ValueError(f"{key}: {e}") from None


#: PgBouncer settings pgtarn reads but does not act on, and why: set to anything but their
#: default, each is a warning at startup and in `pgtarn check`, never silence.
NOT_APPLIED: Mapping[str, str] = MappingProxyType(
    {
        "application_name_add_host": "not applied: application_name goes to servers as the "
        "client set it",
        "client_tls_dheparams": "not applied: OpenSSL's built-in groups are used",
        "conffile": "not applied: RELOAD and SIGHUP read the file pgtarn was started with",
        "disable_pqexec": "not applied: simple queries with several statements are passed on",
        "dns_max_ttl": "not applied: host names are resolved by the system at each connection",
        "dns_nxdomain_ttl": "not applied: host names are resolved by the system at each connection",
        "dns_zone_check_period": "not applied: host names are resolved by the system at each "
        "connection",
        "resolv_conf": "not applied: host names are resolved by the system's resolver",
        "job_name": "not applied: a Windows service name in PgBouncer",
        "pkt_buf": "not applied: client_message_buffer says how much of a client's message "
        "pgtarn holds (longer ones go on in pieces)",
        "sbuf_loopcnt": "not applied: pgtarn reads each socket until it is empty",
        "server_round_robin": "not applied: idle servers are reused most recently used first",
        "suspend_timeout": "not applied: SUSPEND waits for nothing",
        "tcp_defer_accept": "not applied: connections are accepted at once",
        "unix_socket_group": "not applied: the socket keeps pgtarn's group (unix_socket_mode "
        "applies)",
    }
)


def _cross_check(cfg: Config, origins: Mapping[str, str]) -> list[str]:
    """Soft checks PgBouncer does not enforce but that are very likely mistakes."""
    out: list[str] = []

    def warn(key: str, msg: str) -> None:
        out.append(f"{origins.get(key, cfg.path)}: {key}: {msg}")

    needs_users = cfg.auth_type in ("md5", "scram-sha-256", "plain", "trust")
    if needs_users and not cfg.auth_file and not cfg.auth_user:
        warn("auth_type", f"{cfg.auth_type} needs users from auth_file or auth_user")
    if cfg.auth_type == "hba" and not cfg.auth_hba_file:
        warn("auth_type", "hba needs auth_hba_file")
    if cfg.min_pool_size > cfg.default_pool_size:
        warn("min_pool_size", f"{cfg.min_pool_size} > default_pool_size {cfg.default_pool_size}")
    for db in cfg.databases.values():
        size = db.pool_size if db.pool_size is not None else cfg.default_pool_size
        if cfg.min_pool_size_for(db) > size:
            out.append(f"{db.line}: {db.name}: min_pool_size {cfg.min_pool_size_for(db)} > "
                       f"pool size {size}")  # fmt: skip
    if cfg.peers and not cfg.peer_id:
        warn("peer_id", "[peers] is set but peer_id is 0: cancels are not forwarded")
    if not cfg.listen_addr and not cfg.unix_socket_dir:
        warn("listen_addr", "neither listen_addr nor unix_socket_dir is set; nothing to listen on")
    for name, why in NOT_APPLIED.items():
        if name in origins and getattr(cfg, name) != SETTINGS[name].default:
            warn(name, why)
    return out
