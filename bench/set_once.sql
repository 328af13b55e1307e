-- pgbench script of bench/run.py's set-once workload: pgbench -S's SELECT, and in each
-- client's first transaction only (pgbench keeps a client's variables from one transaction to
-- the next; run with -D settings_done=0 -s <scale>) a SET of search_path, the same for every
-- client, and of statement_timeout, a value of the client's own (30 s + client_id ms).
\if :settings_done = 0
SET search_path = public;
\set timeout_ms 30000 + :client_id
SET statement_timeout = :timeout_ms;
\set settings_done 1
\endif
\set aid random(1, 100000 * :scale)
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
