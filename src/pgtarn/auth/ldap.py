"""LDAP authentication's options (auth_ldap_options, a pg_hba.conf ldap rule), read and checked.

The options are PostgreSQL's (auth-ldap.html), as PgBouncer takes them: simple bind mode
(ldapprefix, ldapsuffix: the DN to bind as is prefix + user name + suffix) or search+bind
mode (ldapbasedn, with ldapbinddn and ldapbindpasswd for the search, and ldapsearchattribute
or ldapsearchfilter: the one entry found is the DN to bind as), ldapserver (a space-separated
list), ldapport, ldapscheme (ldap or ldaps), ldaptls (StartTLS) and ldapurl (RFC 4516), which
sets several of them at once. Nothing here talks to a server (net/ldapcheck.py does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "LDAP_OPTIONS",
    "LdapOptions",
    "TlsPolicy",
    "ldap_options",
    "parse_ldap_conf",
    "parse_ldap_options",
    "split_ldap_options",
]

#: The option names of an ldap rule.
LDAP_OPTIONS = frozenset(
    {
        "ldapurl",
        "ldapserver",
        "ldapport",
        "ldapscheme",
        "ldaptls",
        "ldapbinddn",
        "ldapbindpasswd",
        "ldapsearchattribute",
        "ldapsearchfilter",
        "ldapbasedn",
        "ldapprefix",
        "ldapsuffix",
    }
)
_SEARCH_OPTIONS = (
    "ldapbasedn",
    "ldapbinddn",
    "ldapbindpasswd",
    "ldapsearchattribute",
    "ldapsearchfilter",
)
_SCOPES = {"": "base", "base": "base", "one": "one", "sub": "sub"}  # an URL's default: base
_DEFAULT_PORTS = {"ldap": 389, "ldaps": 636}
#: Characters a user name may not have in search+bind mode (as PostgreSQL): they would
#: change the search filter it is put in.
_FILTER_CHARS = frozenset("*()\\/")
_USERNAME = "$username"


@dataclass(frozen=True)
class LdapOptions:
    """The options of one ldap rule (or of auth_ldap_options), checked."""

    servers: tuple[str, ...]
    port: int = 0  # 0: the scheme's own (389, or 636 for ldaps)
    scheme: str = "ldap"
    starttls: bool = False  # ldaptls=1
    prefix: str | None = None
    suffix: str | None = None
    basedn: str | None = None  # set: search+bind mode
    binddn: str | None = None
    bindpasswd: str | None = field(default=None, repr=False)  # a secret: in no repr or log
    search_attribute: str | None = None
    search_filter: str | None = None
    scope: str = "sub"  # "base", "one" or "sub"

    @property
    def search(self) -> bool:
        """Search+bind mode (else simple bind)."""
        return self.basedn is not None

    @property
    def server_port(self) -> int:
        return self.port or _DEFAULT_PORTS[self.scheme]

    def bind_dn(self, user: str) -> str:
        """Simple bind mode: the DN the user binds as."""
        return f"{self.prefix or ''}{user}{self.suffix or ''}"

    def user_name_problem(self, user: str) -> str | None:
        """Search+bind mode: why this user name cannot go into the search filter, or None."""
        if self.search and any(c in _FILTER_CHARS for c in user):
            return "invalid character in user name for LDAP authentication"
        return None

    def search_filter_for(self, user: str) -> str:
        """Search+bind mode: the filter that finds the user's entry ($username in
        ldapsearchfilter replaced), in parentheses, which libldap lets a filter go without."""
        if self.search_filter is not None:
            text = self.search_filter.replace(_USERNAME, user)
        else:
            text = f"{self.search_attribute or 'uid'}={user}"
        return text if text.startswith("(") else f"({text})"


def split_ldap_options(text: str) -> list[tuple[str, str]]:
    """The name=value pairs of auth_ldap_options, in PgBouncer's syntax: separated by spaces
    or a comma; a name or value may be in double quotes (a doubled quote is a literal one),
    and nothing may stand between "=" and the value. ValueError says what is wrong."""
    pairs: list[tuple[str, str]] = []
    i, end = 0, len(text)
    while True:
        while i < end and (text[i].isspace() or text[i] == ","):
            i += 1
        if i >= end:
            return pairs
        name, i = _word(text, i, "=")
        if i >= end or text[i] != "=":
            raise ValueError(f'authentication option "{name}" is not in name=value format')
        i += 1
        if i < end and text[i].isspace():
            raise ValueError(f'authentication option "{name}": no space may follow "="')
        value, i = _word(text, i, " \t\r\n\f\v,")
        pairs.append((name, value))


def _word(text: str, i: int, stops: str) -> tuple[str, int]:
    """A quoted or bare word from text[i:] up to a character of stops; (word, where it ends)."""
    end = len(text)
    if i < end and text[i] == '"':
        chars: list[str] = []
        i += 1
        while i < end:
            if text.startswith('""', i):
                chars.append('"')
                i += 2
            elif text[i] == '"':
                return "".join(chars), i + 1
            else:
                chars.append(text[i])
                i += 1
        raise ValueError("unterminated quoted string in the LDAP options")
    start = i
    while i < end and text[i] not in stops:
        i += 1
    return text[start:i], i


def parse_ldap_options(text: str) -> LdapOptions:
    """auth_ldap_options, read and checked (ValueError says what is wrong)."""
    pairs = split_ldap_options(text)
    for name, _value in pairs:
        if name not in LDAP_OPTIONS:
            raise ValueError(f'invalid LDAP option: "{name}"')  # PgBouncer's words
    return ldap_options(pairs)


def ldap_options(pairs: Iterable[tuple[str, str]]) -> LdapOptions:
    """The options of an ldap rule from its name=value pairs, applied in order (a later one
    overrides what an earlier ldapurl set), checked as PostgreSQL checks them."""
    given: dict[str, str] = {}
    port, scope = 0, "sub"
    for name, value in pairs:
        if name == "ldapurl":
            url = _parse_url(value)
            given.update(url.options)
            port, scope = url.port, url.scope
        elif name == "ldapport":
            if not value.isdigit() or not 0 < int(value) <= 65535:
                raise ValueError(f'invalid LDAP port number: "{value}"')
            port = int(value)
        else:
            given[name] = value
    return _checked(given, port, scope)


@dataclass(frozen=True)
class _Url:
    options: Mapping[str, str]
    port: int  # 0: none in the URL
    scope: str


def load_unquote() -> Callable[[str], str]:
    """urllib.parse's unquote, imported at the first LDAP URL (ldapurl): urllib.parse would
    otherwise sit in the memory of every pooler, most of which never read one."""
    from urllib.parse import unquote  # lazy, for the memory (see the docstring)

    return unquote


def _parse_url(url: str) -> _Url:
    """What an RFC 4516 URL sets: ldap[s]://host[:port]/basedn[?attrs[?scope[?filter]]]."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f'could not parse LDAP URL "{url}": no scheme')
    scheme = scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f"unsupported LDAP URL scheme: {scheme}")
    hostport, _slash, query = rest.partition("/")
    unquote = load_unquote()
    parts = [unquote(part) for part in query.split("?")]
    parts += [""] * (4 - len(parts))
    dn, attrs, scope, search_filter = parts[:4]
    if scope.lower() not in _SCOPES:
        raise ValueError(f'could not parse LDAP URL "{url}": bad scope "{scope}"')
    host, port = _host_port(unquote(hostport), url)
    options = {"ldapscheme": scheme}
    if host:
        options["ldapserver"] = host
    if dn:
        options["ldapbasedn"] = dn
    if attrs:
        options["ldapsearchattribute"] = attrs.split(",")[0]  # only the first, as PostgreSQL
    if search_filter:
        options["ldapsearchfilter"] = search_filter
    return _Url(options, port, _SCOPES[scope.lower()])


