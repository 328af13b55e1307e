"""auth/pam.py: the conversation PAM calls, and a clear error without libpam.

The check itself, against a real PAM stack and OS user, is in tests/integration/test_pam.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest

from pgtarn.auth import pam

needs_libpam = pytest.mark.skipif(
    ctypes.util.find_library("pam") is None, reason="libpam is not installed (Debian: libpam0g)"
)


def converse(
    styles_and_texts: list[tuple[int, bytes]], password: bytes = b"s3cret"
) -> tuple[int, list[bytes | None], list[str]]:
    """Run the conversation on these messages as PAM would: (its code, the answers, the
    error messages kept)."""
    lib = pam._load()
    messages = [pam._Message(style, text) for style, text in styles_and_texts]
    pointers = (ctypes.POINTER(pam._Message) * max(1, len(messages)))(
        *[ctypes.pointer(m) for m in messages]
    )
    out = ctypes.POINTER(pam._Response)()
    kept: list[str] = []
    # PAM hands the conversation a pointer to the first of the message pointers
    first = ctypes.cast(pointers, ctypes.POINTER(ctypes.POINTER(pam._Message)))
    code = pam._answer(lib, len(messages), first, ctypes.pointer(out), password, kept)
    answers: list[bytes | None] = []
    if code == 0:
        for i in range(len(messages)):
            reply = out[i].resp
            answers.append(ctypes.string_at(reply) if reply else None)
            lib.free(reply)  # as PAM does
        lib.free(ctypes.cast(out, ctypes.c_void_p))
    return code, answers, kept


@needs_libpam
def test_the_password_answers_the_hidden_prompt_only() -> None:
    code, answers, kept = converse(
        [(1, b"Password: "), (3, b"account locked"), (4, b"welcome"), (2, b"Login: ")]
    )
    assert code == 0
    assert answers == [b"s3cret", None, None, None]
    assert kept == ["account locked"]


@needs_libpam
@pytest.mark.parametrize("count", [0, pam._MAX_MESSAGES + 1])
def test_a_conversation_of_no_or_too_many_messages_fails(count: int) -> None:
    code, _answers, _kept = converse([(4, b"x")] * count)
    assert code == 19  # PAM_CONV_ERR


def test_without_libpam_the_error_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pam, "_library", None)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    with pytest.raises(pam.PamUnavailable, match="libpam is not installed"):
        pam.authenticate("pgbouncer", "alice", "s3cret", "127.0.0.1")
    assert pam.unavailable() == "libpam is not installed"
