"""Hostile inputs against the node agent, counted: what was tried, how many, what held.

Sections (all by default; ``--only NAME`` picks some):

    fixtures   every field of every shipped fixture replaced by hostile values, plus deep nesting:
               each is a clear FixtureError (exit 2) or a probe that finishes; never a traceback
    outcomes   random rank events, exit codes and errors through ``classify``: a rank that ended
               before the backend's steps, or on an infrastructure error, is never a conclusive fail
    metrics    idle and slow-drip connection floods on the /metrics port, bounded server beside the
               standard library's unbounded one: handler threads, RSS, /healthz latency
    reprobe    hostile ``fiar.io/reprobe`` values on a real kube-apiserver, cleared with the
               resourceVersion precondition beside the former JSON-patch ``test``; and their log lines
    policy     the chart's own-node admission policy with an agent token bound to its pod (real
               control plane, chart installed with helm): metadata, spec and other-node attempts

    PYTHONPATH=tools .venv/bin/python bench/agent_hostile_inputs.py [--only fixtures metrics ...]

Raw output of the last run: ``bench/results/agent/hostile_inputs.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import platform
import random
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from node_agent import childproc, hardware
from node_agent.daemon import shown
from node_agent.errors import FixtureError
from node_agent.probe import ProbeConfig, probe
from node_agent.smoke.outcome import SmokeRequest
from node_agent.smoke.rules import BACKEND_STEPS, INFRASTRUCTURE_MARKERS, classify

HOSTILE: list[Any] = [-1, 5, 0, "x", "", None, True, [], {}, 1e308, -0.5, 2**70, "9" * 5000, [[[[["deep"]]]]]]
ROOT = Path(__file__).resolve().parents[1]


def _paths(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*path, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def fixtures(sample_probes: int) -> None:
    print("## fixtures: corrupted --simulate files")
    rng = random.Random(14)
    tried, rejected, accepted = 0, 0, []
    crashes: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "host.json"
        for fixture in sorted(hardware.FIXTURES.glob("*.json")):
            original = json.loads(fixture.read_text())
            for where in list(_paths(original)):
                for value in HOSTILE:
                    doc = _set(copy.deepcopy(original), where, copy.deepcopy(value))
                    path.write_text(json.dumps(doc))
                    tried += 1
                    try:
                        hardware.load_fixture(path)
                    except FixtureError:
                        rejected += 1
                        continue
                    except Exception as exc:  # a traceback: counted, must stay 0
                        crashes[f"{type(exc).__name__} at {where}"] += 1
                        continue
                    accepted.append(doc)
        for depth in (100, 990, 5000, 100_000):
            path.write_text('{"gpus": [], "x": ' + "[" * depth + "]" * depth + "}")
            tried += 1
            try:
                hardware.load_fixture(path)
                accepted.append(json.loads(path.read_text()))
            except FixtureError:
                rejected += 1
            except Exception as exc:
                crashes[f"{type(exc).__name__} at depth {depth}"] += 1
        print(
            f"  tried {tried} fixtures ({len(HOSTILE)} hostile values at every field of "
            f"{len(list(hardware.FIXTURES.glob('*.json')))} shipped fixtures, and 4 nesting depths up to 100,000)"
        )
        print(f"  rejected with FixtureError (exit 2, one line naming the field): {rejected}")
        print(f"  accepted as a valid host: {len(accepted)}; tracebacks: {sum(crashes.values())}")
        for what, n in crashes.most_common(10):
            print(f"    {n:5d}  {what}")
        picked = rng.sample(accepted, min(sample_probes, len(accepted)))
        results: Counter[str] = Counter()
        start = time.monotonic()
        for doc in picked:
            path.write_text(json.dumps(doc))
            try:
                hw = hardware.SimulatedHardware(path)
                result = probe(hw, ProbeConfig(timeout_s=20.0, peer_grace_s=1.0, benchmark=False), environ={})
                results[result.verdict.status] += 1
            except FixtureError:
                results["FixtureError"] += 1
            except Exception as exc:
                results[f"crash {type(exc).__name__}"] += 1
        print(
            f"  full probes of {len(picked)} accepted ones (random sample): {dict(results)} "
            f"in {time.monotonic() - start:.0f}s"
        )


def outcomes(runs: int) -> None:
    print("## outcomes: random smoke-test endings through classify")
    rng = random.Random(8)
    steps = ["import", "init", "jit", *BACKEND_STEPS]
    errors = ["RuntimeError: something", *[f"OSError: {m}" for m in INFRASTRUCTURE_MARKERS], "CUDA error: misaligned"]
    tally: Counter[str] = Counter()
    wrong = 0
    for _ in range(runs):
        ranks = rng.choice([2, 4, 8])
        events: list[list[dict[str, Any]]] = []
        codes: list[int] = []
        reached_backend = False
        infra = False
        for _r in range(ranks):
            last = rng.randrange(-1, len(steps))
            ev = [{"step": s, "status": "ok"} for s in steps[: max(last, 0)]]
            if last >= 0:
                status = rng.choice(["start", "fail", "none"])
                if status == "fail":
                    error = rng.choice(errors)
                    infra = infra or any(m in error.lower() for m in INFRASTRUCTURE_MARKERS)
                    ev.append({"step": steps[last], "status": "fail", "kind": "error", "error": error})
                elif status == "start":
                    ev.append({"step": steps[last], "status": "start"})
            reached_backend = reached_backend or any(e["step"] in BACKEND_STEPS for e in ev)
            events.append(ev)
            codes.append(rng.choice([1, 1, -11, -9, -6, 0]))
        killed = [r for r, c in enumerate(codes) if c == -9 and rng.random() < 0.5]
        child = childproc.ChildResult(("sup",), 1, False, False, "", rng.choice(["", "BlockingIOError: x"]), 1.0)
        outcome = classify(SmokeRequest("trtllm", tuple(range(ranks)), 30.0), events,
                           {"returncodes": codes, "killed": killed}, child, {})  # fmt: skip
        tally[f"{outcome.result}/{outcome.kind}"] += 1
        if outcome.result == "fail" and (not reached_backend or infra):
            wrong += 1
    print(f"  tried {runs} random endings (2-8 ranks, any step, {len(errors)} errors, exit codes and signals)")
    print(f"  results: {dict(sorted(tally.items()))}")
    print(f"  conclusive 'fail' with no rank past jit, or with an infrastructure error: {wrong}")


SERVER = """
import sys, threading, time
from http.server import ThreadingHTTPServer
from node_agent import metrics as m
server = m.serve("127.0.0.1:0", m.AgentMetrics(), m.Health(60.0))
if sys.argv[1] == "unbounded":  # the standard library's server with the same handler, as before
    handler = server.RequestHandlerClass
    server.shutdown()
    server.server_close()
    handler.timeout = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.server_address[1], flush=True)