def _host_port(hostport: str, url: str) -> tuple[str, int]:
    host, port = hostport, ""
    if hostport.startswith("["):  # [IPv6 address]:port
        host, bracket, rest = hostport[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f'could not parse LDAP URL "{url}": bad host')
        port = rest[1:]
    elif ":" in hostport:
        host, _colon, port = hostport.partition(":")
    if port and (not port.isdigit() or not 0 < int(port) <= 65535):
        raise ValueError(f'could not parse LDAP URL "{url}": bad port "{port}"')
    return host, int(port or 0)


def _checked(given: Mapping[str, str], port: int, scope: str) -> LdapOptions:
    scheme = given.get("ldapscheme", "ldap")
    if scheme not in _DEFAULT_PORTS:
        raise ValueError(f'invalid ldapscheme value: "{scheme}"')
    servers = tuple(given.get("ldapserver", "").split())
    if not servers:
        # PgBouncer and PostgreSQL built with OpenLDAP look for servers in DNS SRV records
        raise ValueError(
            'authentication method "ldap" requires argument "ldapserver" to be '
            "set (pgtarn does not look LDAP servers up in DNS)"
        )
    simple = "ldapprefix" in given or "ldapsuffix" in given
    if simple and any(name in given for name in _SEARCH_OPTIONS):
        raise ValueError("cannot mix options for simple bind and search+bind modes")
    if not simple and "ldapbasedn" not in given:
        raise ValueError(
            'authentication method "ldap" requires argument "ldapbasedn", '
            '"ldapprefix", or "ldapsuffix" to be set'
        )
    if "ldapsearchattribute" in given and "ldapsearchfilter" in given:
        raise ValueError("cannot use ldapsearchattribute together with ldapsearchfilter")
    return LdapOptions(
        servers=servers,
        port=port,
        scheme=scheme,
        starttls=given.get("ldaptls") == "1",
        prefix=given.get("ldapprefix"),
        suffix=given.get("ldapsuffix"),
        basedn=given.get("ldapbasedn"),
        binddn=given.get("ldapbinddn"),
        bindpasswd=given.get("ldapbindpasswd"),
        search_attribute=given.get("ldapsearchattribute"),
        search_filter=given.get("ldapsearchfilter"),
        scope=scope,
    )


@dataclass(frozen=True)
class TlsPolicy:
    """How the TLS of an ldaps or StartTLS connection checks the LDAP server's certificate,
    from libldap's own settings (ldap.conf and LDAPTLS_* variables), which PgBouncer and
    PostgreSQL follow through libldap."""

    verify: bool = True  # TLS_REQCERT demand, hard or try (libldap's default: demand)
    ca_file: str | None = None  # TLS_CACERT (None: the system's CAs)
    ca_dir: str | None = None  # TLS_CACERTDIR


def parse_ldap_conf(text: str, env: Mapping[str, str]) -> TlsPolicy:
    """The TLS policy an ldap.conf text sets, its LDAPTLS_* variables in env overriding it."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split(None, 1)
        if len(words) == 2 and not words[0].startswith("#"):
            found[words[0].upper()] = words[1].strip()
    for key in ("TLS_REQCERT", "TLS_CACERT", "TLS_CACERTDIR"):
        if env.get(f"LDAP{key}"):
            found[key] = env[f"LDAP{key}"]
    # never and allow go on with any certificate; try fails on a bad one, as demand does
    verify = found.get("TLS_REQCERT", "demand").lower() not in ("never", "allow")
    return TlsPolicy(verify, found.get("TLS_CACERT"), found.get("TLS_CACERTDIR"))
