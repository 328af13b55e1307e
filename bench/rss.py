"""Where one pgtarn's memory goes: the real process with one client, by mapping, and what its
imports would weigh without asyncio, uvloop, ssl or OpenSSL's libcrypto.

Two measurements, each printed as a markdown table:

- **One client, by mapping:** pgtarn started on bench/run.py's pgbouncer.ini (transaction
  mode, SCRAM, a temporary PostgreSQL), one client logged in that has run `SELECT 1`; then
  VmRSS and PSS (smaps_rollup) of the process, and RSS and PSS of each mapping of
  /proc/PID/smaps summed by what it maps: the Python heap (the anonymous mappings and
  [heap]), libpython, OpenSSL's libcrypto and libssl, pgtarn's compiled library, uvloop's,
  libc and libm, the rest. `--runs` fresh processes, the median of each.
- **Import floors:** VmRSS of a fresh interpreter after importing what `pgtarn CONFIG`
  imports at start (pgtarn.cli), then the same with modules taken out of the way: asyncio
  and uvloop replaced by empty stand-ins (the floor under an event loop of pgtarn's own),
  then ssl as well (TLS loaded only when configured), then `_hashlib` refused (hashlib
  falls back on CPython's own digests: no libcrypto). Only imports: nothing runs.

Both are measured as the interpreter starts and with -S (site-packages put on sys.path by
hand), so that no .pth file runs: some installations import whole packages at every start.
`--pgtarn-build DIR` (repeatable; a directory made by `pip install --no-deps --target DIR .`)
measures that build, put on the pooler's PYTHONPATH only: the bench's own process imports
pgtarn's protocol modules, and were they the same build's compiled library, the pooler would
share its pages with the bench and its PSS would read low. Without it, the pgtarn this
Python imports is measured.

    python3 bench/rss.py [--runs 3] [--no-floors] [--pgtarn-build DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

from memory import Login, connect, proc_pss_kb, proc_status_kb
from run import Database, Pooler, add_postgres_options, ended, finish, log, make_workdir

NO_PTH = "import site, sys; sys.path += site.getsitepackages()\n"
RUN_PGTARN = "import runpy; runpy.run_module('pgtarn', run_name='__main__', alter_sys=True)"
#: Mapping groups, by a part of the mapped file's name ("" for the anonymous ones).
GROUPS = [
    ("Python heap (anonymous, [heap])", ("", "[heap]", "[stack]")),
    ("libpython", ("libpython",)),
    ("libcrypto + libssl + _ssl + _hashlib", ("libcrypto", "libssl", "_ssl.", "_hashlib.")),
    ("pgtarn's compiled library", ("__mypyc",)),
    ("uvloop", ("uvloop",)),
    ("libc + libm + ld.so", ("libc.", "libm.", "ld-linux")),
]
OTHER = "the rest (other extensions, locale)"

#: Module stand-ins for the floors: any attribute is a class or a callable that does nothing.
STUBS = """
import sys, types
class _Base:
    def __init_subclass__(cls, **kw): pass
    def __class_getitem__(cls, item): return cls
class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"): raise AttributeError(name)
        return _Any()
    def __iter__(cls): return iter(())
class _Any:
    def __init__(self, *a, **kw): pass
    def __call__(self, *a, **kw): return _Any()
    def __getattr__(self, name): return _Any()
    def __iter__(self): return iter(())
    def __or__(self, other): return self
    def __ror__(self, other): return self
class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"): raise AttributeError(name)
        if name[:1].isupper():
            # ssl's classes are read for their attributes (TLSVersion.TLSv1_2); asyncio's are
            # subclassed by compiled classes, which cannot have a metaclass
            made = _Meta(name, (), {}) if self.__name__ == "ssl" else type(name, (_Base,), {})
            setattr(self, name, made)
            return made
        return _Any()
for name in STUBBED:
    sys.modules[name] = _Stub(name)
    sys.modules[name].__path__ = []
for name in REFUSED:
    sys.modules[name] = None
"""
ASYNCIO = ["asyncio", *(f"asyncio.{m}" for m in (
    "base_events", "events", "futures", "tasks", "protocols", "transports", "subprocess",
    "streams", "exceptions", "locks", "queues", "base_subprocess", "unix_events",
    "selector_events")), "uvloop"]  # fmt: skip
FLOORS = [
    ("pgtarn's start imports", [], []),
    ("without asyncio and uvloop", ASYNCIO, []),
    ("without asyncio, uvloop, ssl", [*ASYNCIO, "ssl"], []),
    ("without asyncio, uvloop, ssl, libcrypto", [*ASYNCIO, "ssl"], ["_hashlib"]),
]
READ_RSS = (
    "\nimport pgtarn.cli, gc; gc.collect()"
    "\nfor line in open('/proc/self/status'):"
    "\n    if line.startswith('VmRSS:'): print(line.split()[1])\n"
)


def by_mapping(pid: int) -> dict[str, tuple[int, int]]:
    """RSS and PSS in kB of the process's mappings, summed by GROUPS."""
    sums: dict[str, list[int]] = {}
    group = OTHER
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            fields = line.split()
            if "-" in fields[0] and ":" not in fields[0]:  # a mapping's first line
                name = fields[5] if len(fields) > 5 else ""
                group = next((label for label, parts in GROUPS
                              if (not name and "" in parts) or
                              any(p and p in name for p in parts)), OTHER)  # fmt: skip
            elif fields[0] in ("Rss:", "Pss:"):
                kept = sums.setdefault(group, [0, 0])
                kept[fields[0] == "Pss:"] += int(fields[1])
    return {label: (rss, pss) for label, (rss, pss) in sums.items()}


