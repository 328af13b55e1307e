"""One PAM check through the system's libpam (ctypes): pam_authenticate, then pam_acct_mgmt.

The call blocks (PAM modules read files, ask servers, sleep after a failure): it is made on
an auth thread (net/authpool.py), never on the event loop. The password goes to
PAM only, through the conversation function; nothing here logs it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any, TypeAlias

from .pamresult import PamResult, PamUnavailable

__all__ = ["SERVICE_DIRS", "PamResult", "PamUnavailable", "authenticate", "unavailable"]

#: Where Linux-PAM looks for a service's file (the second: distributions' defaults).
SERVICE_DIRS = ("/etc/pam.d", "/usr/lib/pam.d")

# Linux-PAM's constants (security/_pam_types.h)
_PAM_SUCCESS = 0
_PAM_BUF_ERR = 5
_PAM_CONV_ERR = 19
_PAM_RHOST = 4
_PAM_SILENT = 0x8000
_PAM_PROMPT_ECHO_OFF = 1
_PAM_ERROR_MSG = 3
#: More than any real exchange asks; a module asking more gets no answer at all.
_MAX_MESSAGES = 32


class _Message(ctypes.Structure):
    _fields_ = [("msg_style", ctypes.c_int), ("msg", ctypes.c_char_p)]


class _Response(ctypes.Structure):
    _fields_ = [("resp", ctypes.c_void_p), ("resp_retcode", ctypes.c_int)]


_CONVERSE = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_int,
    ctypes.POINTER(ctypes.POINTER(_Message)),
    ctypes.POINTER(ctypes.POINTER(_Response)),
    ctypes.c_void_p,
)


class _Conversation(ctypes.Structure):
    _fields_ = [("conv", _CONVERSE), ("appdata_ptr", ctypes.c_void_p)]


def _declared(function: Any, argtypes: list[Any], restype: Any) -> Any:
    """A C function of a loaded library with its argument and result types set."""
    function.argtypes = argtypes
    function.restype = restype
    return function


class _Library:
    """libpam's functions, and libc's calloc and strdup: PAM frees the answers with free()."""

    def __init__(self) -> None:
        pam_name = ctypes.util.find_library("pam")
        libc_name = ctypes.util.find_library("c")
        if pam_name is None:
            raise PamUnavailable("libpam is not installed")
        try:
            pam = ctypes.CDLL(pam_name)
            libc = ctypes.CDLL(libc_name)
        except OSError as exc:
            raise PamUnavailable(f"cannot load {pam_name}: {exc}") from None
        handle_out = ctypes.POINTER(ctypes.c_void_p)
        handle, code, text = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
        conversation = ctypes.POINTER(_Conversation)
        self.start = _declared(pam.pam_start, [text, text, conversation, handle_out], code)
        self.set_item = _declared(pam.pam_set_item, [handle, code, text], code)
        self.authenticate = _declared(pam.pam_authenticate, [handle, code], code)
        self.acct_mgmt = _declared(pam.pam_acct_mgmt, [handle, code], code)
        self.end = _declared(pam.pam_end, [handle, code], code)
        self.strerror = _declared(pam.pam_strerror, [handle, code], text)
        self.calloc = _declared(libc.calloc, [ctypes.c_size_t, ctypes.c_size_t], handle)
        self.strdup = _declared(libc.strdup, [text], handle)
        self.free = _declared(libc.free, [handle], None)

    def describe(self, handle: ctypes.c_void_p | None, code: int) -> str:
        text = self.strerror(handle, code)
        return text.decode("utf-8", "replace") if text else f"PAM error {code}"


# (type names only: ctypes pointers are not subscriptable at run time)
_Asked: TypeAlias = "ctypes._Pointer[ctypes._Pointer[_Message]]"
_Answers: TypeAlias = "ctypes._Pointer[ctypes._Pointer[_Response]]"


def _answer(
    lib: _Library, count: int, asked: _Asked, answers: _Answers, secret: bytes, messages: list[str]
) -> int:
    """The conversation: the password for each prompt that hides what is typed (the
    password prompt), nothing for the others; PAM_ERROR_MSG texts kept for the log."""
    if count < 1 or count > _MAX_MESSAGES:
        return _PAM_CONV_ERR
    replies = lib.calloc(count, ctypes.sizeof(_Response))
    if not replies:
        return _PAM_BUF_ERR
    array = ctypes.cast(replies, ctypes.POINTER(_Response))
    for i in range(count):
        message = asked[i].contents
        if message.msg_style == _PAM_PROMPT_ECHO_OFF:
            copy = lib.strdup(secret)
            if not copy:
                for j in range(i):
                    lib.free(array[j].resp)
                lib.free(replies)
                return _PAM_BUF_ERR
            array[i].resp = copy
        elif message.msg_style == _PAM_ERROR_MSG and message.msg:
            messages.append(message.msg.decode("utf-8", "replace"))
    answers[0] = array
    return _PAM_SUCCESS


_library: _Library | None = None
_library_lock = threading.Lock()


def _load() -> _Library:
    global _library
    with _library_lock:  # checks on several threads may come first at once
        if _library is None:
            _library = _Library()
        return _library


def unavailable() -> str | None:
    """Why libpam cannot be used here (None: it can), for `pgtarn check`."""
    try:
        _load()
    except PamUnavailable as exc:
        return str(exc)
    return None


def authenticate(service: str, user: str, password: str, rhost: str) -> PamResult:
    """Ask PAM's service whether user may log in with password (pam_authenticate, then
    pam_acct_mgmt: expired or locked accounts fail too), from rhost (PAM_RHOST, for modules
    that look at it and for their logs). Blocks. PamUnavailable without libpam."""
    lib = _load()
    secret = password.encode("utf-8")
    messages: list[str] = []

    def converse(count: int, asked: _Asked, answers: _Answers, _data: int | None) -> int:
        # PAM calls this on this thread, within pam_authenticate.
        try:
            return _answer(lib, count, asked, answers, secret, messages)
        except Exception:  # an exception must not cross into C: the exchange fails
            return _PAM_CONV_ERR

    callback = _CONVERSE(converse)  # referenced until pam_end: PAM may call it until then
    conversation = _Conversation(callback, None)
    handle = ctypes.c_void_p()
    code = lib.start(
        service.encode("utf-8"),
        user.encode("utf-8", "surrogateescape"),
        ctypes.byref(conversation),
        ctypes.byref(handle),
    )
    if code != _PAM_SUCCESS:
        return PamResult(False, f"pam_start() failed: {lib.describe(None, code)}")
    reason = ""
    try:
        code = lib.set_item(handle, _PAM_RHOST, rhost.encode("utf-8"))
        if code != _PAM_SUCCESS:
            reason = f"pam_set_item() cannot set PAM_RHOST: {lib.describe(handle, code)}"
            return PamResult(False, reason, tuple(messages))
        code = lib.authenticate(handle, _PAM_SILENT)
        if code != _PAM_SUCCESS:
            reason = f"pam_authenticate() failed: {lib.describe(handle, code)}"
            return PamResult(False, reason, tuple(messages))
        code = lib.acct_mgmt(handle, _PAM_SILENT)
        if code != _PAM_SUCCESS:
            reason = f"pam_acct_mgmt() failed: {lib.describe(handle, code)}"
            return PamResult(False, reason, tuple(messages))
        return PamResult(True, "", tuple(messages))
    finally:
        lib.end(handle, code)
