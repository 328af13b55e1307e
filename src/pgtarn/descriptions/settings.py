"""Descriptions of the [pgbouncer] settings about the process, pools, clients and logins."""

from __future__ import annotations

from .doc import SettingDoc

PROCESS = "Process and listening"
POOLS = "Pools and limits"
CLIENTS = "Clients and startup parameters"
STATE = "Prepared statements and session state"
AUTH = "Authentication"
LOGS = "Logging and statistics"
CONSOLE = "Admin console and monitoring"
WORKERS = "Workers and peers"

DOCS: dict[str, SettingDoc] = {
    # --- the process and where it listens ------------------------------------------------------
    "logfile": SettingDoc(
        PROCESS,
        (
            "A file every log line is appended to, as well as standard error (which `-q` and `-d` "
            "silence). Empty: no file. A RELOAD or SIGHUP opens it again, so a rotated log is "
            "followed; when it cannot be opened the old destinations stay in use."
        ),
    ),
    "pidfile": SettingDoc(
        PROCESS,
        (
            "A file pgtarn writes its process id to when it starts and removes when it exits (with "
            "`workers` above 1, the supervisor's id: send signals there). `-d` needs it."
        ),
    ),
    "listen_addr": SettingDoc(
        PROCESS,
        (
            "The addresses, comma-separated, on which TCP clients are accepted: numeric addresses "
            "or host names, `*` for every address of the machine (IPv4 and IPv6). Empty: no TCP "
            "at all, only the unix socket."
        ),
    ),
    "listen_port": SettingDoc(
        PROCESS,
        (
            "The TCP port pgtarn listens on; also the number in the unix socket's name, "
            "`.s.PGSQL.<port>`, as PostgreSQL names its own."
        ),
    ),
    "unix_socket_dir": SettingDoc(
        PROCESS,
        (
            "The directory where the unix socket is made; empty: no unix socket. A `[databases]` "
            "or `[peers]` entry without a `host` connects to a socket in this directory."
        ),
        "PgBouncer makes a socket in Linux's abstract namespace for a name starting with `@`; "
        "pgtarn takes such a name as a directory.",
    ),
    "unix_socket_mode": SettingDoc(
        PROCESS,
        (
            "The permission bits of the unix socket file, in octal (`0777`: anyone on the machine "
            "may connect; authentication still applies)."
        ),
    ),
    "unix_socket_group": SettingDoc(
        PROCESS,
        (
            "A group to give the unix socket file to, so that `unix_socket_mode` can let just that "
            "group in."
        ),
    ),
    "user": SettingDoc(
        PROCESS,
        (
            "A system user to become after the listening sockets, the unix socket and the pidfile "
            "are made, when pgtarn is started as root; its groups come with it. A pgtarn that is "
            "not root and is asked to become another user stops with an error. The user must be "
            "able to read the files a RELOAD reads again."
        ),
    ),
    "workers": SettingDoc(
        WORKERS,
        (
            "How many worker processes serve clients behind one port (`auto`: the CPUs pgtarn may "
            "run on). Above 1, a supervisor holds the listening sockets and the kernel spreads "
            "connections over the workers; every limit, the admin console and the metrics still "
            "cover the whole pgtarn. 1 is a single process with no supervisor."
        ),
    ),
    "peer_id": SettingDoc(
        WORKERS,
        (
            "This instance's number in a group of poolers behind one load balancer, written into "
            "every cancel key it hands out, so that another member receiving the CancelRequest "
            "can pass it on (see `[peers]`). 0: not in a group; at most 16383."
        ),
    ),
    "so_reuseport": SettingDoc(
        WORKERS,
        (
            "Bind the TCP listening sockets with SO_REUSEPORT, so that several pgtarn or "
            "PgBouncer processes can share one port and the kernel spreads the connections; give "
            "each its own `unix_socket_dir` and pidfile, and peer them for cancels. `workers` does "
            "this within one pgtarn already."
        ),
    ),
    "job_name": SettingDoc(PROCESS, ("The name PgBouncer registers as a Windows service.")),
    "conffile": SettingDoc(
        PROCESS,
        (
            "The configuration file's name as SHOW CONFIG shows it. In PgBouncer a changed value "
            "makes the next RELOAD read another file; RELOAD and SIGHUP in pgtarn always read the "
            "file pgtarn was started with, so a value set here is only shown."
        ),
    ),
    # --- pools and limits ----------------------------------------------------------------------
    "pool_mode": SettingDoc(
        POOLS,
        (
            "When a client gives its server back. `session`: when it disconnects. `transaction`: "
            "at the end of each transaction, so that many clients share few servers. `statement`: "
            "after each statement, and transaction blocks are refused. A `[databases]` or "
            "`[users]` line may set its own; a client keeps the mode it logged in with."
        ),
    ),
    "max_client_conn": SettingDoc(
        POOLS,
        (
            "How many clients may be connected at once. The one past it is refused with SQLSTATE "
            "53300 and nobody else is affected; ten more admin console logins are let in so that "
            "an operator can look at a full pooler. pgtarn raises its open-file limit towards "
            "what this and the pools need, and warns when the hard limit is too low."
        ),
        "PgBouncer refuses with SQLSTATE 08P01.",
    ),
    "default_pool_size": SettingDoc(
        POOLS,
        (
            "The most servers one pool (a database and user pair) may have, unless its "
            "`[databases]` or `[users]` line sets `pool_size`. It also bounds the cancels in "
            "flight to a peer without a `pool_size` of its own."
        ),
    ),
    "min_pool_size": SettingDoc(
        POOLS,
        (
            "Servers each pool keeps open even when nobody uses them, opened ahead of demand and "
            "again after an outage, up to the pool's size. A pool exists once a client used it, "
            "or at start for a database with a forced `user=`. With workers the number is shared "
            "among them."
        ),
    ),
    "reserve_pool_size": SettingDoc(
        POOLS,
        (
            "Extra servers a pool may open beyond its size once a client has waited "
            "`reserve_pool_timeout`; they close again when nobody waits. 0: no reserve."
        ),
    ),
    "reserve_pool_timeout": SettingDoc(
        POOLS,
        (
            "How long, in seconds, the oldest waiting client waits before the pool may use its "
            "reserve (`reserve_pool_size`)."
        ),
    ),
    "max_db_connections": SettingDoc(
        POOLS,
        (
            "The most servers all pools of one `[databases]` entry may have together (a per-entry "
            "value wins); 0: no limit. The pool's listener connection (LISTEN in transaction mode) "
            "counts too. At the limit, an idle server of another pool of the database is closed "
            "to make room for a waiting client."
        ),
    ),
    "max_db_client_connections": SettingDoc(
        POOLS,
        (
            "The most clients one database may have at once (a per-entry value wins); 0: no "
            "limit. Users in `admin_users` get past it. The client past it gets SQLSTATE 53300."
        ),
        "PgBouncer refuses with SQLSTATE 08P01.",
    ),
    "max_user_connections": SettingDoc(
        POOLS,
        (
            "The most servers all pools of one user may have together (a `[users]` value wins); "
            "0: no limit. The user is the pool's: a database's forced `user=` if it has one. At "
            "the limit, an idle server of another pool of the user is closed to make room."
        ),
    ),
    "max_user_client_connections": SettingDoc(
        POOLS,
        (
            "The most clients one user may have at once (a `[users]` value wins, users found by "
            "`auth_query` included); 0: no limit. The client past it gets SQLSTATE 53300."
        ),
        "PgBouncer refuses with SQLSTATE 08P01.",
    ),
    "server_round_robin": SettingDoc(
        POOLS,
        (
            "In PgBouncer, hand idle servers out in turn rather than the most recently used first, "
            "to spread load over servers behind one address."
        ),
    ),
    "pool_idle_timeout": SettingDoc(
        POOLS,
        (
            "Seconds after which a pool with no clients, no servers and no listener connection is "
            "dropped, with its statistics (so SHOW STATS totals may go down); never a pool with "
            "`min_pool_size`. 0: pools are kept."
        ),
    ),
    "autodb_idle_timeout": SettingDoc(
        POOLS,
        (
            "Seconds after which a database made from the `*` entry is forgotten once its last "
            "client left, its idle servers closed and its statistics dropped."
        ),
    ),
    # --- clients -------------------------------------------------------------------------------
    "track_extra_parameters": SettingDoc(
        CLIENTS,
        (
            "Parameters PostgreSQL reports (ParameterStatus) that pgtarn follows per client, "
            "besides `client_encoding`, `DateStyle`, `TimeZone`, `standard_conforming_strings` and "
            "`application_name`: a client may send them at startup, and each is set on a server "
            "before it is lent to that client."
        ),
    ),
    "ignore_startup_parameters": SettingDoc(
        CLIENTS,
        (
            "Startup parameters a client may send that pgtarn drops instead of refusing. Listing "
            "`options` drops whatever in `options` is not tracked. In transaction and statement "
            "mode with `track_session_state` on, a parameter that is neither tracked nor listed is "
            "kept as a session setting of the client rather than refused."
        ),
        "PgBouncer refuses any other parameter in every mode.",
    ),
    "application_name_add_host": SettingDoc(
        CLIENTS,
        (
            "In PgBouncer, append the client's address and port to the `application_name` it "
            "sends at login."
        ),
    ),
    "disable_pqexec": SettingDoc(
        CLIENTS,
        (
            "In PgBouncer, refuse the simple query protocol, so that a client can send only one "
            "statement per query (a defence against some SQL injections)."
        ),
    ),
    "login_notify_message": SettingDoc(
        CLIENTS,
        (
            "A text every client (admin console included) receives as a NOTICE just before its "
            "first ReadyForQuery, for example to say that it is talking to a pooler. Empty: "
            "none."
        ),
    ),
    "query_wait_notify": SettingDoc(
        CLIENTS,
        (
            "Seconds a client may wait for a server before it is told once, with a NOTICE, that "
            "it is queued. 0: never."
        ),
    ),
    "max_packet_size": SettingDoc(
        CLIENTS,
        (
            "The longest protocol message pgtarn passes, in bytes, from clients and from servers; "
            "a longer one closes the connection with an error (08P01 to a client, nothing of the "
            "message sent on). PostgreSQL itself refuses client messages past 1 GB."
        ),
    ),
    "client_message_buffer": SettingDoc(
        CLIENTS,
        (
            "A client message (Query, Parse, Bind, CopyData...) up to this size, in bytes, is "
            "read whole before it goes on, as the session-state tracking and the prepared "
            "statements read it; a longer one is passed on to the server in pieces as it "
            "arrives, so that pgtarn holds at most about this much of a client's message (or "
            "256 KiB, whichever is more, while the client waits for a server), plus a 64 KiB "
            "read and the server socket's 64 KiB buffer; the client is not read while its "
            "server's socket is full. What pgtarn reads of a longer message: the Clients "
            "page, Large messages."
        ),
    ),
    # --- session state and prepared statements -------------------------------------------------
    "max_prepared_statements": SettingDoc(
        STATE,
        (
            "In transaction and statement mode, prepared statements follow their client: each "
            "distinct statement text is prepared under one shared name on the servers that need "
            "it, and each server keeps at most this many, the least recently used closed first. "
            "SQL-level PREPARE and EXECUTE are carried the same way, and schema changes renew "
            "statements. 0: statements are not tracked (and extended-protocol batches are not "
            "read)."
        ),
        "PgBouncer tracks protocol-level statements only, and does not renew them after schema "
        "changes.",
    ),
    "track_session_state": SettingDoc(
        STATE,
        (
            "In transaction and statement mode, follow each client's session state: its `SET`s "
            "are replayed on whichever server it gets, and what cannot move (advisory locks, "
            "temporary tables, held cursors, `SET ROLE`) keeps its server until it is gone. "
            "`LISTEN` is answered by pgtarn's listener connection. 0: nothing is followed, as in "
            "PgBouncer, and session state stays on the server for its next client."
        ),
    ),
    "pin_session_state": SettingDoc(
        STATE,
        (
            "With `track_session_state`, what would keep a client on its server is allowed (1) or "
            "refused with SQLSTATE 0A000 naming the reason and this setting (0)."
        ),
    ),
    "listen_queue_size": SettingDoc(
        STATE,
        (
            "How many notifications (and warnings) may wait for one listening client in "
            "transaction and statement mode; a client that lets more pile up is closed with FATAL "
            "53400."
        ),
    ),
    "schema_change_channel": SettingDoc(
        STATE,
        (
            "A channel that an event trigger notifies at each schema change made outside pgtarn: "
            "each pool's listener connection LISTENs to it and renews the shared prepared "
            "statements when a notification comes. Empty: off."
        ),
    ),
    "server_reset_query": SettingDoc(
        STATE,
        (
            "A query run on a server when its client leaves it in session mode, before the next "
            "client gets it, to clear session state (the default forgets everything). In "
            "transaction and statement mode it is not run unless `server_reset_query_always`; a "
            "pinned client's server gets `DISCARD ALL` when the client leaves."
        ),
    ),
    "server_reset_query_always": SettingDoc(
        STATE,
        (
            "Run `server_reset_query` at the end of every transaction in transaction and statement "
            "mode too, so that state a client leaves behind is cleared deterministically."
        ),
    ),
    # --- authentication ------------------------------------------------------------------------
    "auth_type": SettingDoc(
        AUTH,
        (
            "How clients prove who they are. `md5` (switching to SCRAM when the stored secret is "
            "a SCRAM verifier), `scram-sha-256` and `plain` check a password against `auth_file` "
            "or `auth_query`; `trust` asks for none but the user must be known; `any` asks for "
            "nothing and takes any user name; `cert` takes the user named by a client "
            "certificate; `hba` decides per connection from `auth_hba_file`. `pam` and `ldap` ask "
            "for the cleartext password and have the system's PAM (`auth_pam_service`) or an LDAP "
            "server (`auth_ldap_options`) check it, on `auth_threads` threads; the password they "
            "accept is the one the pool's servers log in with."
        ),
        "PgBouncer checks `pam` and `ldap` passwords on one thread per method, and stops "
        "reading from every client while its queue of 20 is full; pgtarn refuses a login past "
        "`auth_queue_size` waiting checks (FATAL 53300).",
    ),
    "auth_file": SettingDoc(
        AUTH,
        (
            'The file of users and their secrets (`"user" "secret"` per line): plaintext '
            "passwords, md5 hashes or SCRAM verifiers. A SCRAM verifier that is PostgreSQL's own "
            "also logs pgtarn in to PostgreSQL (SCRAM passthrough), so no plaintext is stored. "
            "Read again at RELOAD."
        ),
    ),
    "auth_hba_file": SettingDoc(
        AUTH,
        (
            "A pg_hba.conf-style file deciding, per connection type, database, user and address, "
            "how a client authenticates, when `auth_type` is `hba`. Read again at RELOAD."
        ),
    ),
    "auth_ident_file": SettingDoc(
        AUTH,
        (
            "A pg_ident.conf-style file of the user maps that HBA rules name with `map=` (for "
            "`cert` and `peer`)."
        ),
    ),
    "auth_user": SettingDoc(
        AUTH,
        (
            "A user that looks up, with `auth_query`, the secret of a user missing from "
            "`auth_file`; its own password comes from `auth_file`. A `[databases]` line may name "
            "its own."
        ),
    ),
    "auth_query": SettingDoc(
        AUTH,
        (
            "The query `auth_user` runs to find a user's name and secret, with the user name as "
            "its `$1` parameter. It runs on a connection of its own whose `search_path` is fixed, "
            "and found secrets are kept for 30 s."
        ),
    ),
    "auth_dbname": SettingDoc(
        AUTH,
        (
            "The `[databases]` entry whose server `auth_query` runs in; empty: the database the "
            "client asked for."
        ),
    ),
    "auth_ldap_options": SettingDoc(
        AUTH,
        (
            "The LDAP options of `auth_type = ldap` (an HBA `ldap` rule has its own on its line): "
            "PostgreSQL's option names as `name=value` pairs, separated by spaces or a comma, "
            "quoted when needed. Simple bind (`ldapprefix`, `ldapsuffix`) or search+bind "
            "(`ldapbasedn`, with `ldapbinddn`, `ldapbindpasswd`, `ldapsearchattribute` or "
            "`ldapsearchfilter`), the server in `ldapserver`, `ldapport`, `ldapscheme` and "
            "`ldaptls`, or all in one `ldapurl`. SHOW CONFIG masks `ldapbindpasswd`."
        ),
        "PgBouncer finds a wrong option at the next LDAP login; pgtarn refuses it when the "
        "configuration loads (startup, RELOAD, SET). `ldapserver` must be set: no server is "
        "looked up in DNS SRV records.",
    ),
    "auth_pam_service": SettingDoc(
        AUTH,
        (
            "The PAM service `auth_type = pam` and HBA `pam` rules ask, whose stack is the file "
            "`/etc/pam.d/<name>`. The default is the name PgBouncer always asks."
        ),
    ),
    "auth_threads": SettingDoc(
        AUTH,
        (
            "How many threads check the passwords of `pam` and `ldap` logins (PAM's "
            "conversation, an LDAP bind), so that the event loop never waits for one; they start "
            "as checks come, and each worker has its own."
        ),
    ),
    "auth_queue_size": SettingDoc(
        AUTH,
        (
            "How many `pam` and `ldap` checks may wait for a free `auth_threads` thread; a login "
            "past that is refused at once with FATAL 53300 and a log line. An LDAP login waits at "
            "most 30 s for its check, its wait included; a PAM check has no limit but its "
            "modules' own and `client_login_timeout`."
        ),
    ),
    "scram_iterations": SettingDoc(
        AUTH,
        (
            "The iteration count of the SCRAM-SHA-256 verifier pgtarn derives when a client logs "
            "in with SCRAM against a plaintext password: more is slower to guess and slower to log "
            "in."
        ),
    ),
    # --- logging -------------------------------------------------------------------------------
    "syslog": SettingDoc(LOGS, ("Send log lines to the system log too, through `/dev/log`.")),
    "syslog_ident": SettingDoc(LOGS, ("The program name the system log shows for pgtarn's lines.")),
    "syslog_facility": SettingDoc(
        LOGS,
        (
            "The syslog facility of pgtarn's lines (`daemon`, `user`, `auth`, `local0` to "
            "`local7`, ...); an unknown name falls back to `daemon`."
        ),
    ),
    "log_connections": SettingDoc(
        LOGS, ("Log each client login (`login attempt: db=... user=... tls=...`).")
    ),
    "log_disconnections": SettingDoc(
        LOGS, ("Log each client and server that closes, with the reason (`closing because: ...`).")
    ),
    "log_pooler_errors": SettingDoc(
        LOGS,
        (
            "Log the errors pgtarn itself sends to clients, the admin commands run, and the first "
            "pin of each reason in a pool."
        ),
    ),
    "log_stats": SettingDoc(
        LOGS,
        (
            "Log a line of statistics every `stats_period`: transactions, queries, parses and "
            "binds per second, bytes in and out per second, and the average transaction, query "
            "and wait times."
        ),
    ),
    "stats_period": SettingDoc(
        LOGS,
        (
            "Seconds between two updates of the averages SHOW STATS shows, and between two "
            "`log_stats` lines."
        ),
    ),
    "verbose": SettingDoc(
        LOGS,
        (
            "More detail in the log, as `-v` on the command line (the two add up); any value above "
            "0 turns on debug lines."
        ),
        "PgBouncer has three levels of detail; pgtarn has one.",
    ),
    "log_format": SettingDoc(
        LOGS,
        (
            "`text`: PgBouncer-style lines; `json`: one JSON object per line (time, pid, level, "
            "logger, message), for log collectors."
        ),
    ),
    # --- admin console and monitoring ----------------------------------------------------------
    "admin_users": SettingDoc(
        CONSOLE,
        (
            "Users who may log in to the admin console (database `pgbouncer`) and run every "
            "command. They authenticate as anyone else."
        ),
    ),
    "stats_users": SettingDoc(
        CONSOLE,
        (
            "Users who may log in to the admin console and run SHOW commands only (not SHOW "
            "PREPARED_STATEMENTS, which shows query texts)."
        ),
    ),
    "metrics_port": SettingDoc(
        CONSOLE,
        (
            "A TCP port for a Prometheus endpoint (`GET /metrics`), computed from the admin "
            "console's tables at each scrape. 0: no endpoint."
        ),
    ),
    "metrics_listen_addr": SettingDoc(
        CONSOLE,
        (
            "The address the Prometheus endpoint listens on; empty means 127.0.0.1, `*` every "
            "address."
        ),
    ),
}