time.sleep(3600)
"""


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _flood(pid: int, port: int, idle: int, drips: int, seconds: float) -> tuple[int, list[float], int, int]:
    """Peak threads of the server process, /healthz latencies, failed /healthz, and its threads 20 s
    after the flood while the flood's clients still hold their connections open."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle)]
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(drips)]
    peak, latencies, failed = 0, [], 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s in slow:
            with contextlib.suppress(OSError):
                s.send(b"G")
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
                resp.read()
            latencies.append((time.perf_counter() - t0) * 1000)
        except OSError:
            failed += 1
        peak = max(peak, _status(pid, "Threads"))
        time.sleep(0.5)
    time.sleep(20)
    after = _status(pid, "Threads")
    for s in socks + slow:
        s.close()
    return peak, latencies, failed, after


def metrics(idle: int, drips: int, seconds: float) -> None:
    import subprocess

    print("## metrics: connection floods on the /metrics port (each server in a process of its own)")
    print(f"  {idle} idle connections + {drips} slow drips (one byte every 0.5 s), {seconds:.0f}s, "
          "then /healthz every 0.5 s")  # fmt: skip
    print("  server                         threads: idle  peak  20 s on   RSS growth  /healthz ok  p50 ms  max ms")
    for name in ("bounded (the agent's)", "unbounded (stdlib, as before)"):
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, name.split()[0]],
            stdout=subprocess.PIPE,
            text=True,
            env=childproc.child_env(),
        )
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            time.sleep(0.5)
            idle_threads, base = _status(proc.pid, "Threads"), _status(proc.pid, "VmRSS")
            peak, lat, failed, after = _flood(proc.pid, port, idle, drips, seconds)
            grown = (_status(proc.pid, "VmRSS") - base) / 1024
        finally:
            proc.kill()
            proc.wait()
        p50 = statistics.median(lat) if lat else float("nan")
        worst = max(lat, default=float("nan"))
        print(f"  {name:30s} {idle_threads:13d} {peak:5d} {after:8d}   {grown:6.1f} MiB   "
              f"{len(lat):4d}/{len(lat) + failed:<4d}  {p50:6.1f}  {worst:6.1f}")  # fmt: skip


