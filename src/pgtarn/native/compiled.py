"""The modules mypyc compiles in the compiled build: the one list, read by setup.py.

They are what a transaction runs through (framing, relay, link, pool, statement tracking)
and what a login does (SCRAM, the access decision, the runtime's keys). mypyc turns their
type-annotated Python into C extensions that run the same code two to three times faster;
the pure build runs them as they are. They load only together (one shared library), and a
class that extends a compiled one must be compiled too (tests/unit/native/test_buildinfo.py
checks both).

setup.py reads this file without importing pgtarn (runpy), so it imports nothing itself.
"""

from __future__ import annotations

COMPILED = (
    "pgtarn/views/states.py",
    "pgtarn/proto/msgtypes.py",
    "pgtarn/proto/framing.py",
    "pgtarn/proto/streaming.py",
    "pgtarn/proto/messages.py",
    "pgtarn/proto/build.py",
    "pgtarn/proto/welcome.py",
    "pgtarn/proto/client_login.py",
    "pgtarn/proto/client_side.py",
    "pgtarn/proto/cancelkey.py",
    "pgtarn/proto/parameters.py",
    "pgtarn/auth/scram.py",
    "pgtarn/pool/idle.py",
    "pgtarn/pool/pool.py",
    "pgtarn/pool/handoffs.py",
    "pgtarn/pool/stats.py",
    "pgtarn/pool/waiting.py",
    "pgtarn/session/effects.py",
    "pgtarn/session/fifo.py",
    "pgtarn/session/framer.py",
    "pgtarn/session/prepared.py",
    "pgtarn/session/rewrite.py",
    "pgtarn/session/rows.py",
    "pgtarn/session/statements.py",
    "pgtarn/session/sqlnames.py",
    "pgtarn/session/stale.py",
    "pgtarn/session/tracking.py",
    "pgtarn/net/transport.py",
    "pgtarn/net/accept.py",  # the listeners' accept: a login's first step
    "pgtarn/net/sending.py",
    "pgtarn/server/linked.py",
    "pgtarn/server/transport.py",
    "pgtarn/client/extras.py",
    "pgtarn/client/parsers.py",
    "pgtarn/client/access.py",
    "pgtarn/runtime.py",
    "pgtarn/server/relay.py",
    "pgtarn/server/connection.py",
    "pgtarn/server/replication.py",  # subclasses ServerConnection: compiled with it
    "pgtarn/client/transport.py",
    "pgtarn/client/tracking.py",
    "pgtarn/client/listening.py",
    "pgtarn/client/link.py",
    "pgtarn/client/relay.py",
    "pgtarn/client/login.py",
    "pgtarn/client/connection.py",
)
