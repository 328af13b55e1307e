"""The native helpers: all of them in the compiled build, none in the pure one, and used."""

from __future__ import annotations

from pgtarn import native
from pgtarn.auth import scram
from pgtarn.native.buildinfo import BUILD
from pgtarn.net import sending, transport
from pgtarn.proto import messages
from pgtarn.session import effects


def test_the_compiled_build_loads_every_helper_and_the_pure_build_none() -> None:
    expected = ("_io", "_shape", "_startup", "_scram") if BUILD == "compiled" else ()
    assert expected == native.LOADED


def test_callers_take_the_helper_when_there_is_one() -> None:
    assert (transport.RECV_SOME is native.recv_some) == (native.recv_some is not None)
    assert (sending.SEND_SOME is native.send_some) == (native.send_some is not None)
    assert (effects.SHAPE_OF is native.shape_of) == (native.shape_of is not None)
    # (None in the pure build: the caller then runs its own code)
    assert messages.STARTUP_PARAMS is native.startup_params
    assert scram._SERVER_NONCE is native.server_nonce
    assert scram._SERVER_FIRST is native.server_first
    assert scram._SERVER_FINAL is native.server_final
