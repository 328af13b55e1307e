"""auth_type = hba: each rule of a pg_hba.conf shown to let in or refuse, ident maps, RELOAD."""

from __future__ import annotations

import os
import pwd
import signal
import ssl
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess

from .certs import Pki
from .conftest import PgtarnFactory
from .drivers import connect
from .pgstat import wait_until
from .rawpg import RawClient
from .test_admin import admin
from .test_timeouts import final_error
from .test_tls import tls_settings

pytestmark = pytest.mark.integration

ME = pwd.getpwuid(os.getuid()).pw_name

HBA = """\
# the first rule that matches decides
local      all       app                            peer map=local
local      all       all                            reject
hostssl    postgres  all            127.0.0.1/32    cert map=certs
host       pgbouncer app            127.0.0.1/32    scram-sha-256   # the admin console
host       all       trust_user     127.0.0.1/32    trust
hostssl    app       scram_user     127.0.0.1/32    scram-sha-256
hostnossl  app       scram_user     127.0.0.1/32    reject
host       all       md5_user       127.0.0.1/32    md5
host       all       password_user  127.0.0.1/32    password
host       postgres  @users.txt     127.0.0.1/32    scram-sha-256
host       sameuser  all            127.0.0.1/32    scram-sha-256   # app to app
host       all       all            10.0.0.0/8      trust           # never this machine
"""

IDENT = f"""\
local  {ME}         app
certs  cert_user    scram_user
certs  /^(app)$     \\1
"""


@pytest.fixture
def hba_proc(pgtarn_factory: PgtarnFactory, pki: Pki, tmp_path: Path) -> PgtarnProcess:
    files = tmp_path / "hba"
    files.mkdir()
    (files / "pg_hba.conf").write_text(HBA)
    (files / "users.txt").write_text("# who may use postgres over plain TCP\napp\n")
    (files / "pg_ident.conf").write_text(IDENT)
    return pgtarn_factory(
        settings=tls_settings(
            pki,
            "prefer",
            client_tls_ca_file=pki.ca,
            auth_type="hba",
            auth_hba_file=files / "pg_hba.conf",
            auth_ident_file=files / "pg_ident.conf",
        )
    )


def certificate(pki: Pki, name: str) -> dict[str, str]:
    issued = pki.clients[name]
    return {"sslcert": issued.cert, "sslkey": issued.key}


def logs_in(
    proc: PgtarnProcess, user: str, password: str | None, dbname: str = "app", **kw: Any
) -> bool:
    with connect(proc, user, password, dbname=dbname, **kw) as conn:
        row = conn.execute("select current_user").fetchone()
    return row == (user,)


def refusal(
    proc: PgtarnProcess, user: str, password: str | None, dbname: str = "app", **kw: Any
) -> str:
    with pytest.raises(psycopg.OperationalError) as info:
        connect(proc, user, password, dbname=dbname, **kw).close()
    return str(info.value)


PASSWORDS = {
    "scram_user": "scram_pass",
    "md5_user": "md5_pass",
    "password_user": "password_pass",
    "app": "app_pass",
}


@pytest.mark.parametrize(
    ("user", "dbname", "kw", "expected"),
    [
        # trust: no password asked
        ("trust_user", "app", {"sslmode": "disable"}, "in"),
        # hostssl / hostnossl decide by TLS
        ("scram_user", "app", {"sslmode": "require"}, "in"),
        (
            "scram_user",
            "app",
            {"sslmode": "disable"},
            "pg_hba.conf rejects connection for host "
            '"127.0.0.1", user "scram_user", database '
            '"app", no encryption',
        ),
        # md5 and password methods
        ("md5_user", "app", {"sslmode": "disable"}, "in"),
        ("password_user", "app", {"sslmode": "disable"}, "in"),
        # @file lists the users
        ("app", "postgres", {"sslmode": "disable"}, "in"),
        (
            "scram_user",
            "postgres",
            {"sslmode": "disable"},
            "no pg_hba.conf entry for host "
            '"127.0.0.1", user "scram_user", '
            'database "postgres", no encryption',
        ),
        # sameuser
        ("app", "app", {"sslmode": "disable"}, "in"),
        ("md5_user", "postgres", {"sslmode": "disable"}, "in"),  # earlier rule: all databases
        ("trust_user", "postgres", {"sslmode": "require"}, "requires a valid client certificate"),
    ],
)
def test_hba_rules_over_tcp(
    hba_proc: PgtarnProcess, user: str, dbname: str, kw: dict[str, str], expected: str
) -> None:
    password = None if user == "trust_user" else PASSWORDS[user]
    if expected == "in":
        assert logs_in(hba_proc, user, password, dbname, **kw)
    else:
        assert expected in refusal(hba_proc, user, password, dbname, **kw)


def test_hba_refusal_is_28000_before_any_password(hba_proc: PgtarnProcess) -> None:
    raw = RawClient(hba_proc.host, hba_proc.port)
    raw.startup(user="scram_user", database="app")  # plaintext: the hostnossl reject rule
    fields = final_error(raw)  # no AuthenticationSASL came first
    assert fields["C"] == "28000" and "rejects connection" in fields["M"]


