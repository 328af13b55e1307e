"""auth_type = pam and the HBA method pam, against the system's PAM stack and a real OS user.

Each test run creates an OS user with a known password (useradd, chpasswd; removed at the
end), a PostgreSQL role of the same name and password, and a PAM service file of its own
in /etc/pam.d (auth_pam_service names it), so no system file is touched. pam_unix reads
/etc/shadow, which takes root: the tests run as root, as CI does.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pgtarn.proto import build
from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import connect
from .ldapserver import Slapd
from .pgstat import wait_until
from .rawpg import RawClient
from .test_ldap import simple_bind, slapd  # noqa: F401  (slapd: a fixture)
from .test_timeouts import final_error

pytestmark = pytest.mark.integration

PAM_DIR = Path("/etc/pam.d")
#: Where distributions put PAM modules (Debian: the multiarch directory).
MODULE_DIRS = ("/lib/*", "/usr/lib/*", "/lib", "/usr/lib", "/lib64", "/usr/lib64")
UNIX_STACK = "auth required pam_unix.so\naccount required pam_unix.so\n"


def _pam_missing() -> str | None:
    """Why this machine cannot run a real PAM check (None: it can)."""
    if os.geteuid() != 0:
        return "PAM tests create an OS user and a file in /etc/pam.d: they need root"
    if ctypes.util.find_library("pam") is None:
        return "libpam is not installed (Debian: libpam0g)"
    if not PAM_DIR.is_dir():
        return "/etc/pam.d does not exist"
    if not any(glob.glob(f"{lib}/security/pam_unix.so") for lib in MODULE_DIRS):
        return "pam_unix.so is not installed (Debian: libpam-modules)"
    for tool in ("useradd", "chpasswd", "userdel"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: passwd)"
    return None


@dataclass
class PamSetup:
    user: str
    password: str
    service: str  # a file in /etc/pam.d: pam_unix, auth and account

    def write_service(self, name: str, text: str) -> str:
        """Another service file (removed with the others); its name."""
        (PAM_DIR / name).write_text(text, encoding="utf-8")
        _SERVICES.append(name)
        return name


_SERVICES: list[str] = []


@pytest.fixture(scope="module")
def pam(pg_cluster: TempCluster) -> Iterator[PamSetup]:
    missing = _pam_missing()
    if missing is not None:
        pytest.skip(missing)
    tag = secrets.token_hex(4)
    user = f"pgtarn_pam_{tag}"
    password = f"pam pass {secrets.token_hex(6)}"
    service = f"pgtarn-test-{tag}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True
    )
    try:
        subprocess.run(["chpasswd"], input=f"{user}:{password}\n", text=True, check=True)
        setup = PamSetup(user, password, service)
        setup.write_service(service, UNIX_STACK)
        pg_cluster.create_role(user, password)  # the servers log in with the same password
        yield setup
    finally:
        subprocess.run(["userdel", user], check=False)
        for name in _SERVICES:
            (PAM_DIR / name).unlink(missing_ok=True)
        _SERVICES.clear()
        pg_cluster.psql(f'DROP ROLE IF EXISTS "{user}";\n')


def pam_settings(pam: PamSetup, **more: object) -> dict[str, object]:
    return {"auth_type": "pam", "auth_pam_service": pam.service, **more}


def refusal(proc: PgtarnProcess, user: str, password: str) -> psycopg.OperationalError:
    with pytest.raises(psycopg.OperationalError) as info:
        connect(proc, user, password).close()
    return info.value


def test_pam_login_and_the_servers_use_the_password(
    pgtarn_factory: PgtarnFactory, pam: PamSetup
) -> None:
    proc = pgtarn_factory(settings=pam_settings(pam))
    with connect(proc, pam.user, pam.password) as conn:
        # the server logged in as the user, with the password PAM accepted
        assert conn.execute("select current_user").fetchone() == (pam.user,)
    with connect(proc, pam.user, pam.password) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    assert pam.password not in proc.log_text()


def test_wrong_password_and_unknown_user_are_refused_alike(
    pgtarn_factory: PgtarnFactory, pam: PamSetup
) -> None:
    proc = pgtarn_factory(settings=pam_settings(pam))
    for user, password in (
        (pam.user, pam.password + "x"),
        (f"nobody_{secrets.token_hex(4)}", pam.password),
    ):
        fields = final_error(send_password(proc, user, password))
        assert (fields["C"], fields["M"]) == ("28000", "PAM authentication failed")
    log = proc.log_text()
    assert "pam_authenticate() failed" in log
    assert pam.password not in log


def test_auth_file_is_not_read_under_pam(pgtarn_factory: PgtarnFactory, pam: PamSetup) -> None:
    """As PgBouncer: PAM alone decides; an auth_file entry lets nobody in."""
    proc = pgtarn_factory(settings=pam_settings(pam), userlist={pam.user: "from-auth-file"})
    assert "PAM authentication failed" in str(refusal(proc, pam.user, "from-auth-file"))
    with connect(proc, pam.user, pam.password) as conn:
        assert conn.execute("select current_user").fetchone() == (pam.user,)


def test_pam_with_auth_user_is_a_config_error(pgtarn_factory: PgtarnFactory, pam: PamSetup) -> None:
    proc = pgtarn_factory(settings=pam_settings(pam, auth_user="app"))
    assert "bouncer config error" in str(refusal(proc, pam.user, pam.password))
    assert "PAM can't be used together with database authentication" in proc.log_text()


def test_an_empty_password_never_reaches_pam(pgtarn_factory: PgtarnFactory, pam: PamSetup) -> None:
    proc = pgtarn_factory(settings=pam_settings(pam))
    fields = final_error(send_password(proc, pam.user, ""))
    assert (fields["C"], fields["M"]) == ("28P01", "empty password returned by client")
    assert "pam_authenticate" not in proc.log_text()


def send_password(proc: PgtarnProcess, user: str, password: str) -> RawClient:
    """A client that has sent its password and waits for the answer."""
    raw = RawClient(proc.host, proc.port, timeout=30)
    try:
        raw.startup(user=user, database="app")
        assert raw.read_message() == ("R", (3).to_bytes(4, "big"))  # cleartext, please
        raw.send(build.password_message(password.encode() + b"\0"))
    except BaseException:
        raw.close()
        raise
    return raw


def hold_service(pam: PamSetup, tmp_path: Path) -> tuple[str, Callable[[], int]]:
    """A PAM service whose checks wait until tmp_path/release exists, and a count of the
    checks that have started."""
    hold = tmp_path / "hold.sh"
    hold.write_text(
        f"#!/bin/sh\ntouch {tmp_path}/started.$$\n"
        f"while [ ! -e {tmp_path}/release ]; do sleep 0.05; done\n"
    )
    hold.chmod(0o755)
    service = pam.write_service(
        f"{pam.service}-hold-{tmp_path.name}",
        f"auth required pam_exec.so quiet {hold}\n" + UNIX_STACK,
    )
    return service, lambda: len(list(tmp_path.glob("started.*")))


def test_checks_wait_in_a_bounded_queue(
    pgtarn_factory: PgtarnFactory, pam: PamSetup, tmp_path: Path
) -> None:
    """One thread, a queue of one: a check that hangs in PAM holds the thread, the next
    waits, the one after is refused at once; when PAM answers, both waiting ones log in."""
    service, started = hold_service(pam, tmp_path)
    proc = pgtarn_factory(
        settings={
            "auth_type": "pam",
            "auth_pam_service": service,
            "auth_threads": 1,
            "auth_queue_size": 1,
        }
    )
    first = send_password(proc, pam.user, pam.password)
    try:
        wait_until(lambda: started() == 1, what="the first check to be in PAM")
        second = send_password(proc, pam.user, pam.password)  # the thread is busy: it waits
        try:
            fields = final_error(send_password(proc, pam.user, pam.password))  # refused
            assert (fields["C"], fields["M"]) == (
                "53300",
                "too many PAM authentication requests in progress",
            )
            assert started() == 1  # the second is still waiting for the thread
            (tmp_path / "release").touch()
            for raw in (first, second):
                assert raw.read_until("Z")[-1][0] == "Z"  # logged in
            assert started() == 2
        finally:
            second.close()
    finally:
        first.close()
    assert (
        "PAM authentication refused: no room for its check (auth_threads = 1, "
        "auth_queue_size = 1, all taken)"
    ) in proc.log_text()


def test_hba_pam_rule(pgtarn_factory: PgtarnFactory, pam: PamSetup, tmp_path: Path) -> None:
    hba = tmp_path / "pg_hba.conf"
    hba.write_text(
        f"host all {pam.user} 127.0.0.1/32 pam\nhost all all 127.0.0.1/32 scram-sha-256\n"
    )
    proc = pgtarn_factory(
        settings={"auth_type": "hba", "auth_hba_file": hba, "auth_pam_service": pam.service}
    )
    with connect(proc, pam.user, pam.password) as conn:
        assert conn.execute("select current_user").fetchone() == (pam.user,)
    assert "PAM authentication failed" in str(refusal(proc, pam.user, "wrong"))
    with connect(proc, "app", "app_pass") as conn:  # the next rule: SCRAM, auth_file
        assert conn.execute("select current_user").fetchone() == ("app",)


def test_pam_and_ldap_checks_share_the_auth_threads(
    pgtarn_factory: PgtarnFactory,
    pam: PamSetup,
    slapd: Slapd,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    """One thread, no queue, for both methods: while PAM holds the thread an LDAP login is
    refused at once; once PAM has answered, LDAP gets the thread."""
    service, started = hold_service(pam, tmp_path)
    hba = tmp_path / "pg_hba.conf"
    hba.write_text(
        f"host all {pam.user} 127.0.0.1/32 pam\n"
        f"host all all 127.0.0.1/32 ldap {simple_bind(slapd)}\n"
    )
    proc = pgtarn_factory(
        settings={
            "auth_type": "hba",
            "auth_hba_file": hba,
            "auth_pam_service": service,
            "auth_threads": 1,
            "auth_queue_size": 0,
        }
    )
    first = send_password(proc, pam.user, pam.password)
    try:
        wait_until(lambda: started() == 1, what="the PAM check to be in PAM")
        fields = final_error(send_password(proc, "app", "app_pass"))  # LDAP: no room
        assert (fields["C"], fields["M"]) == (
            "53300",
            "too many LDAP authentication requests in progress",
        )
        (tmp_path / "release").touch()
        assert first.read_until("Z")[-1][0] == "Z"  # PAM's login went on
    finally:
        first.close()
    with connect(proc, "app", "app_pass") as conn:  # the thread is free: LDAP's turn
        assert conn.execute("select current_user").fetchone() == ("app",)
    assert (
        "LDAP authentication refused: no room for its check (auth_threads = 1, "
        "auth_queue_size = 0, all taken)"
    ) in proc.log_text()
