"""The compiled boundary: the C helpers, chosen here (each None when pure); what mypyc compiles.

This module is the one place that chooses the native C helpers of this build.

Two kinds of code are native in the compiled build:

- the modules listed in compiled.py (setup.py reads it), which mypyc compiles from their
  Python source (the same source runs as it is in the pure build);
- four small C modules here: ``_io.c`` (recv(2), send(2), accept4(2) and the epoll calls of
  net/transport.py's sockets), ``_shape.c`` (a query's shape for session/effects.py's first
  look), ``_startup.c`` (a StartupMessage's parameters for proto/messages.py, a welcome's end
  for proto/welcome.py) and
  ``_scram.c`` (a SCRAM login's two messages read and answered for auth/scram.py). Their
  pure counterparts live beside their callers and behave the same.

A caller takes a helper from here when it is not None, else its own pure function. The C
modules are built with the compiled modules and dropped with them when compiling fails;
buildinfo.py says which of the two builds runs.

pgtarn runs on Linux: its transports use epoll, native or pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

send_some: Callable[[int, bytes], int] | None
send_part: Callable[[int, bytes | bytearray | memoryview], int] | None
recv_some: Callable[[int], bytes | None] | None
accept_some: Callable[[int], tuple[int, Any] | None] | None
watch_set: Callable[[int, Any, int, int, int, object], None] | None
watch_ready: Callable[[int, Any, Any], list[Any]] | None
shape_of: Callable[[bytes, bytes], bytes] | None
hmac_keys: Callable[[bytes, bytes], bytes] | None
startup_params: Callable[[bytes, dict[str, str], int], dict[str, str] | None] | None
welcome_end: Callable[[bytes, int, int], bytes] | None
server_nonce: Callable[[], str | None] | None
server_first: (
    Callable[[bytes, str, bytes, str, str], tuple[str, str, str, bytes, bytes] | None] | None
)
server_final: Callable[[bytes, str, str, bytes], tuple[bytes, bytes] | None] | None

try:
    from ._io import accept_some, recv_some, send_part, send_some, watch_ready, watch_set
except ImportError:  # the pure build, or the helper not built
    accept_some = recv_some = send_part = send_some = watch_ready = watch_set = None

try:
    from ._shape import shape_of
except ImportError:  # the pure build, or the helper not built
    shape_of = None

try:
    from ._startup import startup_params, welcome_end
except ImportError:  # the pure build, or the helper not built
    startup_params = welcome_end = None

try:
    from ._scram import hmac_keys, server_final, server_first, server_nonce
except ImportError:  # the pure build, or the helper not built
    hmac_keys = server_final = server_first = server_nonce = None

#: The C helpers this build loaded, by name.
LOADED: Final = tuple(
    name
    for name, helper in (
        ("_io", recv_some),
        ("_shape", shape_of),
        ("_startup", startup_params),
        ("_scram", server_final),
    )
    if helper is not None
)
