"""PostgreSQL's message type bytes by their documented names, and the sets of them pgtarn watches.

A message's first byte says its type (chapter "Message Formats" of PostgreSQL's
documentation). Several bytes mean one message from the client (frontend) and another from
the server (backend): 'C' is Close or CommandComplete, 'D' Describe or DataRow, 'E' Execute
or ErrorResponse, 'H' Flush or CopyOutResponse, 'S' Sync or ParameterStatus. Each message has
its own name here, under its direction, so a comparison says which one it means.

The values are plain int literals declared Final: the compiled build puts them into the code
as constants, and a pure-Python run reads a module global. (ord("Q") would be a call: it is
the unit test that checks each value against its letter.) Every set of types the scanners
watch is defined here, once, from the names.
"""

from __future__ import annotations

from typing import Final

# --- frontend: client -> server -------------------------------------------------------------

BIND: Final = 0x42  # 'B'
CLOSE: Final = 0x43  # 'C' (from the server: COMMAND_COMPLETE)
COPY_DATA: Final = 0x64  # 'd', both directions
COPY_DONE: Final = 0x63  # 'c', both directions
COPY_FAIL: Final = 0x66  # 'f'
DESCRIBE: Final = 0x44  # 'D' (from the server: DATA_ROW)
EXECUTE: Final = 0x45  # 'E' (from the server: ERROR_RESPONSE)
FLUSH: Final = 0x48  # 'H' (from the server: COPY_OUT_RESPONSE)
FUNCTION_CALL: Final = 0x46  # 'F'
PARSE: Final = 0x50  # 'P'
#: 'p': PasswordMessage, and with the same byte GSSResponse, SASLInitialResponse and
#: SASLResponse (the authentication request before it says which).
PASSWORD_MESSAGE: Final = 0x70
GSS_RESPONSE: Final = 0x70
SASL_INITIAL_RESPONSE: Final = 0x70
SASL_RESPONSE: Final = 0x70
QUERY: Final = 0x51  # 'Q'
SYNC: Final = 0x53  # 'S' (from the server: PARAMETER_STATUS)
TERMINATE: Final = 0x58  # 'X'

# --- backend: server -> client -------------------------------------------------------------

#: 'R': every Authentication* message (AuthenticationOk, ...CleartextPassword, ...MD5Password,
#: ...SASL, ...SASLContinue, ...SASLFinal, ...); its first Int32 says which.
AUTHENTICATION: Final = 0x52
BACKEND_KEY_DATA: Final = 0x4B  # 'K'
BIND_COMPLETE: Final = 0x32  # '2'
CLOSE_COMPLETE: Final = 0x33  # '3'
COMMAND_COMPLETE: Final = 0x43  # 'C' (from the client: CLOSE)
COPY_BOTH_RESPONSE: Final = 0x57  # 'W'
COPY_IN_RESPONSE: Final = 0x47  # 'G'
COPY_OUT_RESPONSE: Final = 0x48  # 'H' (from the client: FLUSH)
DATA_ROW: Final = 0x44  # 'D' (from the client: DESCRIBE)
EMPTY_QUERY_RESPONSE: Final = 0x49  # 'I'
ERROR_RESPONSE: Final = 0x45  # 'E' (from the client: EXECUTE)
FUNCTION_CALL_RESPONSE: Final = 0x56  # 'V'
NEGOTIATE_PROTOCOL_VERSION: Final = 0x76  # 'v'
NO_DATA: Final = 0x6E  # 'n'
NOTICE_RESPONSE: Final = 0x4E  # 'N'
NOTIFICATION_RESPONSE: Final = 0x41  # 'A'
PARAMETER_DESCRIPTION: Final = 0x74  # 't'
PARAMETER_STATUS: Final = 0x53  # 'S' (from the client: SYNC)
PARSE_COMPLETE: Final = 0x31  # '1'
PORTAL_SUSPENDED: Final = 0x73  # 's'
READY_FOR_QUERY: Final = 0x5A  # 'Z'
ROW_DESCRIPTION: Final = 0x54  # 'T'

# --- sets of types: what a MessageScanner reports --------------------------------------------

#: Every type: logins, the admin console and pgtarn's own connections read every message.
ALL_TYPES: Final = frozenset(range(256))