REPROBE_VALUES = [
    "now", "", " ", "prüfen", "a&b", "<now>", "'\"", "\\", "x\ny", "\r\n", "\t", "\u2028", "\u202e", "😀",
    "日本語", "%00", "\u0000", "&amp;", "<script>", "{\"op\":\"remove\"}", "~1/~0", "/metadata/labels", "null",
    "true", "0", "-1", "9" * 300, "é" * 1000, "x" * 65_536, "\x1b[31m",
]  # fmt: skip


def _old_clear(publisher: Any, value: str) -> bool:
    """How the agent cleared a request before: a JSON patch whose ``test`` compares encoded bytes."""
    import fiar_kube

    pointer = "/metadata/annotations/fiar.io~1reprobe"
    ops = [{"op": "test", "path": pointer, "value": value}, {"op": "remove", "path": pointer}]
    try:
        publisher._request("PATCH", ops, "application/json-patch+json")
    except fiar_kube.Invalid:
        return False
    return True


def _start_plane(tier_name: str, tmp: Path) -> Any:
    from devcluster.cluster import ControlPlane, Tier

    plane = ControlPlane(tmp / f"plane-{tier_name.lower()}", Tier[tier_name])
    plane.start()
    return plane


def reprobe() -> None:
    from kubernetes import client

    import fiar_contract as contract
    from node_agent.publish import NodePublisher, load_client_config

    print("## reprobe: hostile fiar.io/reprobe values on a real kube-apiserver")
    with tempfile.TemporaryDirectory() as tmp:
        plane = _start_plane("A", Path(tmp))
        try:
            plane.add_node("gpu-0")
            publisher = NodePublisher(load_client_config(str(plane.kubeconfig)), "gpu-0")
            cleared = {"json-patch test (before)": 0, "resourceVersion precondition (now)": 0}
            with plane.api_client() as api:
                core = client.CoreV1Api(api)
                for value in REPROBE_VALUES:
                    for method in cleared:
                        core.patch_node("gpu-0", {"metadata": {"annotations": {contract.ANNOTATION_REPROBE: value}}})
                        ok = (
                            _old_clear(publisher, value)
                            if method.startswith("json")
                            else publisher.clear_reprobe(value)
                        )
                        gone = contract.ANNOTATION_REPROBE not in (core.read_node("gpu-0").metadata.annotations or {})
                        cleared[method] += int(ok and gone)
                        core.patch_node("gpu-0", {"metadata": {"annotations": {contract.ANNOTATION_REPROBE: None}}})
        finally:
            plane.stop()
    n = len(REPROBE_VALUES)
    print(f"  tried {n} values (unicode, HTML and JSON specials, control characters, empty, up to 64 KiB)")
    for method, count in cleared.items():
        print(f"  cleared by {method}: {count} of {n}")
    verbatim = sum(1 for v in REPROBE_VALUES if any(c in v for c in "\n\r\x1b\u2028") or len(v) > 200)
    bad = sum(1 for v in REPROBE_VALUES if any(c in shown(v) for c in "\n\r\x1b\u2028") or len(shown(v)) > 200)
    print(f"  log lines forged or over 200 characters: verbatim (before) {verbatim} of {n}, bounded repr (now) {bad}")


