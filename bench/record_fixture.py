"""Turn a real host's ``fiar-agent inventory`` output (and a probe report of it) into a fixture.

    python bench/record_fixture.py bench/results/h200x2 h200x2-device "2x NVIDIA H200 SXM (device host)"

The inventory is kept as the agent printed it, GPU UUIDs replaced by placeholders. When the probe
report holds smoke-test results, they become the fixture's ``simulate`` block (outcome, JIT time,
latencies, benchmark points), so that ``--simulate`` plays back what was measured on that host.
Writes ``node_agent/fixtures/<name>.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTCOME = {"pass": "pass", "timeout": "timeout"}


def smoke_block(report: dict[str, Any]) -> dict[str, Any]:
    block: dict[str, Any] = {}
    for backend, test in report.get("tests", {}).items():
        if test["result"] == "skipped":
            continue
        entry: dict[str, Any] = {"outcome": OUTCOME.get(test["result"], test.get("kind", "fail"))}
        steps = test.get("steps", {})
        for step in ("import", "init", "jit", "workspace", "eager", "graph"):
            if step in steps:
                entry[f"{step}_s"] = steps[step]
        if test.get("latency_us"):
            entry["latency_us"] = test["latency_us"]
        if test.get("bench"):
            entry["bench"] = test["bench"]
        block[backend] = entry
    return block


def main(results: str, name: str, host: str) -> None:
    folder = Path(results)
    doc = json.loads((folder / "inventory.json").read_text())
    for i, gpu in enumerate(doc["gpus"]):
        gpu["uuid"] = f"GPU-00000000-0000-0000-0000-{i:012d}"
    doc["host"] = host
    probe_path = folder / "probe-warm.json"
    sources = [f"{folder.relative_to(ROOT) if folder.is_absolute() else folder}/inventory.json"]
    simulate: dict[str, Any] = {}
    if probe_path.exists() and probe_path.stat().st_size:
        report = json.loads(probe_path.read_text())
        versions = report.get("versions", {})
        simulate["software"] = {"torch": versions.get("torch"), "flashinfer": versions.get("flashinfer")}
        smoke = smoke_block(report)
        if smoke:
            simulate["smoke"] = smoke
        sources.append(str(probe_path))
    doc["notes"] = (
        f"Recorded by `fiar-agent inventory` on a device host ({doc.get('recorded_at')}), through "
        "bench/agent_gpu_verify.sh; GPU UUIDs replaced with placeholders. The simulate block replays the "
        f"smoke-test results measured on the same host by `fiar-agent probe` ({', '.join(sources)})."
    )
    if simulate:
        doc["simulate"] = simulate
    out = ROOT / "node_agent" / "fixtures" / f"{name}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
