"""The pgtarn(1) man page, from the command line's parsers and the settings' descriptions."""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping

from .. import __version__
from ..cli import check
from ..cli import command as cli
from ..config.settings import SETTINGS
from ..demo import command as demo
from ..descriptions import DATABASE_KEYS, PEER_KEYS, USER_KEYS, KeyDoc
from ..descriptions import SETTINGS as DOCS
from ..top import options as top
from .settings import default_of, kind_of, not_applied, sections

HEADER = (
    ".\\\" Generated from pgtarn's code by `python -m pgtarn.reference`: edit the code "
    "or src/pgtarn/descriptions/, not this file."
)

CONTAINER = (
    "The container image's entry point. Without a mounted /etc/pgtarn/pgbouncer.ini (or the "
    "file `PGTARN_CONFIG` names) it writes pgbouncer.ini and userlist.txt from the "
    "environment (`DATABASE_URL`, `POOL_MODE`, `DEFAULT_POOL_SIZE`, `PGBOUNCER_<SETTING>`, "
    "...), then runs pgtarn on them with the arguments given. `pgtarn container health` is "
    "the image's health check: an SSLRequest to 127.0.0.1 that pgtarn must answer."
)

SIGNALS = [
    (
        "SIGHUP",
        "Reload: the configuration, `auth_file`, the HBA and ident files and the TLS "
        "files are read again. An invalid file is logged and the old configuration "
        "kept.",
    ),
    (
        "SIGINT",
        "Shut down once every server is released (`SHUTDOWN WAIT_FOR_SERVERS`): the "
        "TCP listening sockets close, transactions under way finish.",
    ),
    ("SIGTERM", "Shut down once every client has left (`SHUTDOWN WAIT_FOR_CLIENTS`)."),
    ("SIGQUIT", "Exit at once, as does a second SIGINT or SIGTERM during a shutdown."),
    ("SIGUSR1", "`PAUSE`: wait for the transactions under way, then hold new work."),
    ("SIGUSR2", "`RESUME`."),
]

EXIT_STATUS = [
    (
        "0",
        "pgtarn stopped after a shutdown, or `--version`, `--help` and `pgtarn check` found "
        "no error.",
    ),
    (
        "1",
        "The configuration could not be loaded (the message names the file, line and key), "
        "or `pgtarn check` found an error.",
    ),
    ("2", "The command line was wrong."),
]

ENVIRONMENT = [
    (
        "PGTARN_PURE",
        "When installing: `PGTARN_PURE=1 pip install .` skips compiling the hot "
        "path with mypyc; pgtarn then runs as pure Python, with the same "
        "behaviour.",
    ),
    (
        "NOTIFY_SOCKET, LISTEN_FDS, LISTEN_PID",
        "Set by systemd: pgtarn reports its state "
        "(`Type=notify`) and serves the sockets systemd "
        "passes it (socket activation).",
    ),
]


def escape(text: str) -> str:
    """Plain text made safe inside a roff line: its backslashes."""
    return text.replace("\\", "\\e")


def roff(text: str) -> str:
    """A description (Markdown's `code` and **bold** only) as roff text."""
    out = []
    for part in re.split(r"(`[^`]+`|\*\*[^*]+\*\*)", text):
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append("\\fB" + escape(part[1:-1]).replace("-", "\\-") + "\\fR")
        elif part.startswith("**") and part.endswith("**") and len(part) > 3:
            out.append("\\fB" + escape(part[2:-2]) + "\\fR")
        else:
            out.append(escape(part))
    line = "".join(out)
    # a line opening with a dot or a quote would be read as a request
    return "\\&" + line if line.startswith((".", "'")) else line


def _tagged(tag: str, text: str) -> list[str]:
    return [".TP", tag, roff(text)]


def _usage(parser: argparse.ArgumentParser) -> str:
    usage = " ".join(parser.format_usage().removeprefix("usage: ").split())
    return escape(usage).replace("-", "\\-")


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"\\fI{escape(str(action.metavar or action.dest))}\\fR"
    flags = ", ".join(f"\\fB{flag}\\fR".replace("-", "\\-") for flag in action.option_strings)
    if action.nargs == 0:
        return flags
    metavar = action.metavar or action.dest.upper()
    return f"{flags} \\fI{escape(str(metavar))}\\fR"


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        lines += [".TP", _invocation(action), roff(action.help or "")]
    return lines


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """The parsers of `pgtarn demo`, `check` and `top`, by subcommand."""
    return {"demo": demo.build_parser(), "check": check.build_parser(), "top": top.build_parser()}


