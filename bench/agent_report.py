"""Print the node-agent section of BENCHMARKS.md from the raw outputs in bench/results/.

    python bench/agent_report.py > /tmp/section.md

Inputs (written by bench/agent_gpu_verify.sh on the device hosts): ``<host>/probe-cold.json``,
``<host>/probe-warm.json``, ``<host>/rss.txt``. Every number printed comes from those files.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def load(host: str, name: str) -> dict[str, Any] | None:
    path = RESULTS / host / name
    if not path.exists() or not path.stat().st_size:
        return None
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def labels(doc: dict[str, Any]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in doc["labels"].items())


def rss(host: str) -> str:
    text = (RESULTS / host / "rss.txt").read_text()
    after = text.split("after its first probe", 1)[-1]
    vm = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", after, re.M))
    mapped = re.search(r"libraries mapped in the resident process: (\d+)", after)
    code = re.search(r"exit code after SIGTERM: (\d+)", text)
    return (
        f"VmRSS {int(vm['VmRSS']) / 1024:.1f} MiB, peak (VmHWM) {int(vm['VmHWM']) / 1024:.1f} MiB; "
        f"torch/FlashInfer/NCCL libraries mapped: {mapped.group(1) if mapped else '?'}; "
        f"exit code after SIGTERM: {code.group(1) if code else '?'}"
    )


def main() -> None:
    out: list[str] = []
    w = out.append
    cold, warm = load("h200x2", "probe-cold.json"), load("h200x2", "probe-warm.json")
    one = load("h200x1", "probe-cold.json")
    run1_cold, run1_warm = load("h200x2-run1", "probe-cold.json"), load("h200x2-run1", "probe-warm.json")
    assert cold and warm and one
    w("### Verdicts on real hosts\n")
    w("| host | status | labels |")
    w("|---|---|---|")
    w(f"| 2x H200 SXM (NV18, NVSwitch), policy forbids multicast | {warm['status']} | {labels(warm)} |")
    w(f"| 1x H200 SXM | {one['status']} | {labels(one)} |")
    w("")
    inv = warm["inventory"]
    w(
        f"2-GPU host, hardware as read by the agent: multicast attribute {inv['multicast_attribute']}, "
        f"NVLinks to NVSwitch {inv['nvlink_to_nvswitch']}, NVLink P2P {inv['p2p_nvlink']}, fabric state "
        f"{inv['fabric']['state']} with an all-zero cluster UUID: multicast is *supported by the hardware* and "
        f"*disabled by host policy* ({', '.join(warm['policy']['sources'])}); mnnvl was never started "
        f"(`{warm['tests']['mnnvl']['kind']}`). 1-GPU host: multicast attribute "
        f"{one['inventory']['multicast_attribute']}, no NVLink; {one['reasons'][-1]}.\n"
    )
    w("### trtllm smoke test, cold and warm (2x H200, one rank per GPU)\n")
    w("| step | cold: empty JIT cache (s) | warm: `--require-prebuilt` (s) |")
    w("|---|---|---|")
    ct, wt = cold["tests"]["trtllm"], warm["tests"]["trtllm"]
    for step in ("import", "init", "jit", "workspace", "eager", "graph", "timing", "benchmark"):
        c, v = ct["steps"].get(step), wt["steps"].get(step)
        w(f"| {step} | {'' if c is None else f'{c:.3f}'} | {'' if v is None else f'{v:.3f}'} |")
    w(f"| **whole probe** | **{cold['duration_s']:.1f}** | **{warm['duration_s']:.1f}** |")
    w("")
    w(
        f"JIT: `{ct['jit']['source']}` cold, `{wt['jit']['source']}` warm; the build of FlashInfer's "
        f"`trtllm_comm` module is timed apart from the test. Numerics: {ct['numerics']['eager_checks']} eager "
        f"calls and {ct['numerics']['graph_checks']} CUDA-graph replays per run, each against the fp32 reference "
        f"sum, max abs error {wt['numerics']['max_abs_err']}. Smoke-size latency ({ct['numerics']['shape'][0]} "
        f"tokens x {ct['numerics']['shape'][1]}, bf16): eager {wt['latency_us']['eager_us']} us, one graph "
        f"replay {wt['latency_us']['graph_us']} us."
    )
    if run1_cold and run1_warm:
        w(
            f"An earlier run on another 2x H200 machine: JIT {run1_cold['tests']['trtllm']['steps']['jit']:.1f} s "
            f"cold, whole probe {run1_cold['duration_s']:.1f} s cold / {run1_warm['duration_s']:.1f} s warm."
        )
    w("")
    w("### trtllm vs NCCL allreduce (2x H200, bf16, one run, mean of 50 calls, max over ranks)\n")
    w("| hidden | tokens | NCCL eager (us) | trtllm eager (us) | trtllm / NCCL | trtllm graph replay (us/op) |")
    w("|---|---|---|---|---|---|")
    for p in wt["bench"]:
        ratio = p["backend_us"] / p["nccl_us"]
        w(
            f"| {p['hidden']} | {p['tokens']} | {p['nccl_us']:.1f} | {p['backend_us']:.1f} | {ratio:.2f} | "
            f"{p.get('backend_graph_us', float('nan')):.1f} |"
        )
    j = warm["benchmark"]["trtllm"]
    w("")
    w(
        f"Verdict rule: geometric mean of trtllm/NCCL (eager vs eager) = {j['geomean_ratio_vs_nccl']}, "
        f"faster at {j['faster_than_nccl_at']} of {j['points']} sizes; margin {j['margin']} -> recommended: "
        f"{j['recommended']}."
    )
    if run1_warm:
        r1 = run1_warm["benchmark"]["trtllm"]
        w(f"The earlier run: geometric mean {r1['geomean_ratio_vs_nccl']}, faster at {r1['faster_than_nccl_at']}.")
    w("")
    w("### Resident daemon (`fiar-agent run`, after its first probe)\n")
    w(f"- 2x H200: {rss('h200x2')}")
    w(f"- 1x H200: {rss('h200x1')}")
    w("")
    out.extend(flashinfer_versions("agent/2026-12-02-h200x1"))
    sys.stdout.write("\n".join(out) + "\n")


def flashinfer_versions(folder: str) -> list[str]:
    """One row per ``<folder>/flashinfer-<version>/`` run of bench/agent_gpu_verify.sh on one host."""
    rows = [
        "| FlashInfer | `import flashinfer.comm` (s) | `prebuild`: `trtllm_comm`, cold (s) | cold probe (s) "
        "| warm probe (s) | status, labels | resident VmRSS, VmHWM (MiB) | libraries mapped | exit after SIGTERM |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted((RESULTS / folder).glob("flashinfer-*")):
        host = f"{folder}/{run.name}"
        env, log = (run / "env.txt").read_text(), (run / "run.log").read_text()
        version = re.search(r"^flashinfer (\S+)$", env, re.M)
        imported = re.search(r"^import flashinfer.comm: ([\d.]+)s$", env, re.M)
        built = load(host, "prebuild.json")
        if built:
            module = built["modules"]["trtllm"]
            prebuild = f"{module['seconds']:.1f} ({module['source']})"
        else:
            limit = re.search(r"3\. prebuild .*timeout (\d+)s\)", log)
            code = re.search(r"prebuild rc=(\d+)", log)
            prebuild = (
                f"not done within the script's {limit.group(1) if limit else '?'} s "
                f"(rc {code.group(1) if code else '?'})"
            )
        cold, warm = load(host, "probe-cold.json"), load(host, "probe-warm.json")
        assert cold and warm and version
        text = (run / "rss.txt").read_text().split("after its first probe", 1)[-1]
        vm = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M))
        mapped = re.search(r"libraries mapped in the resident process: (\d+)", text)
        code = re.search(r"exit code after SIGTERM: (\d+)", text)
        rows.append(
            f"| {version.group(1)} | {imported.group(1) if imported else '?'} | {prebuild} | "
            f"{cold['duration_s']:.2f} | {warm['duration_s']:.2f} | {warm['status']}, {labels(warm)} | "
            f"{int(vm['VmRSS']) / 1024:.1f}, {int(vm['VmHWM']) / 1024:.1f} | "
            f"{mapped.group(1) if mapped else '?'} | {code.group(1) if code else '?'} |"
        )
    return rows


if __name__ == "__main__":
    main()
