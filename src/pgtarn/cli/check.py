"""`pgtarn check CONFIG`: a configuration read as startup reads it, every problem listed.

For CI pipelines and Kubernetes init containers: the settings, [databases], [users] and
[peers], the auth_file, auth_hba_file and auth_ident_file, and the TLS files (their
contexts built as startup builds them). Nothing listens, connects or is written.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..auth.hba import load_hba, load_ident
from ..auth.pam import SERVICE_DIRS, unavailable
from ..auth.userlist import read_userlist_file
from ..config.inifile import read_config_report
from ..config.settings import Config
from ..errors import ConfigError, Problems
from ..net.ldapcheck import check_ldap_config
from ..net.tls import client_context, own_certificate_hash, server_context

#: The files each side's TLS context is made from (startup reads them unless its sslmode
#: is disable).
_TLS_FILES = {
    "client": ("client_tls_cert_file", "client_tls_key_file", "client_tls_ca_file"),
    "server": ("server_tls_cert_file", "server_tls_key_file", "server_tls_ca_file"),
}
_LEADING_NAME = re.compile(r"[a-z_]+")


@dataclass
class CheckResult:
    """What `pgtarn check` found: errors (startup would refuse) and warnings, each
    `file:line: message` (or `file: message` where no line is to blame)."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class _Checker:
    """The checks after the ini itself, each error placed at the line of its setting."""

    def __init__(self, config: Config, origins: Mapping[str, str], result: CheckResult):
        self.config, self.origins, self.result = config, origins, result
        self.pam_rules = False  # the HBA file has a pam rule

    def where(self, setting: str) -> str:
        """file:line where `setting` was set; the configuration file for a default."""
        return self.origins.get(setting, self.config.path)

    def error(self, setting: str, message: str) -> None:
        self.result.errors.append(f"{self.where(setting)}: {setting}: {message}")

    def located(self, exc: ConfigError) -> None:
        """A ConfigError that starts with the setting it is about, placed at that setting."""
        message = str(exc)
        name = _LEADING_NAME.match(message)
        self.result.errors.append(f"{self.where(name.group() if name else '')}: {message}")

    def readable(self, setting: str, path: str) -> bool:
        try:
            with open(path, "rb"):
                return True
        except OSError as exc:
            self.error(setting, f"cannot read {path!r}: {exc.strerror or exc}")
            return False

    def userlist(self) -> None:
        path = self.config.auth_file
        if not path:
            return
        try:
            _entries, warnings = read_userlist_file(path)
        except OSError as exc:
            self.error("auth_file", f"cannot read {path!r}: {exc.strerror or exc}")
            return
        self.result.warnings.extend(warnings)

    def hba(self) -> None:
        problems = Problems(collect=True)
        rules = None
        if self.config.auth_hba_file and self.readable("auth_hba_file", self.config.auth_hba_file):
            rules = load_hba(self.config.auth_hba_file, problems)
            self.result.warnings.extend(rules.warnings)
            self.pam_rules = any(rule.method == "pam" for rule in rules.rules)
        try:
            check_ldap_config(self.config, rules)
        except ConfigError as exc:
            self.located(exc)
        if self.config.auth_ident_file and self.readable(
            "auth_ident_file", self.config.auth_ident_file
        ):
            load_ident(self.config.auth_ident_file, problems)
        self.result.errors.extend(problems.errors)

    def pam(self) -> None:
        """With auth_type = pam or an HBA pam rule: libpam loads, and the service has a
        file (without one, Linux-PAM quietly uses its "other" service)."""
        config = self.config
        if config.auth_type != "pam" and not (config.auth_type == "hba" and self.pam_rules):
            return
        reason = unavailable()
        if reason is not None:
            self.error("auth_type", f"PAM is not available: {reason}")
        service = config.auth_pam_service
        if not any(os.path.isfile(os.path.join(d, service)) for d in SERVICE_DIRS):
            self.result.warnings.append(
                f"{self.where('auth_pam_service')}: auth_pam_service: no PAM service file "
                f'"{service}" in {" or ".join(SERVICE_DIRS)}: PAM uses its "other" service'
            )

    def tls(self) -> None:
        builds: dict[str, Callable[[Config], object]] = {
            "client": client_context,
            "server": server_context,
        }
        for side, build in builds.items():
            if getattr(self.config, f"{side}_tls_sslmode") == "disable":
                continue
            files = [(name, getattr(self.config, name)) for name in _TLS_FILES[side]]
            # a list, not a generator: every unreadable file is reported, not the first
            if not all([self.readable(name, path) for name, path in files if path]):
                continue  # the context would only fail again on the same file
            try:
                build(self.config)
                if side == "client":
                    own_certificate_hash(self.config)
            except ConfigError as exc:
                self.located(exc)


def check_config(path: str) -> CheckResult:
    """Everything startup would refuse in the configuration at `path`, and its warnings."""
    report = read_config_report(path)
    # a key that is no setting is a mistake (a misspelling): startup only warns, as PgBouncer
    unknown = set(report.unknown)
    result = CheckResult(
        [*report.errors, *report.unknown], [w for w in report.config.warnings if w not in unknown]
    )
    if not os.path.isfile(path):
        return result  # nothing was read: the defaults are not worth checking
    checker = _Checker(report.config, report.origins, result)
    checker.userlist()
    checker.hba()
    checker.pam()
    checker.tls()
    return result


def _as_warning(warning: str) -> str:
    """`file:line: message` as `file:line: warning: message`."""
    where, sep, message = warning.partition(": ")
    return f"{where}: warning: {message}" if sep else f"warning: {warning}"


def _count(items: list[str], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgtarn check",
        description="Check a pgbouncer.ini as startup would (settings, databases, users, "
        "auth_file, HBA and ident files, TLS files) without starting anything. Prints every "
        "problem as file:line: message; exits 1 when there is an error.",
    )
    parser.add_argument("config", help="pgbouncer.ini-format configuration file")
    return parser


def run_check(argv: list[str]) -> int:
    """`pgtarn check CONFIG`: every problem on stdout; 1 when there is an error, else 0."""
    args = build_parser().parse_args(argv)
    result = check_config(args.config)
    for error in result.errors:
        print(error)
    for warning in result.warnings:
        print(_as_warning(warning))
    summary = f"{_count(result.errors, 'error')}, {_count(result.warnings, 'warning')}"
    if result.errors:
        print(f"pgtarn check: {args.config}: {summary}")
        return 1
    print(f"pgtarn check: {args.config}: ok" + (f" ({summary})" if result.warnings else ""))
    return 0
