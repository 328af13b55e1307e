"""SHOW <what> by name: the tables of tables.py, and MEM, DNS_HOSTS and DNS_ZONES.

SHOW MEM has PgBouncer's columns for what pgtarn holds, by kind: ``used`` is how many there
are, ``memtotal`` the sum of their shallow sizes in bytes (``sys.getsizeof``: what an object
refers to, its buffers, dicts and strings, is not counted, so this is a lower bound) and
``size`` their average. ``free`` is 0: Python frees an object when its last reference goes,
where PgBouncer keeps freed slab objects for reuse. pgtarn has no DNS cache (each server
connection asks the system's resolver), so SHOW DNS_HOSTS and DNS_ZONES have no rows.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection

from ..runtime import Runtime
from .tables import (
    INT4,
    INT8,
    TEXT,
    Table,
    Value,
    all_servers,
    show_active_sockets,
    show_clients,
    show_config,
    show_databases,
    show_hosts,
    show_listeners,
    show_lists,
    show_peer_pools,
    show_peers,
    show_pools,
    show_prepared_statements,
    show_servers,
    show_sockets,
    show_state,
    show_stats,
    show_stats_averages,
    show_stats_totals,
    show_totals,
    show_users,
    show_version,
)

MEM_COLUMNS = [("name", TEXT), ("size", INT4), ("used", INT4), ("free", INT4), ("memtotal", INT4)]
DNS_HOSTS_COLUMNS = [("hostname", TEXT), ("ttl", INT8), ("addrs", TEXT)]
DNS_ZONES_COLUMNS = [("zonename", TEXT), ("serial", INT8), ("count", INT4)]


def _mem_row(name: str, objects: Collection[object]) -> list[Value]:
    total = sum(sys.getsizeof(o) for o in objects)
    return [name, total // len(objects) if objects else 0, len(objects), 0, total]


def show_mem(runtime: Runtime) -> Table:
    """What pgtarn holds, by kind (see the module docstring)."""
    statements = runtime.statement_cache.statements()
    rows = [
        _mem_row("clients", list(runtime.clients.values())),
        _mem_row("servers", all_servers(runtime)),
        _mem_row("pools", list(runtime.registry)),
        _mem_row("databases", list(runtime.registry.databases.values())),
        _mem_row("auth_file_users", list(runtime.userlist.values())),
        _mem_row("prepared_statements", statements),
        _mem_row("prepared_statement_texts", [s.query for s in statements]),
        _mem_row("auth_query_secrets", list(runtime.found_secrets.values())),
        _mem_row("client_parameter_sets", list(runtime.params_forms.values())),
    ]
    return Table(MEM_COLUMNS, rows)


def show_dns_hosts(runtime: Runtime) -> Table:
    """No DNS cache: no rows (see the module docstring)."""
    return Table(DNS_HOSTS_COLUMNS, [])


def show_dns_zones(runtime: Runtime) -> Table:
    """No DNS cache: no rows (see the module docstring)."""
    return Table(DNS_ZONES_COLUMNS, [])


SHOW_TABLES: dict[str, Callable[[Runtime], Table]] = {
    "pools": show_pools,
    "clients": show_clients,
    "servers": show_servers,
    "stats": show_stats,
    "stats_totals": show_stats_totals,
    "stats_averages": show_stats_averages,
    "totals": show_totals,
    "databases": show_databases,
    "users": show_users,
    "lists": show_lists,
    "state": show_state,
    "config": show_config,
    "version": show_version,
    "prepared_statements": show_prepared_statements,
    "listeners": show_listeners,
    "sockets": show_sockets,
    "active_sockets": show_active_sockets,
    "peers": show_peers,
    "peer_pools": show_peer_pools,
    "hosts": show_hosts,
    "mem": show_mem,
    "dns_hosts": show_dns_hosts,
    "dns_zones": show_dns_zones,
}