def _setting(name: str) -> list[str]:
    setting, doc = SETTINGS[name], DOCS[name]
    changes = "reload" if setting.changeable else "restart"
    tag = (
        f"\\fB{escape(name)}\\fR ({roff(kind_of(setting))}; default "
        f"{roff(default_of(setting))}; {changes})"
    )
    lines = _tagged(tag, doc.text)
    if setting.pgtarn_only:
        lines += [".IP", "pgtarn's own setting."]
    elif not_applied(name):
        lines += [".IP", roff(f"Read, not applied by pgtarn: {not_applied(name)}.")]
    elif doc.differs:
        lines += [".IP", roff(f"Difference from PgBouncer: {doc.differs}")]
    return lines


def _keys(section: str, keys: Mapping[str, KeyDoc]) -> list[str]:
    lines = [".SS", f"[{section}] keys"]
    for key, doc in sorted(keys.items()):
        tag = f"\\fB{escape(key)}\\fR ({roff(doc.kind)}; default {roff(doc.default)})"
        lines += _tagged(tag, doc.text)
        if doc.pgtarn_only:
            lines += [".IP", "pgtarn's own key."]
        elif doc.differs:
            lines += [".IP", roff(f"Difference from PgBouncer: {doc.differs}")]
    return lines


def render() -> str:
    """The whole page, in roff's man macros."""
    parser = cli.build_parser()
    lines = [
        HEADER,
        f'.TH PGTARN 1 "" "pgtarn {__version__}" "User Commands"',
        ".nh",  # no hyphenation: setting names and values stay whole
        ".SH NAME",
        "pgtarn \\- PostgreSQL connection pooler that reads PgBouncer's configuration",
        ".SH SYNOPSIS",
        _usage(parser),
    ]
    for sub in subcommands().values():
        lines += [".br", _usage(sub)]
    lines += [
        ".br",
        "pgtarn container [health | \\fIpgtarn arguments\\fR]",
        ".SH DESCRIPTION",
        roff(parser.description or ""),
        ".PP",
        roff(
            "The configuration is PgBouncer's: a `pgbouncer.ini` with `[pgbouncer]` "
            "(also read as `[pgtarn]`), `[databases]`, `[users]` and `[peers]` "
            "sections, and an `auth_file` such as `userlist.txt`. Every setting below "
            "keeps PgBouncer's name and default, with the differences stated."
        ),
        ".SH OPTIONS",
        *_options(parser),
        ".SH COMMANDS",
    ]
    for name, sub in subcommands().items():
        lines += [".SS", f"pgtarn {name}", roff(sub.description or ""), *_options(sub)]
    lines += [".SS", "pgtarn container", roff(CONTAINER)]
    lines += [".SH SIGNALS"]
    for signal, text in SIGNALS:
        lines += _tagged(f"\\fB{signal}\\fR", text)
    lines += [
        ".SH SETTINGS",
        roff(
            "`RELOAD` (or SIGHUP) and the admin console's `SET` change a setting "
            "marked reload on a running pgtarn; one marked restart needs a restart. A "
            "misspelt or unknown setting is a warning at startup and an error in "
            "`pgtarn check`."
        ),
    ]
    for section, names in sections().items():
        lines += [".SS", escape(section)]
        for name in names:
            lines += _setting(name)
    lines += _keys("databases", DATABASE_KEYS)
    lines += _keys("users", USER_KEYS)
    lines += _keys("peers", PEER_KEYS)
    lines += [".SH ENVIRONMENT"]
    for name, text in ENVIRONMENT:
        lines += _tagged(f"\\fB{name}\\fR", text)
    lines += [".SH EXIT STATUS"]
    for code, text in EXIT_STATUS:
        lines += _tagged(code, text)
    lines += [
        ".SH SEE ALSO",
        "\\fBpsql\\fR(1), \\fBpgbench\\fR(1), \\fBpgbouncer\\fR(1)",
        ".PP",
        roff(
            "The documentation site (`docs/` in the source tree, built with `mkdocs "
            "build`): getting started, pool modes, authentication and TLS, operations, "
            "migrating from PgBouncer, and the settings, admin console and metrics "
            "references."
        ),
    ]
    return "\n".join(lines) + "\n"
