"""Parse the pg_hba.conf and pg_ident.conf subset pgtarn supports and pick the rule that applies."""

from __future__ import annotations

import ipaddress
import os.path
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pgtarn.errors import ConfigError, Problems

from .ldap import LDAP_OPTIONS, LdapOptions, ldap_options

__all__ = [
    "AddressRange",
    "HbaRule",
    "HbaRules",
    "IdentEntry",
    "IdentMaps",
    "NamePattern",
    "load_hba",
    "load_ident",
    "parse_hba",
    "parse_ident",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_BLANK = " \t\r\f\v"
_MAX_INCLUDE_DEPTH = 10  # as PostgreSQL: stops @file loops
# hostgssenc never matches and hostnogssenc matches every TCP connection: pgtarn has no GSSAPI
# encryption, so no client can ever be using it.
_CONN_TYPES = frozenset({"local", "host", "hostssl", "hostnossl", "hostgssenc", "hostnogssenc"})
_METHODS = frozenset(
    {"trust", "reject", "md5", "password", "scram-sha-256", "cert", "peer", "pam", "ldap"}
)
# Accepted so that a PostgreSQL file loads, but such rules reject: failing closed is safe.
_UNSUPPORTED_METHODS = frozenset({"gss", "sspi", "radius", "ident", "bsd"})
_MAP_METHODS = frozenset({"ident", "peer", "gss", "sspi", "cert"})
_OPTIONS = (
    frozenset(
        {
            "map",
            "clientcert",
            "clientname",
            "include_realm",
            "compat_realm",
            "upn_username",
            "krb_realm",
            "pamservice",
            "pam_use_hostname",
            "radiusserver",
            "radiusservers",
            "radiussecret",
            "radiussecrets",
            "radiusidentifier",
            "radiusidentifiers",
            "radiusport",
            "radiusports",
        }
    )
    | LDAP_OPTIONS
)
_INCLUDE_DIRECTIVES = frozenset({"include", "include_if_exists", "include_dir"})
_MAPPED_IPV4_PREFIX = 0xFFFF << 32
_ALL_96_BITS = (1 << 96) - 1


def _error(path: str, line: int, what: str) -> ConfigError:
    return ConfigError(f"{path}:{line}: {what}")


class _Token(NamedTuple):
    text: str
    quoted: bool  # any double quote in it: keywords and @file lose their meaning
    path: str
    line: int


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each line, joining lines that end in a backslash."""
    pending: list[str] = []
    start = 1
    for number, raw in enumerate(text.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending.append(raw[:-1])
            continue
        pending.append(raw)
        yield start, "".join(pending)
        pending = []
    if pending:
        yield start, "".join(pending)


def _split_fields(line: str, path: str, lineno: int) -> list[list[_Token]]:
    """The whitespace-separated fields of a line, each a comma-separated list of tokens."""
    fields: list[list[_Token]] = []
    items: list[_Token] = []
    i, end = 0, len(line)
    while True:
        # Stray commas are skipped, and "a, b" is one list: both as PostgreSQL does.
        while i < end and (line[i] in _BLANK or line[i] == ","):
            i += 1
        if i >= end or line[i] == "#":
            break
        chars: list[str] = []
        quoted = in_quote = False
        while i < end:
            ch = line[i]
            if in_quote:
                if line.startswith('""', i):  # a doubled quote is a literal one
                    chars.append('"')
                    i += 1
                elif ch == '"':
                    in_quote = False
                else:
                    chars.append(ch)
            elif ch == '"':
                in_quote = quoted = True
            elif ch in _BLANK or ch in ",#":
                break
            else:
                chars.append(ch)
            i += 1
        if in_quote:
            raise _error(path, lineno, "unterminated quoted string")
        items.append(_Token("".join(chars), quoted, path, lineno))
        ahead = i
        while ahead < end and line[ahead] in _BLANK:
            ahead += 1
        if ahead < end and line[ahead] == ",":  # "a , b" is one list too, as PgBouncer reads it
            i = ahead + 1
            continue
        fields.append(items)
        items = []
    if items:
        fields.append(items)
    return fields


def _compile(pattern: str, path: str, line: int) -> re.Pattern[str]:
    # PostgreSQL uses POSIX (Spencer ARE) regular expressions; pgtarn uses Python's re, which
    # agrees on common patterns but not on every class or escape. Search is unanchored in both.
    try:
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        raise _error(path, line, f'invalid regular expression "{pattern}": {exc}') from None


@dataclass(frozen=True)
class NamePattern:
    """One entry of a database or user field: a keyword, a literal name or a /regex."""

    text: str
    keyword: bool = False
    regex: re.Pattern[str] | None = None

    def matches_name(self, name: str) -> bool:
        if self.regex is not None:
            return self.regex.search(name) is not None
        return not self.keyword and self.text == name


@dataclass(frozen=True)
class AddressRange:
    """The address field of a host rule: a network as integers, so any netmask works."""

    text: str
    version: int
    network: int
    mask: int

    def contains(self, address: IPAddress) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        value = int(address)
        if address.version == self.version:
            return (value ^ self.network) & self.mask == 0
        if address.version == 4 and self.mask >> 32 == _ALL_96_BITS:
            # A rule written as ::ffff:a.b.c.d/n speaks of IPv4 clients in their mapped form.
            return ((_MAPPED_IPV4_PREFIX | value) ^ self.network) & self.mask == 0
        return False


@dataclass(frozen=True)
class HbaRule:
    """One pg_hba.conf line; `method` is "reject" when the written method is unsupported."""

    line: int
    conn_type: str
    databases: tuple[NamePattern, ...]
    users: tuple[NamePattern, ...]
    address: AddressRange | None  # None: a local rule, or `all`
    method: str
    map_name: str | None = None
    clientcert: str | None = None  # "verify-ca" or "verify-full"
    unsupported_method: str | None = None
    ldap: LdapOptions | None = None  # an ldap rule's options

    def matches(
        self,
        *,
        local: bool,
        tls: bool,
        database: str,
        user: str,
        address: IPAddress | None,
        replication: bool = False,
    ) -> bool:
        if (self.conn_type == "local") != local or self.conn_type == "hostgssenc":
            return False
        if (self.conn_type == "hostssl" and not tls) or (self.conn_type == "hostnossl" and tls):
            return False
        if self.address is not None and (address is None or not self.address.contains(address)):
            return False
        return any(_database_matches(p, database, user, replication) for p in self.databases) and (
            any(p.keyword or p.matches_name(user) for p in self.users)
        )


def _database_matches(pattern: NamePattern, database: str, user: str, replication: bool) -> bool:
    if pattern.keyword and pattern.text == "replication":
        return replication
    if replication:  # a physical replication connection matches only the replication keyword
        return False
    if pattern.keyword:
        return pattern.text == "all" or database == user  # all, sameuser
    return pattern.matches_name(database)


@dataclass(frozen=True)
class HbaRules:
    """A parsed pg_hba.conf: its rules in order, and warnings naming file:line."""

    rules: tuple[HbaRule, ...]
    warnings: tuple[str, ...] = ()

    def match(
        self,
        *,
        local: bool,
        tls: bool,
        database: str,
        user: str,
        address: IPAddress | None,
        replication: bool = False,
    ) -> HbaRule | None:
        """The first rule that applies to the connection, or None (no pg_hba.conf entry)."""
        for rule in self.rules:
            if rule.matches(
                local=local,
                tls=tls,
                database=database,
                user=user,
                address=address,
                replication=replication,
            ):
                return rule
        return None


def _expand(tokens: Sequence[_Token], read_file: Callable[[str], str], depth: int) -> list[_Token]:
    """The tokens with each unquoted @file replaced by all the tokens of that file."""
    out: list[_Token] = []
    for token in tokens:
        if token.quoted or len(token.text) < 2 or not token.text.startswith("@"):
            out.append(token)
            continue
        if depth >= _MAX_INCLUDE_DEPTH:
            raise _error(token.path, token.line, f'@file nesting too deep at "{token.text}"')
        name = os.path.join(os.path.dirname(token.path), token.text[1:])
        try:
            text = read_file(name)
        except (OSError, UnicodeError) as exc:
            raise _error(token.path, token.line, f'cannot read "{name}": {exc}') from None
        for line, logical in _logical_lines(text):
            for field in _split_fields(logical, name, line):
                out.extend(_expand(field, read_file, depth + 1))
    return out


def _name_pattern(token: _Token, keywords: frozenset[str]) -> NamePattern:
    if not token.quoted and token.text in keywords:
        return NamePattern(token.text, keyword=True)
    if token.text.startswith("/"):  # PostgreSQL 16: a regex, quoted or not
        return NamePattern(token.text, regex=_compile(token.text[1:], token.path, token.line))
    return NamePattern(token.text)


def _database_pattern(token: _Token) -> NamePattern:
    if not token.quoted and token.text in ("samerole", "samegroup"):
        raise _error(
            token.path,
            token.line,
            f'"{token.text}" is not supported: pgtarn cannot know role membership',
        )
    return _name_pattern(token, frozenset({"all", "sameuser", "replication"}))


def _user_pattern(token: _Token) -> NamePattern:
    if not token.quoted and token.text.startswith("+"):
        raise _error(
            token.path,
            token.line,
            f'group "{token.text}" is not supported: pgtarn cannot know role membership',
        )
    return _name_pattern(token, frozenset({"all"}))


class _LineFields:
    """The fields of one line, read in order, with errors naming the line."""

    def __init__(self, fields: list[list[_Token]], path: str, line: int):
        self.fields, self.path, self.line, self.next = fields, path, line, 0

    def error(self, what: str) -> ConfigError:
        return _error(self.path, self.line, what)

    def take(self, what: str) -> list[_Token]:
        if self.next >= len(self.fields):
            raise self.error(f"end of line before the {what} field")
        self.next += 1
        return self.fields[self.next - 1]

    def take_one(self, what: str) -> _Token:
        tokens = self.take(what)
        if len(tokens) != 1:
            raise self.error(f"multiple values in the {what} field")
        return tokens[0]

    def rest(self) -> list[_Token]:
        return [token for field in self.fields[self.next :] for token in field]


def _parse_address(fields: _LineFields) -> AddressRange | None:
    token = fields.take_one("address")
    text = token.text
    if not token.quoted and text == "all":
        return None
    if not token.quoted and text in ("samehost", "samenet"):
        raise fields.error(f'"{text}" is not supported')
    host, slash, prefix = text.partition("/")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if slash:
            raise fields.error(f'invalid IP address "{text}"') from None
        raise fields.error(
            f'"{text}" is not an IP address, and host names are not supported'
        ) from None
    bits = address.max_prefixlen
    if slash:
        if re.fullmatch("[0-9]{1,3}", prefix) is None or int(prefix) > bits:
            raise fields.error(f'invalid CIDR mask in address "{text}"')
        mask = (1 << bits) - (1 << (bits - int(prefix)))
    else:
        mask_text = fields.take_one("IP mask").text
        try:
            netmask = ipaddress.ip_address(mask_text)
        except ValueError:
            raise fields.error(f'invalid IP mask "{mask_text}"') from None
        if netmask.version != address.version:
            raise fields.error(f'IP address "{text}" and mask "{mask_text}" do not match')
        mask = int(netmask)  # as PostgreSQL, a mask need not be contiguous
        text = f"{text} {mask_text}"
    return AddressRange(text, address.version, int(address) & mask, mask)


def _parse_rule(fields: _LineFields, read_file: Callable[[str], str]) -> HbaRule:
    conn_type = fields.take_one("connection type").text
    if conn_type in _INCLUDE_DIRECTIVES:
        raise fields.error(f'"{conn_type}" directives are not supported')
    if conn_type not in _CONN_TYPES:
        raise fields.error(f'invalid connection type "{conn_type}"')
    databases = tuple(map(_database_pattern, _expand(fields.take("database"), read_file, 0)))
    users = tuple(map(_user_pattern, _expand(fields.take("user"), read_file, 0)))
    address = None if conn_type == "local" else _parse_address(fields)
    written = fields.take_one("authentication method").text
    # As PostgreSQL: ident on a unix socket means peer.
    method = "peer" if written == "ident" and conn_type == "local" else written
    if method not in _METHODS and method not in _UNSUPPORTED_METHODS:
        raise fields.error(f'invalid authentication method "{written}"')
    if method == "peer" and conn_type != "local":
        raise fields.error("peer authentication is only supported on local sockets")
    if method == "cert" and conn_type == "local":
        # (PgBouncer also takes cert on a host line, PostgreSQL on hostssl only: a connection
        # without TLS that a host line matches has no certificate, and is refused)
        raise fields.error("cert authentication is only supported on host and hostssl lines")
    if method in ("gss", "sspi") and conn_type == "local":
        raise fields.error(f"{method} authentication is not supported on local sockets")
    if conn_type == "hostgssenc" and method not in ("gss", "trust", "reject"):
        raise fields.error("GSSAPI encryption only supports gss, trust, or reject authentication")
    options: dict[str, str] = {}
    ldap_pairs: list[tuple[str, str]] = []  # in order: a later one overrides an ldapurl's
    for token in fields.rest():
        name, equals, value = token.text.partition("=")
        if not equals:
            raise fields.error(f'authentication option "{token.text}" is not in name=value format')
        if name not in _OPTIONS:
            raise fields.error(f'unrecognized authentication option name "{name}"')
        if name in LDAP_OPTIONS:
            if method != "ldap":
                raise fields.error(
                    f'option "{name}" is not valid for authentication method "{written}"'
                )
            ldap_pairs.append((name, value))
        options[name] = value
    ldap = None
    if method == "ldap":
        try:
            ldap = ldap_options(ldap_pairs)
        except ValueError as exc:
            raise fields.error(str(exc)) from None
    if "map" in options and method not in _MAP_METHODS:
        raise fields.error(f'option "map" is not valid for authentication method "{written}"')
    clientcert = options.get("clientcert")
    if clientcert is not None:
        if conn_type != "hostssl":
            raise fields.error('clientcert can only be configured for "hostssl" rows')
        if clientcert not in ("verify-ca", "verify-full"):
            raise fields.error(f'invalid clientcert "{clientcert}": use verify-ca or verify-full')
        if method == "cert" and clientcert != "verify-full":
            raise fields.error("clientcert only accepts verify-full with cert authentication")
    if method == "cert":
        clientcert = "verify-full"  # a cert login always verifies the certificate fully
    unsupported = method if method in _UNSUPPORTED_METHODS else None
    if method == "pam" and ("pamservice" in options or options.get("pam_use_hostname", "0") != "0"):
        # pgtarn asks one service (auth_pam_service), and PAM_RHOST is always the address
        unsupported = "pam with " + (
            "pamservice" if "pamservice" in options else "pam_use_hostname"
        )
    return HbaRule(
        fields.line,
        conn_type,
        databases,
        users,
        address,
        "reject" if unsupported else method,
        options.get("map"),
        clientcert,
        unsupported,
        ldap,
    )


def parse_hba(
    text: str, path: str, read_file: Callable[[str], str], problems: Problems | None = None
) -> HbaRules:
    """Parse pg_hba.conf text; `read_file` reads @files (relative to `path`'s directory).

    Raises ConfigError naming file:line for anything pgtarn cannot honour as written;
    with collecting `problems`, every such line goes there instead and is left out.
    """
    problems = problems or Problems()
    rules: list[HbaRule] = []
    warnings: list[str] = []
    for line, logical in _logical_lines(text):
        try:
            fields = _split_fields(logical, path, line)
            rule = _parse_rule(_LineFields(fields, path, line), read_file) if fields else None
        except ConfigError as exc:
            problems.add(exc)
            continue
        if rule is None:
            continue
        rules.append(rule)
        if rule.unsupported_method is not None:
            warnings.append(
                f'{path}:{line}: authentication method "{rule.unsupported_method}" '
                "is not supported; this rule rejects the connections it matches"
            )
        if rule.conn_type == "hostgssenc":
            warnings.append(
                f"{path}:{line}: hostgssenc never matches: pgtarn has no GSSAPI encryption"
            )
    return HbaRules(tuple(rules), tuple(warnings))


@dataclass(frozen=True)
class IdentEntry:
    """One pg_ident.conf line: which system user may log in as which database user."""

    line: int
    system_user: str
    system_regex: re.Pattern[str] | None
    database_user: str
    database_any: bool = False  # database user `all`
    database_regex: re.Pattern[str] | None = None

    def allows(self, system_user: str, database_user: str) -> bool:
        found = None if self.system_regex is None else self.system_regex.search(system_user)
        if found is None and (self.system_regex is not None or self.system_user != system_user):
            return False
        if self.database_any:
            return True
        if self.database_regex is not None:
            return self.database_regex.search(database_user) is not None
        expected = self.database_user
        if found is not None and "\\1" in expected:
            group = found.group(1)
            if group is None:  # the group took no part in the match: PostgreSQL refuses too
                return False
            expected = expected.replace("\\1", group, 1)  # only the first, as PostgreSQL
        return expected == database_user


class IdentMaps:
    """A parsed pg_ident.conf: user name maps by map name."""

    def __init__(self, maps: Mapping[str, Sequence[IdentEntry]]):
        self.maps: Mapping[str, tuple[IdentEntry, ...]] = {k: tuple(v) for k, v in maps.items()}

    def allows(self, map_name: str, system_user: str, database_user: str) -> bool:
        """Whether map `map_name` lets `system_user` log in as `database_user`."""
        return any(
            entry.allows(system_user, database_user) for entry in self.maps.get(map_name, ())
        )


def parse_ident(text: str, path: str, problems: Problems | None = None) -> IdentMaps:
    """Parse pg_ident.conf text; ConfigError naming file:line for a bad line (with
    collecting `problems`, every bad line goes there instead and is left out)."""
    problems = problems or Problems()
    maps: dict[str, list[IdentEntry]] = {}
    for line, logical in _logical_lines(text):
        try:
            entry = _ident_entry(_split_fields(logical, path, line), path, line)
        except ConfigError as exc:
            problems.add(exc)
            continue
        if entry is not None:
            maps.setdefault(entry[0], []).append(entry[1])
    return IdentMaps(maps)


def _ident_entry(split: list[list[_Token]], path: str, line: int) -> tuple[str, IdentEntry] | None:
    """(map name, entry) of one pg_ident.conf line; None for an empty one."""
    if not split:
        return None
    fields = _LineFields(split, path, line)
    map_token = fields.take_one("map name")
    if not map_token.quoted and map_token.text in _INCLUDE_DIRECTIVES:
        raise fields.error(f'"{map_token.text}" directives are not supported')
    system = fields.take_one("system user").text
    database = fields.take_one("database user")
    if fields.rest():
        raise fields.error("extra fields after the database user")
    system_regex = _compile(system[1:], path, line) if system.startswith("/") else None
    database_regex = None
    if database.text.startswith("/"):
        database_regex = _compile(database.text[1:], path, line)
    elif not database.quoted and database.text.startswith("+"):
        raise fields.error(
            f'group "{database.text}" is not supported: pgtarn cannot know role membership'
        )
    elif "\\1" in database.text and system_regex is not None and system_regex.groups == 0:
        raise fields.error(f'"{database.text}" uses \\1 but "{system}" has no group')
    any_user = not database.quoted and database.text == "all"
    entry = IdentEntry(line, system, system_regex, database.text, any_user, database_regex)
    return map_token.text, entry


def _read_text(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "surrogateescape")


def _load(path: str) -> str:
    try:
        return _read_text(path)
    except OSError as exc:  # a ConfigError lets RELOAD keep the rules it has
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def load_hba(path: str, problems: Problems | None = None) -> HbaRules:
    """Read and parse the pg_hba.conf at `path` (auth_hba_file), with its @files."""
    return parse_hba(_load(path), path, _read_text, problems)


def load_ident(path: str, problems: Problems | None = None) -> IdentMaps:
    """Read and parse the pg_ident.conf at `path` (auth_ident_file)."""
    return parse_ident(_load(path), path, problems)
