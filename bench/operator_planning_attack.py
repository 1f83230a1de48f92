"""One tenant's dry-run pods beside ordinary reviews, before and after planning was bounded by work.

Each round starts the real webhook server (``Server``, TLS, aiohttp, 4 review threads) in a child
process with indexes of 1,000 mnnvl nodes in one clique and one policy, from one of two checkouts:
the old code (``--old``, e.g. a ``git worktree`` of 4e828a0) and this one; rounds alternate
old, new, old, new... in one run. During a round, attacker threads send one of two attack pods as
fast as they are answered, while a keep-alive client sends ordinary vLLM pod reviews (as the API
server would, 20 a second) and another polls ``/healthz`` with the kubelet's 1 s timeout:

- ``reported``: the pod of the report, a LeaderWorkerSet of size 2 bound at once (``nodeName``)
  to an mnnvl node, with one node-affinity expression of 580,000 two-character values (2.9 MB);
- ``within-bounds``: the same pod with 998 one-value expressions (40 KB), inside every size bound
  of ``limits.oversized``, whose group check would cost a million requirement checks;
- ``eval-16k``, ``eval-48k``: a vLLM pod whose ``sh -c`` script is ``vllm serve m
  ${VLLM_ADDITIONAL_ARGS} eval eval ...`` of 16 KiB (a review small enough to be planned on the event
  loop) or 48 KiB, on which the pattern ``eval[^;&|\n]*vllm serve`` of 0d8eaeb backtracked
  quadratically (``--old`` a worktree of 0d8eaeb; ``--attacks eval-16k,eval-48k``).

An ordinary review counts as configured when it is answered 200 with a patch within the webhooks'
1 s timeout (otherwise the API server fails open and the pod runs unconfigured).

    git worktree add /tmp/fiar-4e828a0 4e828a0
    PYTHONPATH=tools .venv/bin/python bench/operator_planning_attack.py --old /tmp/fiar-4e828a0 [--rounds 2]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NODES = 1_000
ATTACKERS = 6
SECONDS = 10.0
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
MNNVL = {"fiar.io/backend": "mnnvl", "fiar.io/mnnvl": "pass", "fiar.io/clique": "clique-a"}


# -- the server (child process, code from ``root``) ------------------------------------------------
def serve(workdir: Path, root: Path) -> None:
    sys.path[:0] = [str(root / "operator"), str(root)]
    import logging

    import fiar_operator
    from devcluster import pki
    from fiar_operator.admission.review import Admission
    from fiar_operator.admission.server import Server
    from fiar_operator.core.metrics import Metrics
    from fiar_operator.core.settings import Settings
    from fiar_operator.state.store import Store

    assert Path(fiar_operator.__file__).is_relative_to(root), fiar_operator.__file__
    logging.basicConfig(filename=workdir / "server.log", level=logging.INFO, format="%(levelname)s %(message)s")
    ca = pki.CertificateAuthority()
    crt, key = ca.issue("bench", hosts=("127.0.0.1",)).write(workdir, "serving")
    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    store = Store()
    for i in range(NODES):
        labels = {**MNNVL, "kubernetes.io/hostname": f"gpu-{i:04d}"}
        store.put_node({"metadata": {"name": f"gpu-{i:04d}", "resourceVersion": "1", "labels": labels}})
    store.put_namespace({"metadata": {"name": "ml", "labels": {"team": "ml"}}})
    store.put_policy({"metadata": {"name": "vllm"}, "spec": {"podSelector": {"matchLabels": {"app": "vllm"}}}})
    for kind in ("nodes", "namespaces", "policies", "pods"):
        store.synced[kind] = True
    metrics = Metrics(store.sizes)
    settings = Settings(
        webhook_host="127.0.0.1", webhook_port=0, tls_cert=crt, tls_key=key, metrics_host="127.0.0.1", metrics_port=0
    )
    server = Server(Admission(store, metrics), metrics, settings, None, lambda: store.synced)
    server.start()
    (workdir / "ports").write_text(f"{server.port} {server.metrics_port}")
    threading.Event().wait()


# -- the client side ---------------------------------------------------------------------------------
def review(pod: dict[str, Any], uid: str, dry_run: bool) -> bytes:
    request = {"uid": uid, "operation": "CREATE", "namespace": "ml", "dryRun": dry_run, "object": pod}
    doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(doc, separators=(",", ":")).encode()


def attack_pod(expressions: list[dict[str, Any]]) -> dict[str, Any]:
    terms = {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
    return {
        "metadata": {"generateName": "attack-", "labels": {"app": "vllm"}, "annotations": {LWS_SIZE: "2"}},
        "spec": {
            "nodeName": "gpu-0000",
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}},
        },
    }


def attacks() -> dict[str, bytes]:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    values = [alphabet[i % 36] + alphabet[i // 36 % 36] for i in range(580_000)]
    reported = attack_pod([{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": values}])
    within = attack_pod([{"key": "kubernetes.io/hostname", "operator": "Exists"}] * 998)
    found = {"reported": review(reported, "attack", True), "within-bounds": review(within, "attack", True)}
    for kib in (16, 48):
        found[f"eval-{kib}k"] = review(eval_pod(kib * 1024), "attack", True)
    return found


def eval_pod(size: int) -> dict[str, Any]:
    """A vLLM pod whose shell script ends in ``eval`` words, ``size`` characters in all."""
    script = ("vllm serve m ${VLLM_ADDITIONAL_ARGS} " + "eval " * size)[:size]
    container = {"name": "vllm", "image": "vllm/vllm-openai", "command": ["sh", "-c", script]}
    return {"metadata": {"generateName": "attack-", "labels": {"app": "vllm"}}, "spec": {"containers": [container]}}


ORDINARY = review(
    {
        "metadata": {"generateName": "vllm-", "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai", "args": ["--model", "m"]}]},
    },
    "ordinary",
    False,
)


class Target:
    def __init__(self, root: Path) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="fiar-planning-"))
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.workdir), "--root", str(root)],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 60
        while not (self.workdir / "ports").exists():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.1)
        time.sleep(0.1)
        port, metrics = (self.workdir / "ports").read_text().split()
        self.port, self.metrics_port = int(port), int(metrics)
        self.context = ssl.create_default_context(cafile=str(self.workdir / "ca.crt"))

    def connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=timeout)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def post(conn: http.client.HTTPSConnection, body: bytes) -> tuple[Any, Any]:
    conn.request("POST", "/mutate/pods", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    return response.status, json.loads(data) if data else None


def rounds(target: Target, attack: bytes) -> dict[str, Any]:
    stop = threading.Event()
    attack_times: list[float] = []
    ordinary: list[tuple[float, bool]] = []
    health: list[bool] = []

    def attacker() -> None:
        while not stop.is_set():
            conn = target.connection(60)
            started = time.perf_counter()
            try:
                post(conn, attack)
                attack_times.append(time.perf_counter() - started)
            except (OSError, http.client.HTTPException):
                pass
            finally:
                conn.close()

    def prober() -> None:
        conn = target.connection(1.0)
        while not stop.is_set():
            started = time.perf_counter()
            try:
                status, answer = post(conn, ORDINARY)
                ok = status == 200 and "patch" in answer["response"]
            except (OSError, http.client.HTTPException, TypeError, KeyError):
                ok = False
                conn.close()
                conn = target.connection(1.0)
            took = time.perf_counter() - started
            ordinary.append((took, ok and took <= 1.0))
            time.sleep(max(0.0, 0.05 - took))
        conn.close()

    def liveness() -> None:
        while not stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", target.metrics_port, timeout=1.0)
            try:
                conn.request("GET", "/healthz")
                health.append(conn.getresponse().status == 200)
            except (OSError, http.client.HTTPException):
                health.append(False)
            finally:
                conn.close()
            time.sleep(0.25)

    cpu = target.cpu_s()
    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(ATTACKERS)]
    threads += [threading.Thread(target=prober, daemon=True), threading.Thread(target=liveness, daemon=True)]
    for thread in threads:
        thread.start()
    time.sleep(SECONDS)
    stop.set()
    ended = time.perf_counter()
    for thread in threads:
        thread.join(120)
    recovered = None  # seconds until an ordinary review is configured again (the review threads are free)
    while recovered is None and time.perf_counter() - ended < 60:
        conn = target.connection(1.0)
        try:
            status, answer = post(conn, ORDINARY)
            if status == 200 and "patch" in answer["response"]:
                recovered = time.perf_counter() - ended
        except (OSError, http.client.HTTPException, TypeError, KeyError):
            pass
        finally:
            conn.close()
    ms = sorted(t * 1000 for t, _ in ordinary)
    atk = sorted(attack_times)
    return {
        "ordinary_configured": f"{sum(ok for _, ok in ordinary)} of {len(ordinary)}",
        "ordinary_ms_p50_p99_max": f"{statistics.median(ms):.0f} / {ms[int(len(ms) * 0.99)]:.0f} / {ms[-1]:.0f}"
        if ms
        else "-",
        "attack_answered": len(atk),
        "attack_within_1s": sum(t <= 1.0 for t in atk),
        "attack_s_median": f"{statistics.median(atk):.2f}" if atk else "-",
        "attack_s_max": f"{atk[-1]:.2f}" if atk else "-",
        "healthz_ok_within_1s": f"{sum(health)} of {len(health)}",
        "server_cpu_s": f"{target.cpu_s() - cpu:.1f}",
        "configured_again_after_the_attack_s": f"{recovered:.1f}" if recovered is not None else "over 60",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve")
    parser.add_argument("--root", default=str(ROOT))
    parser.add_argument("--old", help="a checkout of the code to compare with (git worktree add DIR 4e828a0)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--attacks", help="comma-separated attack names (default: all)")
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve), Path(args.root))
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    variants = [("old", Path(args.old).resolve())] if args.old else []
    variants.append(("new", ROOT))
    bodies = attacks()
    if args.attacks:
        bodies = {name: bodies[name] for name in args.attacks.split(",")}
    print(f"{NODES} nodes, {ATTACKERS} attacker threads, {SECONDS:g} s per round, ordinary reviews at 20/s")
    for name, body in bodies.items():
        print(f"attack {name}: {len(body) / 1e6:.2f} MB")
    for number in range(args.rounds):
        for attack, body in bodies.items():
            for variant, root in variants:
                target = Target(root)
                try:
                    figures = rounds(target, body)
                finally:
                    target.stop()
                print(f"\n## round {number + 1}, attack {attack}, {variant} code")
                for key, value in figures.items():
                    print(f"  {key}: {value}")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
