"""BENCHMARKS.md's tables from the output of one ``operator_create_latency.py`` run.

Reads the JSON lines the run printed and writes, per loop mode, one Markdown table with a row per
configuration (managed and unmanaged CREATE, bindings, CPU per managed pod of each process, pods
with a missing or wrong value), then the summary ratios: fiar over the floor and over Kyverno,
unmanaged pods over no webhook, CPU per pod and peak RSS over Kyverno.

    .venv/bin/python bench/create_latency_tables.py bench/results/kyverno/2026-12-03-run.txt
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

NAMES = {
    "without": "no webhook",
    "patch": "floor",
    "fiar:after": "fiar",
    "kyverno": "Kyverno",
    "frozen:after": "fiar, frozen",
    "kyverno-frozen": "Kyverno, frozen",
}
MODES = {"closed": "Closed loop, 20 creators", "pinned": "Closed loop, pinned", "open": "Open loop, 100 pods/s"}


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    args = parser.parse_args()
    rows = read(args.output)
    create = {(r["configuration"], r["mode"], r["pods"]): r for r in rows if "pods" in r and "configuration" in r}
    binds = {r["bind"]: r for r in rows if "bind" in r}
    cpu: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if "cpu_ms_per_managed_pod" in r:
            process = next(k for k in r if k != "cpu_ms_per_managed_pod")
            cpu[(r["cpu_ms_per_managed_pod"], process)] = r[process]
    rss = {r["rss_peak_mib"]: r["values"] for r in rows if "rss_peak_mib" in r}
    events: dict[str, int] = {}
    for r in rows:
        if "events_in_managed_namespace" in r:
            events[r["events_in_managed_namespace"]] = events.get(r["events_in_managed_namespace"], 0) + r["count"]
    configurations = [c for c in NAMES if any(key[0] == c for key in create)]
    for mode, title in MODES.items():
        if not any(key[1] == mode for key in create):
            continue
        print(f"{title}:\n")
        print(
            "| configuration | managed p50 / p99 (ms) | p99 / floor | unmanaged p50 / p99 (ms) | p99 / no webhook "
            "| pods/s managed / unmanaged | bind p50 / p99 (ms) | binds/s "
            "| CPU ms per managed pod: webhook; API server; etcd | events posted | missing | wrong |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        floor = create.get(("patch", mode, "managed"))
        for c in configurations:
            managed, plain = create[(c, mode, "managed")], create[(c, mode, "unmanaged")]
            bind = binds.get(f"{c}@{mode}", {})
            ratio = "" if "frozen" in c or not floor else f"{managed['p99_ms'] / floor['p99_ms']:.2f}"
            cell = f"{c}@{mode}"
            spent = "; ".join(
                ", ".join(f"{v:.2f}" for v in cpu.get((cell, p), [])) for p in ("webhook", "kube-apiserver", "etcd")
            )
            print(
                f"| {NAMES[c]} | {managed['p50_ms']} / {managed['p99_ms']} | {ratio} "
                f"| {plain['p50_ms']} / {plain['p99_ms']} | {plain['p99_ratio']} "
                f"| {managed['pods_per_s']:.0f} / {plain['pods_per_s']:.0f} "
                f"| {bind.get('p50_ms', '')} / {bind.get('p99_ms', '')} | {bind.get('binds_per_s', 0):.0f} "
                f"| {spent if 'frozen' not in c else ''} | {events.get(cell, 0)} "
                f"| {managed['wrong_env']} | {bind.get('wrong_backend', '')} |"
            )
        print()
    print("Summary (closed / pinned / open):\n")

    def per_mode(fn: Any) -> str:
        return " / ".join(fn(m) for m in MODES if ("fiar:after", m, "managed") in create)

    def p99(c: str, m: str) -> float:
        return float(create[(c, m, "managed")]["p99_ms"])

    print("- fiar managed p99 over the floor:", per_mode(lambda m: f"{p99('fiar:after', m) / p99('patch', m):.2f}"))
    print("- Kyverno managed p99 over the floor:", per_mode(lambda m: f"{p99('kyverno', m) / p99('patch', m):.2f}"))
    print("- fiar managed p99 over Kyverno's:", per_mode(lambda m: f"{p99('fiar:after', m) / p99('kyverno', m):.2f}"))
    print(
        "- unmanaged p99 over no webhook, fiar / Kyverno:",
        per_mode(
            lambda m: (
                f"{create[('fiar:after', m, 'unmanaged')]['p99_ratio']}"
                f" | {create[('kyverno', m, 'unmanaged')]['p99_ratio']}"
            )
        ),
    )
    print(
        "- webhook CPU per managed pod, fiar over Kyverno:",
        per_mode(
            lambda m: (
                f"{mean(cpu[(f'fiar:after@{m}', 'webhook')]):.2f} / {mean(cpu[(f'kyverno@{m}', 'webhook')]):.2f}"
                f" = {mean(cpu[(f'fiar:after@{m}', 'webhook')]) / mean(cpu[(f'kyverno@{m}', 'webhook')]):.2f}"
            )
        ),
    )
    if "fiar:after" in rss and "kyverno" in rss:
        print(
            f"- peak RSS: fiar {rss['fiar:after']} MiB, Kyverno {rss['kyverno']} MiB: "
            f"{mean(rss['fiar:after']) / mean(rss['kyverno']):.2f}x"
        )


if __name__ == "__main__":
    main()