POLICY_ATTEMPTS: list[tuple[str, str, Any, bool]] = [
    # (what, target node: own|other, patch body or a special action, expected allowed)
    ("fiar.io/ label added", "own", {"metadata": {"labels": {"fiar.io/backend": "trtllm"}}}, True),
    ("fiar.io/ label changed", "own", {"metadata": {"labels": {"fiar.io/backend": "none"}}}, True),
    ("fiar.io/ label removed", "own", {"metadata": {"labels": {"fiar.io/backend": None}}}, True),
    ("fiar.io/ annotation added", "own", {"metadata": {"annotations": {"fiar.io/probe-report": "{}"}}}, True),
    ("fiar.io/ annotation removed", "own", {"metadata": {"annotations": {"fiar.io/probe-report": None}}}, True),
    ("reprobe cleared with a resourceVersion precondition", "own", "clear", True),
    ("other label added", "own", {"metadata": {"labels": {"example.com/x": "y"}}}, False),
    ("other label changed", "own", {"metadata": {"labels": {"nvidia.com/gpu.present": "false"}}}, False),
    ("other label removed", "own", {"metadata": {"labels": {"nvidia.com/gpu.present": None}}}, False),
    ("other annotation added", "own", {"metadata": {"annotations": {"example.com/x": "y"}}}, False),
    ("other annotation removed", "own", {"metadata": {"annotations": {"kwok.x-k8s.io/node": None}}}, False),
    ("ownerReference to a missing object", "own", {"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "00000000-0000-0000-0000-000000000001"}]}},
     False),
    ("ownerReference to a Namespace", "own", {"metadata": {"ownerReferences": [
        {"apiVersion": "v1", "kind": "Namespace", "name": "default", "uid": "00000000-0000-0000-0000-000000000002"}]}},
     False),
    ("finalizer added", "own", {"metadata": {"finalizers": ["example.com/stuck"]}}, False),
    ("admin's finalizer removed", "own", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/hold"]}},
     False),
    ("generateName set", "own", {"metadata": {"generateName": "evil-"}}, False),
    ("spec: unschedulable", "own", {"spec": {"unschedulable": True}}, False),
    ("spec: taint added", "own", {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}, False),
    ("spec: providerID", "own", {"spec": {"providerID": "evil://x"}}, False),
    ("fiar.io/ label on another node", "other", {"metadata": {"labels": {"fiar.io/backend": "mnnvl"}}}, False),
    ("finalizer on another node", "other", {"metadata": {"finalizers": ["example.com/stuck"]}}, False),
    ("own node deleted", "own", "delete", False),
    ("node status patched", "own", "status", False),
    ("node created", "own", "create", False),
    ("fiar.io/ label with a token not bound to a pod", "own", "unbound", False),
]  # fmt: skip


def policy() -> None:
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    import fiar_contract as contract
    from devcluster.binaries import helm
    from devcluster.waiting import wait_for

    print("## policy: the agent's own-node admission policy, agent token bound to its pod")
    with tempfile.TemporaryDirectory() as tmp:
        plane = _start_plane("C", Path(tmp))
        try:
            helm("install", "fiar", str(ROOT / "charts" / "fiar"), "--namespace", "fiar-system",
                 "--create-namespace", kubeconfig=plane.kubeconfig)  # fmt: skip
            for name in ("gpu-own", "gpu-other"):
                plane.add_node(name, labels={"nvidia.com/gpu.present": "true"})
            with plane.api_client() as api:
                admin = client.CoreV1Api(api)
                admin.patch_node("gpu-own", {"metadata": {"finalizers": ["example.com/hold"]}})

                def agent_pod() -> Any:
                    pods = admin.list_namespaced_pod("fiar-system", label_selector="app.kubernetes.io/component=agent",
                                                     field_selector="spec.nodeName=gpu-own").items  # fmt: skip
                    return pods[0] if pods else None

                pod = wait_for(agent_pod, 60, "the agent pod")

                def connect(token: str, name: str) -> Any:
                    path = plane.write_kubeconfig(Path(tmp) / f"{name}.kubeconfig", name, token=token)
                    cfg = client.Configuration()
                    config.load_kube_config(config_file=str(path), client_configuration=cfg)
                    return client.CoreV1Api(client.ApiClient(cfg))

                agent = connect(plane.service_account_token("fiar-system", "fiar-agent", pod), "agent")
                unbound = connect(plane.service_account_token("fiar-system", "fiar-agent"), "unbound")

                def refused_on_other() -> bool:
                    try:
                        agent.patch_node("gpu-other", {"metadata": {"labels": {"fiar.io/x": "1"}}}, dry_run="All")
                    except ApiException as exc:
                        return exc.status == 403
                    return False

                wait_for(refused_on_other, 30, "the policy in effect")
                held = 0
                for what, target, action, allowed in POLICY_ATTEMPTS:
                    node = "gpu-own" if target == "own" else "gpu-other"
                    try:
                        if action == "clear":
                            admin.patch_node(node, {"metadata": {"annotations": {contract.ANNOTATION_REPROBE: "x"}}})
                            rv = agent.read_node(node).metadata.resource_version
                            agent.patch_node(node, {"metadata": {"resourceVersion": rv, "annotations": {
                                contract.ANNOTATION_REPROBE: None}}})  # fmt: skip
                        elif action == "delete":
                            agent.delete_node(node, dry_run="All")
                        elif action == "status":
                            agent.patch_node_status(
                                node, {"status": {"capacity": {"nvidia.com/gpu": "0"}}}, dry_run="All"
                            )
                        elif action == "create":
                            agent.create_node({"metadata": {"name": "forged"}}, dry_run="All")
                        elif action == "unbound":
                            unbound.patch_node(
                                node, {"metadata": {"labels": {"fiar.io/backend": "none"}}}, dry_run="All"
                            )
                        else:
                            agent.patch_node(node, action, dry_run=None if allowed else "All")
                        result = True
                    except ApiException as exc:
                        result = False
                        if exc.status not in (403, 422):
                            print(f"    unexpected {exc.status} for {what}")
                    held += int(result == allowed)
                    mark = "held" if result == allowed else "BROKEN"
                    print(f"  {mark:6s} {'allowed' if result else 'denied ':7s} {what}")
                admin.patch_node("gpu-own", {"metadata": {"finalizers": None}})
        finally:
            plane.stop()
    denied = sum(1 for a in POLICY_ATTEMPTS if not a[3])
    print(
        f"  {held} of {len(POLICY_ATTEMPTS)} held ({denied} attempts to be denied, "
        f"{len(POLICY_ATTEMPTS) - denied} writes the agent makes to be allowed)"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", default=["fixtures", "outcomes", "metrics", "reprobe", "policy"])
    parser.add_argument("--probes", type=int, default=60, help="full probes of accepted corrupted fixtures")
    parser.add_argument("--runs", type=int, default=20_000, help="random endings through classify")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"# agent hostile inputs ({platform.processor() or platform.machine()}, Python {platform.python_version()})")
    sections = {"fixtures": lambda: fixtures(args.probes), "outcomes": lambda: outcomes(args.runs),
                "metrics": lambda: metrics(1000, 200, 10.0), "reprobe": reprobe, "policy": policy}  # fmt: skip
    for name in args.only:
        sections[name]()
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