def test_cert_rule_with_an_ident_map(hba_proc: PgtarnProcess, pki: Pki) -> None:
    # hostssl postgres ... cert map=certs: CN cert_user may be scram_user, CN app is app
    assert logs_in(
        hba_proc, "scram_user", None, "postgres", sslmode="require", **certificate(pki, "cert_user")
    )
    assert logs_in(hba_proc, "app", None, "postgres", sslmode="require", **certificate(pki, "app"))
    assert "certificate authentication failed" in refusal(
        hba_proc, "scram_user", None, "postgres", sslmode="require", **certificate(pki, "app")
    )


def test_peer_rule_over_the_unix_socket(hba_proc: PgtarnProcess) -> None:
    # local all app peer map=local: this OS user may be app, without a password
    def local(user: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            host=hba_proc.socket_dir, port=hba_proc.port, user=user, dbname="app"
        )

    with local("app") as conn:
        assert conn.execute("select current_user").fetchone() == ("app",)
    with pytest.raises(psycopg.OperationalError) as info:
        local("scram_user").close()  # the next local rule rejects everyone else
    assert 'host "[local]", user "scram_user"' in str(info.value)


def test_reload_reads_the_hba_file_again(hba_proc: PgtarnProcess, tmp_path: Path) -> None:
    hba_file = tmp_path / "hba" / "pg_hba.conf"
    with connect(hba_proc, "trust_user", None, sslmode="disable") as kept:
        hba_file.write_text(HBA.replace("127.0.0.1/32    trust", "127.0.0.1/32    reject"))
        with admin(hba_proc) as console:
            console.execute("RELOAD")
        assert "rejects connection" in refusal(hba_proc, "trust_user", None, sslmode="disable")
        assert kept.execute("select 1").fetchone() == (1,)  # logged in before: kept
        hba_file.write_text(HBA + "host all all 127.0.0.1/32 gss-and-nonsense extra\n")
        hba_proc.send_signal(signal.SIGHUP)  # a broken file: the one in force stays
        wait_until(lambda: "reload failed" in hba_proc.log_text(), what="reload refused")
        assert "rejects connection" in refusal(hba_proc, "trust_user", None, sslmode="disable")
        assert logs_in(hba_proc, "scram_user", "scram_pass", sslmode="require")


def served_certificate(proc: PgtarnProcess, pki: Pki) -> bytes:
    """The DER certificate pgtarn shows a client that asks for TLS now."""
    context = ssl.create_default_context(cafile=pki.ca)
    context.check_hostname = False  # the renewed one below is for another name
    raw = RawClient(proc.host, proc.port)
    raw.start_tls(context)
    assert isinstance(raw.sock, ssl.SSLSocket)
    der = raw.sock.getpeercert(binary_form=True)
    raw.close()
    assert der is not None
    return der


def test_reload_reads_certificates_again_and_keeps_tls_clients(
    pgtarn_factory: PgtarnFactory, pki: Pki, tmp_path: Path
) -> None:
    cert, key = tmp_path / "pgtarn.crt", tmp_path / "pgtarn.key"
    cert.write_bytes(Path(pki.server.cert).read_bytes())
    key.write_bytes(Path(pki.server.key).read_bytes())
    proc = pgtarn_factory(
        settings={
            "client_tls_sslmode": "require",
            "client_tls_cert_file": cert,
            "client_tls_key_file": key,
        }
    )
    before = served_certificate(proc, pki)
    with connect(proc, sslmode="verify-full", sslrootcert=pki.ca) as kept:
        # a renewed certificate (another one of the same CA) replaces the file
        cert.write_bytes(Path(pki.wrong_host.cert).read_bytes())
        key.write_bytes(Path(pki.wrong_host.key).read_bytes())
        with admin(proc, sslmode="require") as console:
            console.execute("RELOAD")
        after = served_certificate(proc, pki)
        assert after != before and after == ssl.PEM_cert_to_DER_cert(
            Path(pki.wrong_host.cert).read_text()
        )
        assert kept.execute("select 1").fetchone() == (1,)  # the TLS session goes on


def test_cert_on_a_host_line_refuses_a_connection_without_tls(
    pgtarn_factory: PgtarnFactory, pki: Pki, tmp_path: Path
) -> None:
    """PgBouncer reads cert on a host line; pgtarn too: with TLS and the certificate the
    client logs in, without TLS it has no certificate and is refused."""
    files = tmp_path / "hba"
    files.mkdir()
    (files / "pg_hba.conf").write_text("host all all 127.0.0.1/32 cert\n")
    proc = pgtarn_factory(
        settings=tls_settings(
            pki,
            "prefer",
            client_tls_ca_file=pki.ca,
            auth_type="hba",
            auth_hba_file=files / "pg_hba.conf",
        )
    )
    assert logs_in(proc, "app", None, "app", sslmode="require", **certificate(pki, "app"))
    assert "requires a valid client certificate" in refusal(
        proc, "app", None, "app", sslmode="disable"
    )
