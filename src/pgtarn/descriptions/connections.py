"""Descriptions of the [pgbouncer] settings about servers, timeouts, TLS and the network."""

from __future__ import annotations

from .doc import SettingDoc

SERVERS = "Server connections"
TIMEOUTS = "Client timeouts"
CLIENT_TLS = "TLS towards clients"
SERVER_TLS = "TLS towards PostgreSQL"
NETWORK = "Network and DNS"

_SQLSTATE = "PgBouncer closes the client with SQLSTATE 08P01."

DOCS: dict[str, SettingDoc] = {
    # --- server connections --------------------------------------------------------------------
    "server_lifetime": SettingDoc(
        SERVERS,
        (
            "Seconds after which a server is closed: when it is next released, or while idle, "
            "never in the middle of a transaction. 0: each server serves one client, then closes. "
            "A `[databases]` line may set its own."
        ),
    ),
    "server_idle_timeout": SettingDoc(
        SERVERS,
        (
            "Seconds an idle server may stay unused before it is closed (a pool keeps "
            "`min_pool_size`). 0: idle servers stay."
        ),
    ),
    "server_connect_timeout": SettingDoc(
        SERVERS,
        (
            "Seconds a connection and login to PostgreSQL may take before it is given up; clients "
            'waiting with no other server to come then get 08006 "could not connect to server". '
            "A server whose reset or check query goes unanswered this long is closed too."
        ),
    ),
    "server_login_retry": SettingDoc(
        SERVERS,
        (
            "After a failed login, a pool tries again after 50 ms, doubling up to 1 s or this many "
            "seconds if fewer; clients keep waiting meanwhile and are served as soon as PostgreSQL "
            "answers. After an error that will not pass by itself (a wrong password, no such "
            "database) the retries are spaced up to this value, and a client asking meanwhile with "
            "no server to come gets the cached error. A RELOAD lets the next client try at once."
        ),
        "PgBouncer waits the whole interval after any failed login and refuses every client "
        "meanwhile.",
    ),
    "server_check_delay": SettingDoc(
        SERVERS,
        (
            "Seconds a released server may sit unused and still be lent without a check; one idle "
            "longer first runs `server_check_query` (0: always checked)."
        ),
    ),
    "server_check_query": SettingDoc(
        SERVERS,
        (
            "The query that checks an idle server is still alive before reuse. `<empty>` sends an "
            "empty query (the cheapest); an empty value turns the check off."
        ),
    ),
    "server_fast_close": SettingDoc(
        SERVERS,
        (
            "In session mode, a server that is to be closed (after RECONNECT, or a RELOAD that "
            "changed its connection settings) closes as soon as its transaction ends instead of "
            'when its client leaves; the client then gets FATAL 08P01 "database configuration '
            "changed (server_fast_close)\". Other modes release servers at each transaction's end "
            "anyway."
        ),
    ),
    "server_channel_binding": SettingDoc(
        SERVERS,
        (
            "SCRAM-SHA-256-PLUS towards PostgreSQL over TLS, binding the login to the TLS channel. "
            "`prefer`: bind when the server offers it. `require`: send no password or hash to a "
            "server that has not proven itself, and refuse one that lets pgtarn in without a bound "
            "exchange. `disable`: never bind."
        ),
    ),
    "cancel_wait_timeout": SettingDoc(
        SERVERS,
        (
            "Seconds a cancel request may take to reach PostgreSQL (or a peer) and be answered; "
            "past it the request is given up and logged, and its server, held meanwhile, is "
            "closed if the request was sent. 0: `server_connect_timeout` is used instead."
        ),
        "In PgBouncer, 0 lets a cancel wait for ever.",
    ),
    # --- client timeouts -----------------------------------------------------------------------
    "client_login_timeout": SettingDoc(
        TIMEOUTS,
        (
            "Seconds a client has, from its connection, to finish logging in; one that is silent "
            "or slow is closed (FATAL 08P01)."
        ),
    ),
    "client_idle_timeout": SettingDoc(
        TIMEOUTS,
        (
            "Seconds a client may stay idle outside a transaction before it is closed with FATAL "
            "57P05, PostgreSQL's code for an idle session timeout. 0: off. A `[users]` line may "
            "set its own."
        ),
        _SQLSTATE,
    ),
    "idle_transaction_timeout": SettingDoc(
        TIMEOUTS,
        (
            "Seconds a client may stay idle inside a transaction before it is closed with FATAL "
            '08P01 "idle transaction timeout (idle_transaction_timeout = N s)"; its transaction '
            "is rolled back and its server reused. 0: off. A `[users]` line may set its own."
        ),
    ),
    "transaction_timeout": SettingDoc(
        TIMEOUTS,
        (
            "Seconds a transaction may stay open, running or idle, before its client is closed "
            'with FATAL 08P01 "transaction timeout (transaction_timeout = N s)". A query '
            "running then is cancelled and its server closed; an idle transaction is rolled back "
            "and its server reused. 0: off. A `[users]` line may set its own."
        ),
        "PgBouncer closes the server of an idle transaction too, and sends no cancel.",
    ),
    "query_timeout": SettingDoc(
        TIMEOUTS,
        (
            "Seconds a query may run, counted from when the client sent it (waiting for a server "
            'included), before its client is closed with FATAL 08P01 "query timeout '
            '(query_timeout = N s)"; its server is closed and a CancelRequest sent for the '
            "query, so that it does not run on in PostgreSQL. A client still waiting for a server "
            'then gets "query_timeout: no server connection in N s". 0: off. A `[users]` line '
            "may set its own."
        ),
        "PgBouncer sends no CancelRequest, and takes the global value for a client still "
        "waiting for a server.",
    ),
    "query_wait_timeout": SettingDoc(
        TIMEOUTS,
        (
            "Seconds a client may wait for a server (also while its pool is paused, or while "
            "PostgreSQL cannot be reached) before it is closed with FATAL 08P01, with the last "
            "login error if there was one. 0: no limit, except that while the pool's logins fail "
            "a client waits `server_connect_timeout` at most. A `[databases]` or `[users]` line "
            "may set its own."
        ),
        "With 0, PgBouncer lets clients wait for ever for a PostgreSQL that cannot be reached.",
    ),
    "suspend_timeout": SettingDoc(
        TIMEOUTS,
        (
            "In PgBouncer, how long SUSPEND and an online restart wait for the sockets' buffers to "
            "empty before dropping a connection."
        ),
    ),
    # --- TLS towards clients -------------------------------------------------------------------
    "client_tls_sslmode": SettingDoc(
        CLIENT_TLS,
        (
            "TLS for TCP clients (unix socket clients never use it). `disable`: refused. `allow` "
            "and `prefer`: used when the client asks. `require`: plaintext logins are refused. "
            "`verify-ca`: a client certificate signed by `client_tls_ca_file` is needed too. "
            "`verify-full`: and its common name must be the user name (under `auth_type = hba` "
            "the rule and its `map=` decide). PostgreSQL 17's direct TLS works too."
        ),
        "PgBouncer treats `verify-full` as `verify-ca`.",
    ),
    "client_tls_key_file": SettingDoc(
        CLIENT_TLS,
        ("The private key of pgtarn's certificate for clients (PEM). Read again at RELOAD."),
    ),
    "client_tls_cert_file": SettingDoc(
        CLIENT_TLS,
        (
            "The certificate pgtarn shows clients (PEM); its hash is what SCRAM-SHA-256-PLUS binds "
            "to. Read again at RELOAD."
        ),
    ),
    "client_tls_ca_file": SettingDoc(
        CLIENT_TLS,
        (
            "The certificate authorities whose client certificates are accepted, for `verify-ca`, "
            "`verify-full` and `auth_type = cert`."
        ),
    ),
    "client_tls_protocols": SettingDoc(
        CLIENT_TLS,
        (
            "The TLS versions clients may use: `secure` (1.2 and 1.3), `all`, or a list such as "
            "`tlsv1.2,tlsv1.3`."
        ),
    ),
    "client_tls_ciphers": SettingDoc(
        CLIENT_TLS,
        (
            "The ciphers offered for TLS 1.2 and older: one of PgBouncer's keywords (`default`, "
            "`secure`, `fast`, `normal`, `all`, ...) or an OpenSSL cipher list."
        ),
    ),
    "client_tls13_ciphers": SettingDoc(
        CLIENT_TLS,
        (
            "The TLS 1.3 cipher suites offered to clients, OpenSSL's names separated by `:`; "
            "empty: OpenSSL's defaults. Python's `ssl` module cannot set them, so pgtarn sets them "
            "on the context's OpenSSL object through `ctypes` (CPython only; elsewhere a value is "
            "a clear error)."
        ),
    ),
    "client_tls_ecdhcurve": SettingDoc(
        CLIENT_TLS,
        (
            "The elliptic curve for ECDH key exchange with clients: `auto` (OpenSSL's choice) or a "
            "curve name."
        ),
    ),
    "client_tls_dheparams": SettingDoc(
        CLIENT_TLS,
        ("In PgBouncer, the size of the Diffie-Hellman parameters for clients' key exchange."),
    ),
    # --- TLS towards PostgreSQL ----------------------------------------------------------------
    "server_tls_sslmode": SettingDoc(
        SERVER_TLS,
        (
            "TLS towards PostgreSQL over TCP, with libpq's meanings: `disable` never asks, `allow` "
            "and `prefer` use it when the server has it, `require` fails a server without it (at "
            "once), `verify-ca` checks the server's certificate chain against `server_tls_ca_file` "
            "(or the system's), `verify-full` its host name too. A RELOAD that changes a "
            "`server_tls_*` setting replaces the servers as they are released."
        ),
    ),
    "server_tls_ca_file": SettingDoc(
        SERVER_TLS,
        (
            "The certificate authorities that PostgreSQL's certificate must chain to for "
            "`verify-ca` and `verify-full`; empty: the system's."
        ),
    ),
    "server_tls_key_file": SettingDoc(
        SERVER_TLS, ("The private key of the client certificate pgtarn shows PostgreSQL.")
    ),
    "server_tls_cert_file": SettingDoc(
        SERVER_TLS, ("A client certificate pgtarn shows PostgreSQL, for its `cert` authentication.")
    ),
    "server_tls_protocols": SettingDoc(
        SERVER_TLS, ("The TLS versions used towards PostgreSQL, as `client_tls_protocols`.")
    ),
    "server_tls_ciphers": SettingDoc(
        SERVER_TLS,
        ("The ciphers used towards PostgreSQL for TLS 1.2 and older, as `client_tls_ciphers`."),
    ),
    "server_tls13_ciphers": SettingDoc(
        SERVER_TLS,
        (
            "The TLS 1.3 cipher suites used towards PostgreSQL, OpenSSL's names separated by "
            "`:`; empty: OpenSSL's defaults. Set as `client_tls13_ciphers` is."
        ),
    ),
    # --- network and DNS -----------------------------------------------------------------------
    "listen_backlog": SettingDoc(
        NETWORK,
        (
            "The length of the kernel's queue of connections not yet accepted, for each listening "
            "socket."
        ),
    ),
    "pkt_buf": SettingDoc(NETWORK, ("In PgBouncer, the size of each connection's packet buffer.")),
    "sbuf_loopcnt": SettingDoc(
        NETWORK,
        (
            "In PgBouncer, how many buffers of one connection are processed before turning to the "
            "next."
        ),
    ),
    "tcp_defer_accept": SettingDoc(
        NETWORK,
        (
            "In PgBouncer, Linux's TCP_DEFER_ACCEPT on the listening sockets: a connection is "
            "accepted only once it has sent data."
        ),
    ),
    "tcp_socket_buffer": SettingDoc(
        NETWORK,
        (
            "The send and receive buffer size of every TCP connection, in bytes; 0 keeps the "
            "system's. Set on the listening sockets (accepted connections inherit it) and on each "
            "server socket before it connects."
        ),
    ),
    "tcp_keepalive": SettingDoc(
        NETWORK,
        (
            "TCP keepalive on client and server connections, so that a peer that vanished is "
            "noticed."
        ),
    ),
    "tcp_keepcnt": SettingDoc(
        NETWORK,
        ("Unanswered keepalive probes before a connection is dropped; 0 keeps the system's."),
    ),
    "tcp_keepidle": SettingDoc(
        NETWORK, ("Seconds of silence before the first keepalive probe; 0 keeps the system's.")
    ),
    "tcp_keepintvl": SettingDoc(
        NETWORK, ("Seconds between keepalive probes; 0 keeps the system's.")
    ),
    "tcp_user_timeout": SettingDoc(
        NETWORK,
        (
            "Milliseconds sent data may stay unacknowledged before the connection is dropped "
            "(TCP_USER_TIMEOUT, Linux); 0 keeps the system's."
        ),
    ),
    "dns_max_ttl": SettingDoc(
        NETWORK, ("In PgBouncer, how long a host name's resolution is cached.")
    ),
    "dns_nxdomain_ttl": SettingDoc(
        NETWORK, ("In PgBouncer, how long a failed host name lookup is cached.")
    ),
    "dns_zone_check_period": SettingDoc(
        NETWORK,
        (
            "In PgBouncer, how often the DNS zones of the hosts are checked for a new serial, to "
            "look their names up again."
        ),
    ),
    "resolv_conf": SettingDoc(
        NETWORK, ("In PgBouncer, a resolver configuration file of its own instead of the system's.")
    ),
}