# Server side: PostgreSQL's replies.
#: While linked: ReadyForQuery ends a batch, ParameterStatus and ErrorResponse are noted,
#: a NotificationResponse may carry a pid to rewrite; everything else passes unread.
SERVER_RELAY_TYPES: Final = frozenset(
    (READY_FOR_QUERY, PARAMETER_STATUS, ERROR_RESPONSE, NOTIFICATION_RESPONSE)
)
#: A server's replies read by their head when too long to hold where prepared statements are
#: kept (server/longreply.py); other long ones are gathered whole.
LONG_REPLY_HEAD_TYPES: Final = frozenset((ERROR_RESPONSE, DATA_ROW))
#: With prepared statements: also ParseComplete, BindComplete and CloseComplete, which are
#: answered or dropped (no NotificationResponse: a rewritten pid is session mode's).
PREPARED_RELAY_TYPES: Final = frozenset(
    (
        READY_FOR_QUERY,
        PARAMETER_STATUS,
        ERROR_RESPONSE,
        PARSE_COMPLETE,
        BIND_COMPLETE,
        CLOSE_COMPLETE,
    )
)
#: While the linked client reads the rows of a batch (advisory lock calls): DataRow and the
#: ends of a result (CommandComplete, EmptyQueryResponse, PortalSuspended).
ROW_TYPES: Final = frozenset((DATA_ROW, COMMAND_COMPLETE, EMPTY_QUERY_RESPONSE, PORTAL_SUSPENDED))
PREPARED_ROW_RELAY_TYPES: Final = PREPARED_RELAY_TYPES | ROW_TYPES
#: The replies to a Describe of a statement: ParameterDescription, then RowDescription or
#: NoData.
DESCRIPTION_TYPES: Final = frozenset((PARAMETER_DESCRIPTION, ROW_DESCRIPTION, NO_DATA))
#: The listener connection: notifications, and the end or failure of its LISTEN commands.
LISTENER_TYPES: Final = frozenset((NOTIFICATION_RESPONSE, READY_FOR_QUERY, ERROR_RESPONSE))
#: What may come to a health check's connection at any time without meaning anything to it.
UNSOLICITED_TYPES: Final = frozenset((NOTICE_RESPONSE, PARAMETER_STATUS, NOTIFICATION_RESPONSE))

# Client side: the application's messages.
#: A client relay in session or transaction mode: Query and Sync start a ReadyForQuery's
#: wait, Terminate ends the client; every other message passes unread. The same three end a
#: batch: a ReadyForQuery comes after each (none after Terminate: nothing more comes).
CLIENT_RELAY_TYPES: Final = frozenset((QUERY, SYNC, TERMINATE))
#: Statement mode: also Parse, whose text may open a transaction.
STATEMENT_RELAY_TYPES: Final = frozenset((QUERY, SYNC, TERMINATE, PARSE))
#: The messages that name a prepared statement: Parse, Bind, Describe, Close (and a batch
#: pgtarn answers itself begins with one of them).
STATEMENT_MESSAGES: Final = frozenset((PARSE, BIND, DESCRIBE, CLOSE))
STATEMENT_MESSAGES_OR_QUERY: Final = STATEMENT_MESSAGES | frozenset((QUERY,))
#: Prepared statements tracked (ClientFramer, and a client relay before its first statement
#: message): the statement messages are read whole, with Query, Sync and Terminate.
STATEMENT_WATCH_TYPES: Final = STATEMENT_MESSAGES | CLIENT_RELAY_TYPES
#: The messages that carry SQL text: Query and Parse.
TEXT_TYPES: Final = frozenset((QUERY, PARSE))
#: Parse alone: added to a watch set while session state is tracked.
PARSE_TYPES: Final = frozenset((PARSE,))
#: Terminate alone: a scanner stops there (nothing after it is read).
TERMINATE_TYPES: Final = frozenset((TERMINATE,))
#: The messages that use or end a statement's name (Parse may name it anew).
NAMING_TYPES: Final = frozenset((PARSE, BIND, CLOSE))
#: After a Bind, the messages before which its Execute would have come.
BATCH_TURN_TYPES: Final = frozenset((BIND, SYNC, QUERY, TERMINATE))
#: In a batch judged for a read-only replica: allowed, they bring no new statement text
#: (Describe, Execute, Flush, Close).
PASSING_TYPES: Final = frozenset((DESCRIBE, EXECUTE, FLUSH, CLOSE))
