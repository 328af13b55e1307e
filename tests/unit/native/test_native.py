"""The native helpers: all of them in the compiled build, none in the pure one, and used."""

from __future__ import annotations

from pathlib import Path

from pgtarn import native
from pgtarn.auth import scram
from pgtarn.native.buildinfo import BUILD
from pgtarn.net import sending, transport
from pgtarn.proto import messages, welcome
from pgtarn.session import effects

#: setup.py builds the SCRAM helper only where the OpenSSL headers are (docs/install.md):
#: where they are, a compiled build must have it, and where not, it leaves it out alone.
OPENSSL_HEADERS = any(
    Path(include, "openssl", "sha.h").exists() for include in ("/usr/include", "/usr/local/include")
)


def test_the_compiled_build_loads_every_helper_and_the_pure_build_none() -> None:
    scram_helper = ("_scram",) if OPENSSL_HEADERS else ()
    expected = ("_io", "_shape", "_startup", *scram_helper) if BUILD == "compiled" else ()
    assert expected == native.LOADED


def test_callers_take_the_helper_when_there_is_one() -> None:
    assert (transport.RECV_SOME is native.recv_some) == (native.recv_some is not None)
    assert (sending.SEND_SOME is native.send_some) == (native.send_some is not None)
    assert (effects.SHAPE_OF is native.shape_of) == (native.shape_of is not None)
    # (None in the pure build: the caller then runs its own code)
    assert messages.STARTUP_PARAMS is native.startup_params
    assert (welcome.WELCOME_END is native.welcome_end) == (native.welcome_end is not None)
    assert scram._SERVER_NONCE is native.server_nonce
    assert scram._SERVER_FIRST is native.server_first
    assert scram._SERVER_FINAL is native.server_final
