"""One benchmark script, run on two trees in turn (A B A B ...), its per-case figures side by side.

A refactor is shown no slower by the tree's own benchmark run on the code before and after it, in
one run, alternated so that a machine's drift falls on both. Each tree runs its own copy of the
script (module paths may differ between them), with its own ``operator``, root and ``tools`` on
PYTHONPATH, pinned to one processor with ``taskset`` where given.

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/before_after.py --before /tmp/before --after . --runs 5 --pin 1 \\
        -- bench/operator_admission_latency.py --nodes 10000 --pods 20000

The script must print one line per case: a name, then numbers (the first columns after the name are
read as the figures its header names, e.g. ``p50 µs  p99 µs  mean µs``).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROW = re.compile(r"^(?P<name>.+?)\s+(?P<numbers>-?\d+(?:\.\d+)?(?:\s+-?\d+(?:\.\d+)?)+)\s*$")


def run(tree: Path, script: list[str], pin: str | None) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(tree / p) for p in ("operator", ".", "tools")))
    argv = [sys.executable, str(tree / script[0]), *script[1:]]
    if pin is not None:
        argv = ["taskset", "-c", pin, *argv]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, cwd=tree).stdout
    rows: dict[str, list[float]] = {}
    for line in out.splitlines():
        match = ROW.match(line)
        if match and not line.startswith(("indexes:", "HTTPS")):
            rows[match["name"].strip()] = [float(x) for x in match["numbers"].split()]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pin", help="a processor list for taskset, e.g. 1")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS]")
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    runs: dict[str, list[dict[str, list[float]]]] = {"before": [], "after": []}
    for i in range(args.runs):
        for label, tree in (("before", args.before), ("after", args.after)):
            runs[label].append(run(tree.resolve(), script, args.pin))
            print(f"run {i + 1}/{args.runs} {label}: done", file=sys.stderr)
    cases = [c for c in runs["after"][0] if all(c in r for r in runs["before"] + runs["after"])]
    print(f"{' '.join(script)}; {args.runs} runs each, alternated; medians; after/before per run pair")
    head = "".join(f" {'before ' + f:>10} {'after ' + f:>10} {'ratio':>6}" for f in ("p50", "p99"))
    print(f"{'case':66}{head}")
    spread: dict[str, list[str]] = {case: [] for case in cases}
    for case in cases:
        line = f"{case:66}"
        for column in (0, 1):
            before = [r[case][column] for r in runs["before"]]
            after = [r[case][column] for r in runs["after"]]
            ratios = sorted(a / b for a, b in zip(after, before, strict=True))
            spread[case].append(f"{ratios[0]:.2f}-{ratios[-1]:.2f}")
            middle = statistics.median(before), statistics.median(after), statistics.median(ratios)
            line += f" {middle[0]:10.1f} {middle[1]:10.1f} {middle[2]:6.2f}"
        print(line)
    print("\nper-pair ratios, min-max (p50, p99):")
    for case in cases:
        print(f"{case:66} {'  '.join(spread[case])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
