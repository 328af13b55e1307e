"""A pooler serving pgbench under valgrind's callgrind: its instruction totals, by part.

Shared by the instruction-count benches (instructions.py, login_instructions.py, workers.py):
each starts a fresh pooler under callgrind, runs pgbench through it, stops it and reads the
totals callgrind writes to the pooler's log (one per process) and the parts of its profiles.
"""

from __future__ import annotations

import argparse
import pwd
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import run
from run import Database, Pooler, clean_env, int_list, prepare_process

#: callgrind's last words of a process: its pid and its total of instructions.
COLLECTED = re.compile(r"==(\d+)== Collected : (\d+)")
#: Seconds a pooler (and its workers) get to exit and write their profiles after SIGTERM:
#: under valgrind a shutdown takes seconds, more on a busy machine.
STOP_TIMEOUT = 300.0
#: Shared objects by the part of a pooler they are (first match wins).
OBJECTS = [
    ("pgtarn, compiled", r"__mypyc"),
    ("interpreter", r"libpython|^python"),
    ("event loop (uvloop, libuv)", r"^loop\.cpython"),
    ("libc", r"^libc\.so"),
    ("PgBouncer", r"^pgbouncer$"),
    ("libevent", r"^libevent"),
]
#: In a Python process: the functions that hand the GIL over (uvloop runs libuv without the
#: GIL and takes it back for each callback), a part of their own whatever object holds them.
GIL_PART = "GIL hand-offs"
GIL_FUNCTIONS = re.compile(
    r"take_gil|drop_gil|PyGILState_(Ensure|Release)|PyEval_(Save|Restore)"
    r"Thread|pthread_(mutex_lock|mutex_unlock|cond_signal|getspecific)"
)


def prepare(ready_timeout: float) -> bool:
    """False (and said) without valgrind; else the process prepared (run.prepare_process) and
    the poolers given ready_timeout seconds to start, as under callgrind they take seconds."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return False
    prepare_process()
    run.READY_TIMEOUT = ready_timeout
    return True


def add_runs_option(p: argparse.ArgumentParser, name: str, default: tuple[int, int],
                    what: str) -> None:  # fmt: skip
    """--name N1,N2: the counts (of what, per client) of the two runs, the first smaller."""

    def two_counts(text: str) -> tuple[int, int]:
        counts = int_list(text)
        if len(counts) != 2 or not 0 < counts[0] < counts[1]:
            raise argparse.ArgumentTypeError("two counts, the first one smaller: N1,N2")
        return counts[0], counts[1]

    first, second = default
    p.add_argument(f"--{name}", type=two_counts, default=default, metavar="N1,N2",
                   help=f"{what} per client of the two runs ({first},{second})")  # fmt: skip


def part_of(function: str, name: str, python: bool) -> str:
    """The part of a pooler that a function of the shared object called name is."""
    if python and GIL_FUNCTIONS.search(function):
        return GIL_PART
    for part, pattern in OBJECTS:
        if re.search(pattern, name):
            return part
    return "other"


def instructions_by_part(profile: Path) -> Counter[str]:
    """Instructions of a callgrind profile by part (OBJECTS, GIL_PART), from
    callgrind_annotate."""
    out = subprocess.run(
        ["callgrind_annotate", "--auto=no", "--threshold=100", str(profile)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    rows = [
        (int(m.group(1).replace(",", "")), m.group(2), Path(m.group(3)).name)
        for m in (
            re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(.*?)\s*\[([^\]]+)\]\s*$", line)
            for line in out.splitlines()
        )
        if m
    ]
    python = any("libpython" in name for _, _, name in rows)
    parts: Counter[str] = Counter()
    for count, function, name in rows:
        parts[part_of(function, name, python)] += count
    return parts


def per_unit(
    first: Mapping[str, float], second: Mapping[str, float], added: int
) -> dict[str, float]:
    """The counts of the second run less the first's, over the units (transactions, logins)
    the second added: start, logins and shutdown cancel out."""
    return {key: (second[key] - first.get(key, 0)) / added for key in second}


def parts_row(name: str, count: float, base: float, parts: dict[str, float]) -> str:
    """A table row: the pooler, its count, the ratio to PgBouncer's (base), its parts."""
    ratio = f"{count / base:.2f}" if base else "-"
    shown = ", ".join(
        f"{part} {n:,.0f}" for part, n in sorted(parts.items(), key=lambda kv: -kv[1]) if n >= 50
    )
    return f"| {name} | {count:,.0f} | {ratio} | {shown} |"


class CallgrindPooler(Pooler):
    """A Pooler whose command runs under callgrind (profiles to out_file, `%p` the pid; with
    children, one per process) and whose slow shutdown is waited for, not killed at 10 s."""

    def __init__(self, name: str, command: list[str], out_file: Path, workdir: Path,
                 db: Database, account: pwd.struct_passwd | None, *, children: bool = False,
                 settings: dict[str, object] | None = None,
                 secret: str | None = None) -> None:  # fmt: skip
        valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}"]
        if children:
            valgrind.insert(2, "--trace-children=yes")
        super().__init__(name, [*valgrind, *command], workdir, db, account,
                         settings=settings, secret=secret)  # fmt: skip

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def counted(self, options: list[str], clients: int, transactions: int) -> dict[int, int]:
        """A fresh start serves pgbench (its options, clients, transactions per client), then
        stops; callgrind's total of instructions by pid, read from this run's part of the log."""
        since = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.start()
        try:
            pgbench(self, options, clients, transactions)
        finally:
            self.stop()
        text = self.log_path.read_text(errors="replace")[since:]
        found = {int(pid): int(total) for pid, total in COLLECTED.findall(text)}
        if not found:
            raise RuntimeError(f"no callgrind total in {self.log_path}:\n{self.tail()}")
        return found


def pgbench(pooler: Pooler, options: list[str], clients: int, transactions: int) -> None:
    """pgbench through the pooler, on two threads; RuntimeError if it failed or said an error."""
    login = pooler.login()
    res = subprocess.run(
        [pooler.db.tool("pgbench"), "-n", *options, "-c", str(clients), "-j", "2",
         "-t", str(transactions), "-h", login.host, "-p", str(login.port),
         "-U", login.user, login.dbname],
        env=clean_env(PGPASSWORD=login.password), capture_output=True, text=True,
        check=False)  # fmt: skip
    if res.returncode != 0 or "error" in res.stderr.lower():
        raise RuntimeError(f"pgbench through {pooler.name} failed:\n{res.stdout}{res.stderr}")
