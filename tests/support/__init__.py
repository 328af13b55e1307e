"""The test harness, shared by the tests and bench/: throwaway PostgreSQL clusters, pgtarn
child processes, conninfo strings.

The clusters and child processes build on the small pieces `pgtarn demo` ships in the package
(pgtarn.demo.cluster, pgtarn.demo.child, pgtarn.demo.ports) and on the auth_file writer
(pgtarn.auth.userlist); this harness imports them, the package never imports the harness.
Everything a test or a benchmark needs is named here, so they import from `tests.support`.
bench/ scripts reach it through bench/harness.py, which puts the repository root on sys.path.
"""

from pgtarn.auth.userlist import userlist_line
from pgtarn.demo.child import PgtarnStartError
from pgtarn.demo.cluster import SUPERUSER, ClusterError, PostgresNotFound, find_bindir
from pgtarn.demo.ports import LOOPBACK, free_port, port_is_free

from .cluster import TempCluster, ipv6_loopback_works
from .conninfo import make_dsn
from .process import PgtarnProcess

__all__ = [
    "LOOPBACK",
    "SUPERUSER",
    "ClusterError",
    "PgtarnProcess",
    "PgtarnStartError",
    "PostgresNotFound",
    "TempCluster",
    "find_bindir",
    "free_port",
    "ipv6_loopback_works",
    "make_dsn",
    "port_is_free",
    "userlist_line",
]
