"""The settings reference page, from config.SETTINGS, the parser's keys and the descriptions."""

from __future__ import annotations

from collections.abc import Mapping

from ..config import inifile as configfile
from ..config.settings import DEPRECATED, SETTINGS, Setting
from ..descriptions import DATABASE_KEYS, PEER_KEYS, USER_KEYS, KeyDoc
from ..descriptions import SETTINGS as DOCS
from .markdown import GENERATED, cell, code

#: Defaults that depend on the platform pgtarn runs on, as the page states them.
PLATFORM_DEFAULTS = {"tcp_defer_accept": "`1` on Linux, `0` elsewhere"}

_KINDS = {
    "str": "text",
    "int": "integer",
    "bool": "boolean (`1`/`0`, `on`/`off`, `yes`/`no`, `true`/`false`)",
    "time": "seconds (a decimal number)",
    "list": "comma-separated list",
    "mode": "octal file mode",
}

INTRO = """\
# Settings reference

{generated}

Every setting of the `[pgbouncer]` section (which pgtarn also reads under the name
`[pgtarn]`), then the keys of `[databases]`, `[users]` and `[peers]` lines. For each:

- **Type** and **default**, the default as `SHOW CONFIG` prints it;
- **Changes**: whether `RELOAD` (or SIGHUP) and the admin console's `SET` change it on a
  running pgtarn, or only a restart does;
- **Origin**: a PgBouncer setting with the same meaning, a PgBouncer setting that pgtarn
  treats differently (the difference stated), or pgtarn's own;
- settings pgtarn reads but does not act on say so; set to anything but their default, each
  is a warning at startup and in `pgtarn check`.

A misspelt or unknown setting is a warning at startup (it is ignored, as PgBouncer does) and
an error in `pgtarn check`.
"""


def kind_of(setting: Setting) -> str:
    """A setting's type as the page states it."""
    if setting.kind == "enum":
        return "one of " + ", ".join(code(c) for c in setting.choices)
    text = _KINDS[setting.kind]
    if setting.name == "workers":
        return "integer, or `auto`"
    lo, hi = setting.bounds
    if setting.kind == "int" and (lo, hi) != (0, None):
        return f"{text}, {lo} to {hi}" if hi is not None else f"{text}, at least {lo}"
    return text


def default_of(setting: Setting) -> str:
    """The default as SHOW CONFIG formats it, or how it depends on the platform."""
    if setting.name in PLATFORM_DEFAULTS:
        return PLATFORM_DEFAULTS[setting.name]
    text = setting.format(setting.default)
    return code(text) if text else "empty"


def _origin(setting: Setting, differs: str) -> str:
    if setting.pgtarn_only:
        return "pgtarn's own"
    if not_applied(setting.name):
        return "PgBouncer's; pgtarn reads it and does not act on it"
    if differs:
        return f"PgBouncer's, with a difference: {differs}"
    return "PgBouncer's, same meaning"


def not_applied(name: str) -> str:
    """Why a setting is read and not acted on (configfile.NOT_APPLIED), or ""."""
    why = configfile.NOT_APPLIED.get(name)
    if why is None:
        return ""
    return why.removeprefix("not applied: ")


def _setting(name: str) -> list[str]:
    setting, doc = SETTINGS[name], DOCS[name]
    changes = "RELOAD, SIGHUP and admin `SET`" if setting.changeable else "restart only"
    lines = [
        f"### {name}",
        "",
        f"- **Type**: {kind_of(setting)}",
        f"- **Default**: {default_of(setting)}",
        f"- **Changes**: {changes}",
        f"- **Origin**: {_origin(setting, doc.differs)}",
    ]
    old = [old for old, new in sorted(DEPRECATED.items()) if new == name]
    if old:
        lines.append(
            "- **Also read as**: "
            + ", ".join(code(o) for o in old)
            + " (deprecated, with a warning)"
        )
    lines += ["", doc.text]
    why = not_applied(name)
    if why:
        lines += ["", f"**Read, not applied by pgtarn**: {why}."]
    return [*lines, ""]


def sections() -> dict[str, list[str]]:
    """Setting names by section, sections in the order of their first setting in Config."""
    out: dict[str, list[str]] = {}
    for name in SETTINGS:
        out.setdefault(DOCS[name].section, []).append(name)
    return out


def _summary(groups: Mapping[str, list[str]]) -> list[str]:
    lines = ["## At a glance", "", "| Setting | Default | Changes | Origin |", "|---|---|---|---|"]
    for names in groups.values():
        for name in names:
            setting = SETTINGS[name]
            origin = (
                "pgtarn"
                if setting.pgtarn_only
                else "PgBouncer, differs"
                if DOCS[name].differs
                else "PgBouncer"
            )
            if not_applied(name):
                origin += ", not applied"
            default = (
                default_of(setting)
                if len(setting.format(setting.default)) <= 40
                else "(long, see below)"
            )
            lines.append(
                f"| [{name}](#{name}) | {cell(default)} | "
                f"{'reload' if setting.changeable else 'restart'} | {origin} |"
            )
    return [*lines, ""]


def _keys(section: str, intro: str, keys: Mapping[str, KeyDoc]) -> list[str]:
    lines = [f"## [{section}]", "", intro, ""]
    for key, doc in sorted(keys.items()):
        origin = (
            "pgtarn's own"
            if doc.pgtarn_only
            else f"PgBouncer's, with a difference: {doc.differs}"
            if doc.differs
            else "PgBouncer's, same meaning"
        )
        lines += [
            f"### {key} {{#{section}-{key}}}",
            "",
            f"- **Type**: {doc.kind}",
            f"- **Default**: {doc.default}",
            f"- **Origin**: {origin}",
            "",
            doc.text,
            "",
        ]
    return lines


DATABASES_INTRO = """\
A line `name = key=value ...` makes a database clients can ask for by `name`; the values may
be single-quoted. The name `*` is the fallback for names without a line of their own, and
`pgbouncer` is kept for the admin console. A key not listed here stops the start (or the
RELOAD, which keeps the old configuration) with the file, line and key. RELOAD applies
changes: servers whose connection settings changed are replaced as they are released."""

USERS_INTRO = """\
A line `user = key=value ...` sets values for the pools of that user (the pool's user: a
database's forced `user=` if any). A user's value wins over the database's, which wins over
the global setting."""

PEERS_INTRO = """\
A line `peer_id = key=value ...` names another pooler of the group that `peer_id` makes
(pgtarn or PgBouncer 1.21 and later): a CancelRequest whose key carries that id is passed on
to it. A line for this instance's own id is allowed and not used. RELOAD applies changes."""


def render() -> str:
    """The whole page."""
    groups = sections()
    lines = [INTRO.format(generated=GENERATED), *_summary(groups)]
    for section, names in groups.items():
        lines += [f"## {section}", ""]
        for name in names:
            lines += _setting(name)
    lines += _keys("databases", DATABASES_INTRO, DATABASE_KEYS)
    lines += _keys("users", USERS_INTRO, USER_KEYS)
    lines += _keys("peers", PEERS_INTRO, PEER_KEYS)
    return "\n".join(lines).rstrip("\n") + "\n"
