"""PgBouncer's auth_file (userlist.txt): parse it, write its lines, classify its secrets."""

from __future__ import annotations

import enum
import logging

from pgtarn.auth.md5 import is_md5_secret
from pgtarn.auth.scram import parse_verifier

__all__ = [
    "SecretKind",
    "load_userlist",
    "parse_userlist",
    "read_userlist_file",
    "secret_kind",
    "userlist_line",
]

log = logging.getLogger("pgtarn.auth")

_BLANK = " \t\r\f\v"


class SecretKind(enum.Enum):
    """How a password in the auth_file is stored."""

    PLAIN = "plain"
    MD5 = "md5"
    SCRAM = "scram"


def secret_kind(secret: str) -> SecretKind:
    """Classify a stored secret: md5 hash, SCRAM verifier, or plaintext."""
    if is_md5_secret(secret):
        return SecretKind.MD5
    if parse_verifier(secret) is not None:
        return SecretKind.SCRAM
    return SecretKind.PLAIN


def _quoted(line: str, pos: int) -> tuple[str, int] | None:
    """Read a "..." field starting at `pos` ('""' is a literal quote).

    Returns the value and the index just past the closing quote, or None.
    """
    if pos >= len(line) or line[pos] != '"':
        return None
    value: list[str] = []
    i = pos + 1
    while i < len(line):
        ch = line[i]
        if ch == '"':
            if line.startswith('""', i):
                value.append('"')
                i += 2
                continue
            return "".join(value), i + 1
        value.append(ch)
        i += 1
    return None


def _skip_blank(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in _BLANK:
        pos += 1
    return pos


def _parse_line(line: str) -> tuple[str, str] | str:
    """The (user, secret) of one non-comment line, or a reason it is bad."""
    user = _quoted(line, _skip_blank(line, 0))
    if user is None:
        return "expected a double-quoted user name"
    name, pos = user
    after = _skip_blank(line, pos)
    if after == pos and after < len(line):
        return "expected white space after the user name"
    secret = _quoted(line, after)
    if secret is None:
        return "expected a double-quoted password after the user name"
    if not name:
        return "empty user name"
    return name, secret[0]  # anything after the password is ignored, as PgBouncer does


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_userlist(text: str, path: str = "") -> tuple[dict[str, str], list[str]]:
    """Parse auth_file contents into {user: secret} plus warnings naming bad lines
    (`line N: ...`, or `path:N: ...` when the file's path is given).

    Each line is `"user" "secret"` with further fields ignored; blank lines and
    lines starting with ';' or '#' are comments; a later entry for the same user
    replaces an earlier one (with a warning). Bad lines are skipped, not fatal.
    """
    entries: dict[str, str] = {}
    warnings: list[str] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        where = f"{path}:{lineno}" if path else f"line {lineno}"
        stripped = line.strip(_BLANK)
        if not stripped or stripped[0] in ";#":
            continue
        if not _is_utf8(line):
            warnings.append(f"{where}: not valid UTF-8, skipped")
            continue
        parsed = _parse_line(line)
        if isinstance(parsed, str):
            warnings.append(f"{where}: {parsed}, skipped")
            continue
        user, secret = parsed
        if user in entries:
            warnings.append(f'{where}: user "{user}" listed again, the later entry wins')
        entries[user] = secret
    return entries, warnings


def userlist_line(user: str, secret: str) -> str:
    """One auth_file line, newline included: both fields quoted, their quotes doubled."""
    return f"{_quote(user)} {_quote(secret)}\n"


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "surrogateescape")


def read_userlist_file(path: str) -> tuple[dict[str, str], list[str]]:
    """The entries and warnings (each naming path:line) of the auth_file at `path`;
    OSError if it cannot be read."""
    return parse_userlist(_read(path), path)


def load_userlist(path: str) -> dict[str, str]:
    """Read and parse the auth_file at `path`; OSError if it cannot be read.

    Parse warnings are logged on the "pgtarn.auth" logger, prefixed by the path.
    """
    entries, warnings = parse_userlist(_read(path))
    for warning in warnings:
        log.warning("%s: %s", path, warning)
    return entries
