"""The native helpers: all of them in the compiled build, none in the pure one, and used."""

from __future__ import annotations

from pgtarn import native
from pgtarn.native.buildinfo import BUILD
from pgtarn.net import sending, transport
from pgtarn.session import effects


def test_the_compiled_build_loads_every_helper_and_the_pure_build_none() -> None:
    expected = ("_io", "_shape", "_scram") if BUILD == "compiled" else ()
    assert expected == native.LOADED


def test_callers_take_the_helper_when_there_is_one() -> None:
    assert (transport.RECV_SOME is native.recv_some) == (native.recv_some is not None)
    assert (sending.SEND_SOME is native.send_some) == (native.send_some is not None)
    assert (effects.SHAPE_OF is native.shape_of) == (native.shape_of is not None)
