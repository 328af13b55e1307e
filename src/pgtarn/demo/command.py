"""The `pgtarn demo` command: start the cluster and pgtarn, print how to connect, clean up."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from ..auth.userlist import userlist_line
from .child import PgtarnChild, PgtarnStartError
from .cluster import ClusterError, ThrowawayCluster
from .ports import LOOPBACK, free_port, port_is_free

__all__ = ["build_parser", "run_demo"]

DEMO_PORT = 6432


class _Terminate(Exception):
    """Raised from the SIGTERM handler to unwind run_demo."""


def _demo_ini(pg_port: int, listen_port: int, workdir: Path) -> str:
    return (
        "; written by `pgtarn demo`; removed again when the demo stops\n"
        "[databases]\n"
        f"demo = host={LOOPBACK} port={pg_port} dbname=demo\n"
        "\n"
        "[pgtarn]\n"
        f"listen_addr = {LOOPBACK}\n"
        f"listen_port = {listen_port}\n"
        f"unix_socket_dir = {workdir}\n"
        "auth_type = scram-sha-256\n"
        f"auth_file = {workdir / 'userlist.txt'}\n"
        "pool_mode = transaction\n"
        "default_pool_size = 10\n"
        "admin_users = demo\n"
    )


def _pick_demo_port(requested: int | None) -> int:
    if requested is not None:
        if not port_is_free(requested):
            raise ClusterError(f"port {requested} is already in use on {LOOPBACK}")
        return requested
    return DEMO_PORT if port_is_free(DEMO_PORT) else free_port()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgtarn demo",
        description="Start a throwaway PostgreSQL cluster and pgtarn in front of it, "
        "print how to connect, and clean everything up on Ctrl-C. "
        "No running PostgreSQL is needed, only its binaries.",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"port for pgtarn to listen on (default {DEMO_PORT}, or a free one if that is taken)",
    )
    return parser


def run_demo(argv: list[str] | None = None) -> int:
    """`pgtarn demo`: a throwaway PostgreSQL with pgtarn in front of it, until Ctrl-C."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise _Terminate

    def say(text: str = "") -> None:
        print(text, flush=True)

    cluster: ThrowawayCluster | None = None
    pgtarn: PgtarnChild | None = None
    old_handler = signal.signal(signal.SIGTERM, on_sigterm)
    # "Press Ctrl-C" must work even when SIGINT came ignored from the parent (a shell's
    # background job): Python keeps an inherited SIG_IGN, and the demo would never stop
    entry_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        listen_port = _pick_demo_port(args.port)
        cluster = ThrowawayCluster()
        say("pgtarn demo: starting a throwaway PostgreSQL cluster ...")
        cluster.start()
        cluster.create_role("demo", "demo")
        cluster.psql("CREATE DATABASE demo OWNER demo;\n")
        workdir = Path(cluster.base_dir)
        (workdir / "userlist.txt").write_text(
            userlist_line("demo", cluster.scram_verifier("demo")), encoding="utf-8"
        )
        ini_path = workdir / "pgtarn.ini"
        ini_path.write_text(_demo_ini(cluster.port, listen_port, workdir), encoding="utf-8")
        say(
            f"pgtarn demo: PostgreSQL {cluster.host}:{cluster.port} is up; "
            f"starting pgtarn on {LOOPBACK}:{listen_port} ..."
        )
        pgtarn = PgtarnChild.launch(
            str(ini_path), host=LOOPBACK, port=listen_port, workdir=str(workdir), timeout=15.0
        )
        conn = f"host={LOOPBACK} port={listen_port} dbname=demo user=demo password=demo"
        say()
        say("pgtarn is running (transaction pooling, SCRAM passthrough). Connect with:")
        say()
        say(f'    psql "{conn}"')
        say()
        say("The admin console (SHOW POOLS; SHOW STATS; SHOW HELP lists the rest):")
        say()
        say(f'    psql "{conn.replace("dbname=demo", "dbname=pgbouncer")}"')
        say()
        say("or load it a little:")
        say()
        say(f'    pgbench -i "{conn}"')
        say(f'    pgbench -c 20 -j 2 -T 10 "{conn}"')
        say()
        say(f"Files (config, userlist, logs) are in {workdir}.")
        say("Press Ctrl-C to stop; everything is removed again.")
        code = pgtarn.proc.wait()
        say(f"pgtarn demo: pgtarn exited unexpectedly (code {code}):")
        say(pgtarn.log_text())
        return 1
    except (KeyboardInterrupt, _Terminate):
        say()
        say("pgtarn demo: stopping ...")
        return 0
    except (ClusterError, PgtarnStartError, OSError) as exc:
        print(f"pgtarn demo: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # let the cleanup finish
        try:
            if pgtarn is not None:
                pgtarn.stop(timeout=5)
            if cluster is not None:
                cluster.cleanup()
        finally:
            signal.signal(signal.SIGINT, entry_int)
            signal.signal(signal.SIGTERM, old_handler)
