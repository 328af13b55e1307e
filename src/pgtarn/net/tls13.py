"""TLS 1.3 cipher suites on an ssl.SSLContext: OpenSSL's SSL_CTX_set_ciphersuites, by ctypes.

Python's ssl module sets only the TLS 1.2 cipher list (SSLContext.set_ciphers); the TLS 1.3
suites (client_tls13_ciphers, server_tls13_ciphers) need SSL_CTX_set_ciphersuites on the
context's SSL_CTX. CPython keeps that pointer first in its SSLContext object, right after the
object header (Modules/_ssl.c); before it is used, it is checked against the context: the
options OpenSSL reports for it (SSL_CTX_get_options) must be the context's own. Anything
unexpected (another Python, an ssl module without a shared library) is a ConfigError that
says so, never a guess. OpenSSL's functions are found through the ssl module's own shared
library, so they are those of the OpenSSL Python uses.
"""

from __future__ import annotations

import _ssl
import ctypes
import ssl
import sys

from ..errors import ConfigError

_HEADER = object.__basicsize__
_MASK = (1 << 64) - 1


def _openssl() -> ctypes.CDLL:
    path = getattr(_ssl, "__file__", None)
    if sys.implementation.name != "cpython" or not path:
        raise ConfigError("TLS 1.3 cipher suites need CPython's ssl module as a shared library")
    lib = ctypes.CDLL(path)
    lib.SSL_CTX_get_options.restype = ctypes.c_uint64
    lib.SSL_CTX_get_options.argtypes = [ctypes.c_void_p]
    lib.SSL_CTX_set_ciphersuites.restype = ctypes.c_int
    lib.SSL_CTX_set_ciphersuites.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    return lib


def _ssl_ctx(lib: ctypes.CDLL, context: ssl.SSLContext) -> int:
    """The SSL_CTX pointer of context, checked (see the module docstring)."""
    pointer = ctypes.c_void_p.from_address(id(context) + _HEADER).value
    if not pointer or lib.SSL_CTX_get_options(pointer) != context.options & _MASK:
        raise ConfigError("TLS 1.3 cipher suites: the OpenSSL context was not found")
    return pointer


def set_tls13_ciphers(context: ssl.SSLContext, setting: str, suites: str) -> None:
    """Allow only suites (OpenSSL's names, colon-separated) for TLS 1.3 on context."""
    lib = _openssl()
    pointer = _ssl_ctx(lib, context)
    if lib.SSL_CTX_set_ciphersuites(pointer, suites.encode("ascii", "replace")) != 1:
        raise ConfigError(f"{setting}: failed to set the TLSv1.3 cipher suites: {suites}")
