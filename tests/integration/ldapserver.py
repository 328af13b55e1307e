"""A throwaway OpenLDAP server (slapd) for the LDAP authentication tests, with its directory."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from tests.support import free_port

from .certs import Pki

SLAPD = "/usr/sbin/slapd"
SCHEMA_DIR = "/etc/ldap/schema"
BASE_DN = "dc=example,dc=net"
PEOPLE = f"ou=people,{BASE_DN}"
ADMIN_DN = f"cn=admin,{BASE_DN}"
ADMIN_PASSWORD = "admin_secret"
#: The account search+bind mode searches as: anonymous clients may only bind, not search.
SEARCHER_DN = f"cn=searcher,{BASE_DN}"
SEARCHER_PASSWORD = "searcher_secret"
#: Directory users and their LDAP passwords: the same as their PostgreSQL roles' (conftest),
#: since the password LDAP accepted is the one pgtarn's servers log in with.
USERS = {"app": "app_pass", "scram_user": "scram_pass"}
#: Two entries share this uid: a search for it finds no single user.
TWIN = "twin"


def _entries() -> str:
    text = (
        f"dn: {BASE_DN}\nobjectClass: dcObject\nobjectClass: organization\n"
        "dc: example\no: Example\n\n"
        f"dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people\n\n"
        f"dn: {SEARCHER_DN}\nobjectClass: organizationalRole\n"
        f"objectClass: simpleSecurityObject\ncn: searcher\n"
        f"userPassword: {SEARCHER_PASSWORD}\n\n"
    )
    people = [(user, user, password) for user, password in USERS.items()]
    people += [(f"{TWIN}{n}", TWIN, "twin_pass") for n in (1, 2)]
    for cn, uid, password in people:
        text += (
            f"dn: cn={cn},{PEOPLE}\nobjectClass: inetOrgPerson\ncn: {cn}\nsn: {cn}\n"
            f"uid: {uid}\nmail: {uid}@example.net\nuserPassword: {password}\n\n"
        )
    return text


class Slapd:
    """slapd on 127.0.0.1: plain LDAP (with StartTLS) on `port`, LDAPS on `ldaps_port`, with
    the test PKI's server certificate; the directory of _entries() under BASE_DN."""

    def __init__(self, workdir: Path, pki: Pki) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.ldaps_port = free_port()
        data = workdir / "data"
        data.mkdir(parents=True)
        schemas = "".join(
            f"include {SCHEMA_DIR}/{name}.schema\n"
            for name in ("core", "cosine", "nis", "inetorgperson")
        )
        conf = workdir / "slapd.conf"
        conf.write_text(
            f"{schemas}pidfile {workdir}/slapd.pid\n"
            f"TLSCACertificateFile {pki.ca}\nTLSCertificateFile {pki.server.cert}\n"
            f"TLSCertificateKeyFile {pki.server.key}\n"
            # clients that bound may read; anonymous ones may only bind
            "access to * by users read by anonymous auth\n"
            f'database ldif\ndirectory {data}\nsuffix "{BASE_DN}"\n'
            f'rootdn "{ADMIN_DN}"\nrootpw {ADMIN_PASSWORD}\n',
            encoding="utf-8",
        )
        urls = f"ldap://127.0.0.1:{self.port}/ ldaps://127.0.0.1:{self.ldaps_port}/"
        self.log = workdir / "slapd.log"
        with self.log.open("wb") as log:
            # -d 0: in the foreground, so that this object owns the process
            self.proc = subprocess.Popen(
                [SLAPD, "-d", "0", "-f", str(conf), "-h", urls],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_ready()
            entries = workdir / "entries.ldif"
            entries.write_text(_entries(), encoding="utf-8")
            subprocess.run(
                [
                    "ldapadd",
                    "-x",
                    "-H",
                    f"ldap://127.0.0.1:{self.port}/",
                    "-D",
                    ADMIN_DN,
                    "-w",
                    ADMIN_PASSWORD,
                    "-f",
                    str(entries),
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"slapd exited: {self.log.read_text(errors='replace')}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("slapd did not listen in time") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def slapd_missing() -> str | None:
    """Why no slapd can run here (None: it can)."""
    if not Path(SLAPD).exists() or shutil.which("ldapadd") is None:
        return "the LDAP tests need OpenLDAP: apt-get install slapd ldap-utils"
    if not Path(SCHEMA_DIR, "inetorgperson.schema").exists():
        return f"no OpenLDAP schema files in {SCHEMA_DIR}"
    return None