async def hold_one(login: Login, pid: int) -> tuple[int, int, dict[str, tuple[int, int]]]:
    """Log one client in, let it run SELECT 1, then read the process's memory."""
    _reader, writer = await connect(login)
    await asyncio.sleep(1.5)  # the login's after-effects settled (a server idle in its pool)
    found = proc_status_kb(pid, "VmRSS"), proc_pss_kb(pid), by_mapping(pid)
    writer.close()
    return found


def one_client(pooler: Pooler, runs: int) -> tuple[list[int], list[int], dict[str, list[int]]]:
    rss: list[int] = []
    pss: list[int] = []
    groups: dict[str, list[int]] = {}
    for _ in range(runs):
        pooler.start()
        try:
            r, p, mapped = asyncio.run(hold_one(pooler.login(), pooler.pid))
        finally:
            pooler.stop()
        rss.append(r)
        pss.append(p)
        for label, (mr, mp) in mapped.items():
            groups.setdefault(label, []).append(mr)
            groups.setdefault(label + "\0pss", []).append(mp)
    return rss, pss, groups


def floor(env: dict[str, str], no_pth: bool, stubbed: list[str], refused: list[str]) -> int | None:
    code = f"STUBBED = {stubbed!r}\nREFUSED = {refused!r}\n" + STUBS + READ_RSS
    python = sys.executable
    command = [python, "-S", "-c", NO_PTH + code] if no_pth else [python, "-c", code]
    out = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, **env}
    )
    return int(out.stdout) if out.returncode == 0 else None


def mb(kb: float | None) -> str:
    return "-" if kb is None else f"{kb / 1024:.1f}"


def build_env(build: str | None) -> dict[str, str]:
    """The environment over the bench's that makes `python3 -m pgtarn` import build."""
    if build is None:
        return {}
    paths = [os.path.abspath(build), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, metavar="N", help="fresh processes (3)")
    p.add_argument("--no-floors", action="store_true", help="only the process with one client")
    p.add_argument(
        "--pgtarn-build",
        action="append",
        default=[],
        metavar="DIR",
        help="a pgtarn build to measure (repeatable; default: the one imported)",
    )
    add_postgres_options(p)
    args = p.parse_args()
    args.clients = [1]  # Database.setup reads it
    builds: list[str | None] = list(args.pgtarn_build) or [None]
    variants = [("as started", [sys.executable, "-m", "pgtarn"]),
                ("-S (no .pth)", [sys.executable, "-S", "-c", NO_PTH + RUN_PGTARN])]  # fmt: skip
    workdir = make_workdir("rss", None)
    db = Database(args)
    columns: dict[str, tuple[list[int], list[int], dict[str, list[int]]]] = {}
    try:
        db.setup(scale=None)
        for build in builds:
            for label, command in variants:
                name = label if build is None else f"{os.path.basename(build)}, {label}"
                log(f"pgtarn {name}: {args.runs} runs ...")
                pooler = Pooler("pgtarn", command, workdir, db, None, env=build_env(build))
                columns[name] = one_client(pooler, args.runs)
    except (RuntimeError, KeyboardInterrupt) as exc:  # includes ClusterError: setup failed
        return ended(exc)
    finally:
        finish([], db, workdir, args.keep)
    print(f"## One client: RSS / PSS, MB (median of {args.runs}, {time.strftime('%Y-%m-%d')})\n")
    print("| | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    cells = [f"{mb(statistics.median(r))} / {mb(statistics.median(s))}" for r, s, _g in
             columns.values()]  # fmt: skip
    print("| the process | " + " | ".join(cells) + " |")
    for label in [g for g, _parts in GROUPS] + [OTHER]:
        cells = []
        for _r, _s, groups in columns.values():
            rss, pss = groups.get(label, [0]), groups.get(label + "\0pss", [0])
            cells.append(f"{mb(statistics.median(rss))} / {mb(statistics.median(pss))}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    if args.no_floors:
        return 0
    print("\n## Import floors: VmRSS after importing pgtarn.cli, MB\n")
    heads = [f"{'' if b is None else os.path.basename(b) + ', '}{label}" for b in builds
             for label in ("as started", "-S (no .pth)")]  # fmt: skip
    print("| | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    for label, stubbed, refused in FLOORS:
        cells = [mb(floor(build_env(b), no_pth, stubbed, refused)) for b in builds
                 for no_pth in (False, True)]  # fmt: skip
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
