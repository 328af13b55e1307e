"""Compare two pgtarn builds (and PgBouncer) on one cluster, runs interleaved against drift.

    python3 bench/ab.py --before /path/to/other/checkout/src [--clients 10,100] [--runs 5]

"before" runs pgtarn from the given source directory (PYTHONPATH), "after" from this
checkout; each run rotates the order of the targets. Prints, per workload, the median TPS
and pooler CPU per 10k transactions of each target with their spread (min-max), and the
after/before and after/PgBouncer ratios of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import harness  # noqa: F401  (puts the repository root on sys.path)
from run import (
    Database,
    PgBouncerMissing,
    Pooler,
    Result,
    add_pgbouncer_option,
    add_postgres_options,
    cases,
    find_pgbouncer,
    int_list,
    log,
    make_workdir,
    postgres_account,
    prepare_process,
    remove_workdir,
    run_case,
)

SRC = Path(__file__).resolve().parent.parent / "src"


class BuildPooler(Pooler):
    """pgtarn from one source tree."""

    def __init__(self, name: str, src: Path, workdir: Path, db: Database) -> None:
        super().__init__(name, [sys.executable, "-m", "pgtarn"], workdir, db, None)
        self.src = src

    def start(self) -> None:
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(self.src)
        try:
            super().start()
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--before", type=Path, required=True, help="src directory of the other build"
    )
    parser.add_argument("--clients", type=int_list, default=[10, 100])
    parser.add_argument("--workloads", default="select-only")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--no-pgbouncer", action="store_true")
    add_pgbouncer_option(parser)
    add_postgres_options(parser)
    args = parser.parse_args()
    prepare_process()
    workdir = make_workdir("ab", postgres_account())
    db = Database(args)
    poolers: dict[str, Pooler] = {
        "before": BuildPooler("before", args.before.resolve(), workdir, db),
        "after": BuildPooler("after", SRC, workdir, db),
    }
    if not args.no_pgbouncer:
        try:
            binary = find_pgbouncer(args.pgbouncer)
            poolers["pgbouncer"] = Pooler("pgbouncer", [binary], workdir, db, postgres_account())
        except PgBouncerMissing as exc:
            log(str(exc))
    targets = list(poolers)
    results: list[Result] = []
    try:
        db.setup()
        case_list = cases(args.clients, args.workloads.split(","))
        for run in range(1, args.runs + 1):
            shift = (run - 1) % len(targets)
            order = targets[shift:] + targets[:shift]
            for case in case_list:
                for target in order:
                    pooler = poolers[target]
                    pooler.start()
                    try:
                        result = run_case(db, case, target, pooler, run, args.duration)
                    finally:
                        pooler.stop()
                    results.append(result)
                    log(
                        f"[run {run}/{args.runs}] {case.label:<28} {target:<9} "
                        f"{result.tps or 0:,.0f} tps {result.error}"
                    )
        for case in case_list:
            print(f"\n{case.label} ({args.runs} runs, median [min-max])")
            medians: dict[str, tuple[float, float]] = {}
            for target in targets:
                mine = [
                    r
                    for r in results
                    if r.case == case.label
                    and r.target == target
                    and r.ok
                    and r.tps
                    and r.cpu_s_per_10k
                ]
                if not mine:
                    print(f"  {target:<9} no successful run")
                    continue
                tps = [r.tps or 0.0 for r in mine]
                cpu = [r.cpu_s_per_10k or 0.0 for r in mine]
                medians[target] = (statistics.median(tps), statistics.median(cpu))
                print(
                    f"  {target:<9} {medians[target][0]:>9,.0f} tps [{min(tps):,.0f}-"
                    f"{max(tps):,.0f}]   CPU {medians[target][1]:.3f} s/10k tx "
                    f"[{min(cpu):.3f}-{max(cpu):.3f}]"
                )
            for other in ("before", "pgbouncer"):
                if "after" in medians and other in medians:
                    tps_ratio = medians["after"][0] / medians[other][0]
                    cpu_ratio = medians["after"][1] / medians[other][1]
                    print(f"  after/{other}: TPS {tps_ratio:.3f}, CPU per tx {cpu_ratio:.3f}")
        return 0 if all(r.ok for r in results) else 1
    finally:
        for pooler in poolers.values():
            pooler.stop()
        db.cleanup()
        remove_workdir(workdir, False)


if __name__ == "__main__":
    sys.exit(main())
