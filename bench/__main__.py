"""`python -m bench [name ...] [--quick]`: run the benchmarks (all by default),
write bench/results/<name>.json for each and print the table.

Names: claims, convergence, event_to_ready, pass_cost, steady_load (which also
writes memory), executions, files, prewarm, timeouts, templates, production,
replicas, claim_wait, ratios, clients, maintenance.
`python -m bench prewarm --trace FILE.csv` replays a claim trace of your own
instead of the shipped ones (bench/b8_prewarm.py). `--profile` adds, for claims
and executions, where the controller's CPU goes by function (bench/profile.py).
`python -m bench claims --pool N` runs the claims with a warm pool of N runners
instead of 2,000 (bench/results/claims_pool<N>.json).
A benchmark that breaks is reported and the others still run; the exit status
is 0 unless one could not run at all (targets missed are reported, never a
failure).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import (
    b1_claims,
    b2_convergence,
    b3_event_to_ready,
    b4_pass_cost,
    b5_steady,
    b6_executions,
    b7_files,
    b8_prewarm,
    b9_timeouts,
    b10_templates,
    b11_production,
    b12_replicas,
    b13_claim_wait,
    b14_ratios,
    b15_clients,
    b16_maintenance,
)
from bench.common import Result, machine, render_table, write_result

BENCHMARKS: dict[str, Callable[[bool], list[Result]]] = {
    "claims": lambda quick: [b1_claims.run(quick)],
    "convergence": lambda quick: [b2_convergence.run(quick)],
    "event_to_ready": lambda quick: [b3_event_to_ready.run(quick)],
    "pass_cost": lambda quick: [b4_pass_cost.run(quick)],
    "steady_load": b5_steady.run,  # steady_load and memory
    "executions": lambda quick: [b6_executions.run(quick)],
    "files": lambda quick: [b7_files.run(quick)],
    "prewarm": lambda quick: [b8_prewarm.run(quick)],
    "timeouts": lambda quick: [b9_timeouts.run(quick)],
    "templates": lambda quick: [b10_templates.run(quick)],
    "production": lambda quick: [b11_production.run(quick)],
    "replicas": lambda quick: [b12_replicas.run(quick)],
    "claim_wait": lambda quick: [b13_claim_wait.run(quick)],
    "ratios": lambda quick: [b14_ratios.run(quick)],
    "clients": lambda quick: [b15_clients.run(quick)],
    "maintenance": lambda quick: [b16_maintenance.run(quick)],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", choices=[*BENCHMARKS, []], metavar="name")
    parser.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    parser.add_argument(
        "--trace",
        action="append",
        default=[],
        metavar="FILE.csv",
        help="prewarm: replay this claim trace (t_seconds,environment_id,hold_seconds); repeatable",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="claims, executions: also sample where the controller's CPU goes per claim or "
        "execution, by function (bench/results/<name>_profile.json and .txt)",
    )
    parser.add_argument(
        "--pool",
        type=int,
        metavar="N",
        help="claims: a warm pool of N runners instead of 2,000 "
        "(bench/results/claims_pool<N>.json)",
    )
    parser.add_argument(
        "--controller-tree",
        type=Path,
        metavar="PATH",
        help="ratios: run the controller from this checkout of the repository (its own "
        "bench/ctlproc.py, this interpreter); the simulator and the clients stay this tree's",
    )
    parser.add_argument(
        "--label",
        default="",
        help="ratios: write bench/results/ratios_<label>.json instead of ratios.json",
    )
    parser.add_argument(
        "--no-refill",
        action="store_true",
        help="ratios: the pool's creations off during the controller's claim phases "
        "(a diagnostic: what a claim costs without the refill it causes)",
    )
    parser.add_argument(
        "--follower",
        action="store_true",
        help="ratios: two replicas with leader election; the claims and executions go to the "
        "follower while the leader keeps the pool up (bench/results/ratios_follower.json)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NRC_NAME=VALUE",
        help="ratios: run the controller with this setting (repeatable)",
    )
    args = parser.parse_args(argv)
    names = args.names or list(BENCHMARKS)
    benchmarks = dict(BENCHMARKS)
    if args.profile:
        benchmarks["claims"] = lambda quick: [b1_claims.run(quick, profile=True)]
        benchmarks["executions"] = lambda quick: [b6_executions.run(quick, profile=True)]
    if args.pool is not None:
        if args.names != ["claims"]:
            parser.error("--pool is an option of the claims benchmark only: name it alone")
        if args.pool < 50:
            parser.error("--pool takes at least 50 runners (the closed loops claim 50 at least)")
        benchmarks["claims"] = lambda quick: [
            b1_claims.run(quick, profile=args.profile, pool=args.pool)
        ]
    if args.follower and args.no_refill:
        parser.error(
            "--no-refill switches the refill of the replica the clients talk to: not "
            "with --follower, where the leader refills"
        )
    settings = dict(s.split("=", 1) for s in args.setting if "=" in s)
    if len(settings) != len(args.setting) or any(not name.startswith("NRC_") for name in settings):
        parser.error("--setting takes NRC_NAME=VALUE")
    if (
        args.controller_tree is not None
        or args.label
        or args.no_refill
        or args.follower
        or settings
    ):
        if args.names and args.names != ["ratios"]:
            parser.error(
                "--controller-tree, --label, --no-refill, --follower and --setting are options "
                "of the ratios benchmark only"
            )
        names = ["ratios"]
        tree = args.controller_tree.resolve() if args.controller_tree is not None else None
        if tree is not None and not (tree / "bench" / "ctlproc.py").is_file():
            parser.error(f"--controller-tree: no bench/ctlproc.py under {tree}")
        benchmarks["ratios"] = lambda quick: [
            b14_ratios.run(
                quick,
                tree=tree,
                label=args.label,
                no_refill=args.no_refill,
                settings=settings,
                follower=args.follower,
            )
        ]
    if args.trace:
        if args.names and args.names != ["prewarm"]:
            parser.error("--trace is an option of the prewarm benchmark only")
        names = ["prewarm"]
        benchmarks["prewarm"] = lambda quick: [b8_prewarm.run(quick, traces=args.trace)]
    facts = machine()
    print(
        f"machine: {facts['cpu_count']} CPUs ({facts['cpu_model'] or 'unknown model'}), "
        f"Python {facts['python']}, {facts['memory_total_mb']} MB",
        flush=True,
    )
    results: list[Result] = []
    broken: list[str] = []
    began = time.perf_counter()
    for name in names:
        print(f"-- {name} ...", flush=True)
        started = time.perf_counter()
        try:
            produced = benchmarks[name](args.quick)
        except Exception:
            traceback.print_exc()
            broken.append(name)
            continue
        for result in produced:
            result.duration_s = time.perf_counter() - started
            path = write_result(result, facts)
            results.append(result)
            print(f"   {result.benchmark}: {result.duration_s:.0f} s, wrote {path}", flush=True)
    print()
    print(render_table(results))
    print(f"\n{len(results)} result files in {time.perf_counter() - began:.0f} s", flush=True)
    if broken:
        print(f"could not run: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
