"""Hostile clients against the operator's webhook port, and the reconciler's cost under load.

Starts the real webhook server (``Server``, TLS, aiohttp) in a child process with indexes of 100
nodes and 20 policies, then attacks it from this process and reads the child's resident memory
from /proc: absurd pods, floods of CREATEs, oversized bodies, huge legal pods, idle, slow and
surplus connections, deep JSON and fuzzed reviews. During each attack a keep-alive client times
ordinary reviews, as the API server would send them. Then, in process: the unconfigured-pods
sweep over 20,000 pods x 1,000 policies, and policy status writes after one node flip.

    PYTHONPATH=tools .venv/bin/python bench/operator_hostile_inputs.py [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import http.client
import json
import os
import random
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import fiar_contract as contract

ENVELOPE = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}


# -- the server (child process) ----------------------------------------------------------------------
def serve(workdir: Path) -> None:
    import logging

    from devcluster import pki
    from fiar_operator.admission.review import Admission
    from fiar_operator.admission.server import Server
    from fiar_operator.core.metrics import Metrics
    from fiar_operator.core.settings import Settings
    from fiar_operator.state.store import Store

    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))  # a container's usual limit
    logging.basicConfig(filename=workdir / "server.log", level=logging.INFO, format="%(levelname)s %(message)s")
    ca = pki.CertificateAuthority()
    crt, key = ca.issue("bench", hosts=("127.0.0.1",)).write(workdir, "serving")
    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    store = Store()
    for i in range(100):
        labels = {contract.LABEL_BACKEND: ("mnnvl", "trtllm", "none")[i % 3]}
        store.put_node({"metadata": {"name": f"gpu-{i}", "resourceVersion": "1", "labels": labels}})
    store.put_namespace({"metadata": {"name": "ml", "labels": {"team": "ml"}}})
    for i in range(20):
        spec = {"podSelector": {"matchLabels": {"app": "vllm"}}, "priority": i}
        store.put_policy({"metadata": {"name": f"policy-{i}"}, "spec": spec})
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
class Target:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(workdir)], env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        deadline = time.monotonic() + 30
        while not (workdir / "ports").exists():
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.1)
        time.sleep(0.1)
        port, metrics = (workdir / "ports").read_text().split()
        self.port, self.metrics_port = int(port), int(metrics)
        self.context = ssl.create_default_context(cafile=str(workdir / "ca.crt"))

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def metric(self, name: str, **labels: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith(f"{name}{{{want}}}") or (not labels and line.startswith(f"{name} ")):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def connection(self, timeout: float = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=timeout)

    def post(self, body: bytes, path: str = "/mutate/pods", conn: http.client.HTTPSConnection | None = None) -> Any:
        own = conn is None
        conn = conn or self.connection()
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            return response.status, data
        except (OSError, http.client.HTTPException) as exc:
            return type(exc).__name__, b""
        finally:
            if own:
                conn.close()

    def tls(self) -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        return self.context.wrap_socket(raw, server_hostname="127.0.0.1")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)

    def tracebacks(self) -> int:
        return (self.workdir / "server.log").read_text(errors="replace").count("Traceback")


def review(uid: str = "u", dry_run: bool = False, **pod: Any) -> bytes:
    meta = {"generateName": "vllm-7d9f-", "labels": {"app": "vllm"}, **pod.pop("metadata", {})}
    spec = {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}], **pod}
    request = {"uid": uid, "operation": "CREATE", "namespace": "ml", "dryRun": dry_run,
               "object": {"metadata": meta, "spec": spec}}
    return json.dumps({**ENVELOPE, "request": request}).encode()


class Probe:
    """Times ordinary reviews on a keep-alive connection while an attack runs."""

    def __init__(self, target: Target) -> None:
        self.target, self.times, self.failures = target, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = self.target.connection(timeout=30)
        body = review("probe")
        while not self._stop.is_set():
            started = time.perf_counter()
            status, _ = self.target.post(body, conn=conn)
            if status != 200:
                self.failures += 1
                conn.close()
                conn = self.target.connection(timeout=30)
            else:
                self.times.append(time.perf_counter() - started)
            time.sleep(0.01)
        conn.close()

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def summary(self) -> str:
        if not self.times:
            return f"ordinary reviews: none answered, {self.failures} failed"
        ms = sorted(t * 1000 for t in self.times)
        p50, p99 = statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        return (
            f"ordinary reviews: {len(ms)} answered, p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {ms[-1]:.0f} ms, "
            f"{self.failures} failed"
        )


def report(name: str, **figures: Any) -> None:
    print(f"\n## {name}")
    for key, value in figures.items():
        print(f"  {key}: {value}")


def parallel(count: int, call: Any, workers: int = 8) -> Counter[Any]:
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return Counter(pool.map(lambda _: call(), range(count)))


def attacks(target: Target, quick: bool) -> None:
    scale = 10 if quick else 1
    report("start", rss_mib=f"{target.rss_mib():.0f}")
    with Probe(target) as probe:
        time.sleep(2)
    report("baseline", probe=probe.summary())

    # 1. Absurd pods: 60,000 labels each.
    before = target.rss_mib()
    absurd = review(metadata={"labels": {f"k{i}": "v" for i in range(60_000)} | {"app": "vllm"}})
    statuses = Counter(target.post(absurd)[0] for _ in range(12))
    report("12 CREATEs with 60,000 labels each", body_mib=f"{len(absurd) / 2**20:.1f}", statuses=dict(statuses),
           memo_entries=target.metric("fiar_index_objects", index="admission_memo"),
           rss_mib=f"{before:.0f} -> {target.rss_mib():.0f}")

    # 2. A flood of ordinary CREATEs, each under its own generateName.
    before = target.rss_mib()
    count = 50_000 // scale
    counter = iter(range(count))
    lock = threading.Lock()
    local = threading.local()

    def create_one() -> Any:
        with lock:
            i = next(counter)
        if not hasattr(local, "conn"):
            local.conn = target.connection()
        return target.post(review(f"c{i}", metadata={"generateName": f"vllm-{i:06d}-"}), conn=local.conn)[0]

    statuses = parallel(count, create_one, workers=4)
    report(f"{count} ordinary CREATEs", statuses=dict(statuses),
           memo_entries=target.metric("fiar_index_objects", index="admission_memo"),
           rss_mib=f"{before:.0f} -> {target.rss_mib():.0f}")

    # 3. Oversized bodies from two clients.
    big = b'{"kind": "AdmissionReview", "request": {"uid": "x", "pad": "' + b"x" * int(7.7 * 2**20) + b'"}}'
    peak = [target.rss_mib()]
    with Probe(target) as probe:
        def send_big() -> Any:
            status = target.post(big)[0]
            peak[0] = max(peak[0], target.rss_mib())
            return status

        statuses = parallel(20, send_big, workers=2)
    report("20 bodies of 7.7 MiB from two clients", statuses=dict(statuses), peak_rss_mib=f"{peak[0]:.0f}",
           probe=probe.summary())

    # 4. Huge legal pods: three dry-run pods with 24,000 containers each, at once.
    huge = review(dry_run=True, containers=[{"name": f"c{i}", "image": "busybox"} for i in range(24_000)])
    with Probe(target) as probe:
        time.sleep(0.5)
        answers = parallel(3, lambda: target.post(huge), workers=3)
        time.sleep(0.5)
    warnings = {json.loads(body)["response"].get("warnings", ["-"])[0] for (status, body) in answers if status == 200}
    report("3 dry-run pods with 24,000 containers at once", body_mib=f"{len(huge) / 2**20:.2f}",
           answers=sorted(warnings), probe=probe.summary())

    # 5. Idle TLS connections.
    before = target.rss_mib()
    idle = [target.tls() for _ in range(600)]
    opened = target.rss_mib()
    time.sleep(12)
    closed = 0
    for sock in idle:
        sock.settimeout(0.01)
        with contextlib.suppress(TimeoutError, ssl.SSLError, OSError):
            closed += sock.recv(1) == b""
        sock.close()
    report("600 idle TLS connections", rss_mib=f"{before:.0f} -> {opened:.0f} while open",
           closed_by_the_server_after_12_s=closed)

    # 6. More connections than file descriptors (the server's limit is 1,024).
    with Probe(target) as probe:
        held = []
        for _ in range(1_100):
            try:
                held.append(target.tls())
            except OSError:
                break
        started = time.perf_counter()
        status, _ = target.post(review("through"))
        through = time.perf_counter() - started
        time.sleep(1)
        for sock in held:
            sock.close()
    report("1,100 TLS connections held open", opened=len(held), fresh_review=f"{status} in {through * 1000:.0f} ms",
           probe=probe.summary())

    # 7. Slow bodies.
    with Probe(target) as probe:
        slow = []
        for _ in range(300):
            sock = target.tls()
            sock.sendall(b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
            slow.append(sock)
        time.sleep(6)
        answers = Counter()
        for sock in slow:
            sock.settimeout(1)
            try:
                answers[sock.recv(12)[9:12].decode() or "closed"] += 1
            except (TimeoutError, ssl.SSLError, OSError):
                answers["no answer"] += 1
            sock.close()
    report("300 slow-body connections", answers_after_6_s=dict(answers), probe=probe.summary())

    # 8. Deep JSON and fuzzed reviews.
    deep = b'{"kind": "AdmissionReview", "request": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    statuses = Counter(target.post(deep)[0] for _ in range(20))
    report("20 bodies nested 100,000 deep", statuses=dict(statuses))
    fuzzed, missing_uid = Counter(), 0
    rng = random.Random(14)
    base = json.loads(review("fuzz"))
    values: list[Any] = [None, 0, -1, 2**70, "", "x" * 10_000, [], {}, [[[]]], True, "attacker/pods/prod", "ml"]
    paths = [("request",), ("request", "uid"), ("request", "namespace"), ("request", "operation"),
             ("request", "object"), ("request", "object", "metadata"), ("request", "object", "spec"),
             ("request", "object", "metadata", "labels"), ("request", "object", "spec", "containers"),
             ("request", "name"), ("request", "subResource"), ("request", "object", "target"), ("apiVersion",)]
    count = 5_000 // scale
    conn = target.connection()
    for i in range(count):
        doc = copy.deepcopy(base)
        doc["request"]["uid"] = f"fuzz-{i}"
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(paths)
            node = doc
            for part in path[:-1]:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node[path[-1]] = copy.deepcopy(rng.choice(values))
        status, body = target.post(json.dumps(doc).encode(), rng.choice(["/mutate/pods", "/mutate/binding"]), conn)
        fuzzed[status] += 1
        if status == 200 and json.loads(body)["response"]["uid"] != doc["request"]["uid"]:
            missing_uid += 1
        if status != 200 and status != 400:
            conn.close()
            conn = target.connection()
    conn.close()
    report(f"{count} fuzzed reviews", statuses=dict(fuzzed), answers_without_the_requests_uid=missing_uid,
           tracebacks_in_the_log=target.tracebacks(), server_alive=target.process.poll() is None,
           rss_mib=f"{target.rss_mib():.0f}")


# -- reconciler costs (in process) ----------------------------------------------------------------------
def reconciler(quick: bool) -> None:
    from fiar_operator.reconcile.status import NODE_COUNTS_REFRESH, StatusWriter
    from fiar_operator.reconcile.unconfigured import Unconfigured
    from fiar_operator.state.store import Store

    pods, policies = (2_000, 100) if quick else (20_000, 1_000)
    store = Store()
    for n in range(200):
        store.put_namespace({"metadata": {"name": f"ns-{n}", "resourceVersion": "1", "labels": {"team": f"t{n % 10}"}}})
    for i in range(policies):
        spec = {"podSelector": {"matchLabels": {"app": f"vllm-{i}"}},
                "namespaceSelector": {"matchLabels": {"team": f"t{i % 10}"}},
                "backends": ["mnnvl"] if i % 2 else ["trtllm"]}
        store.put_policy({"metadata": {"name": f"p{i}", "uid": f"u{i}", "generation": 1, "resourceVersion": "1"},
                          "spec": spec})
    for i in range(pods):
        store.put_pod({"metadata": {"name": f"pod-{i}", "namespace": f"ns-{i % 200}", "uid": f"pu-{i}",
                                    "labels": {"app": f"vllm-{i % policies}"}},
                       "spec": {"containers": [{"name": "vllm"}]}, "status": {"phase": "Running"}})
    tracker = Unconfigured(store, lambda ns: False, lambda name: None)
    started = time.process_time()
    tracker.sweep()
    full = time.process_time() - started
    store.put_namespace({"metadata": {"name": "ns-7", "resourceVersion": "2", "labels": {"team": "t8"}}})
    started = time.process_time()
    tracker.sweep()
    one = time.process_time() - started
    report(f"unconfigured-pods sweep, {pods} pods x {policies} policies, 200 namespaces",
           full_sweep_cpu_s=f"{full:.2f}", sweep_after_one_namespace_event_cpu_s=f"{one:.3f}",
           ratio=f"{full / max(one, 1e-6):.0f}x")

    class Recording:
        def __init__(self) -> None:
            self.patches = 0

        def patch_policy_status(self, name: str, status: Any) -> Any:
            self.patches += 1
            obj = copy.deepcopy(dict(store.policy_objects[name]))
            obj["status"] = status
            obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
            return obj

    for n in range(50):
        labels = {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_TRTLLM: "pass"}
        store.put_node({"metadata": {"name": f"gpu-{n}", "resourceVersion": "1", "labels": labels}})
    kube = Recording()
    writer = StatusWriter(store, kube, 0.5)  # type: ignore[arg-type]
    writer.mark()
    writer.flush()
    kube.patches = 0
    labels = {contract.LABEL_BACKEND: "trtllm", contract.LABEL_TRTLLM: "pass"}
    store.put_node({"metadata": {"name": "gpu-0", "resourceVersion": "2", "labels": labels}})
    writer.mark()
    writer.flush()
    report(f"policy status after one node flip (mnnvl -> trtllm), {policies} policies, half of them [mnnvl]",
           status_writes_at_once=kube.patches, status_writes_of_the_others_deferred_by_s=NODE_COUNTS_REFRESH)
    kube.patches = 0
    labels = {contract.LABEL_BACKEND: "mnnvl", contract.LABEL_TRTLLM: "pass", contract.LABEL_GPUS: "8"}
    store.put_node({"metadata": {"name": "gpu-1", "resourceVersion": "2", "labels": labels}})
    writer.mark()
    writer.flush()
    report("policy status after a node's other fiar.io label changed", status_writes=kube.patches)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--reconciler-only", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve))
        return
    if args.reconciler_only:
        reconciler(args.quick)
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    target = Target(Path(tempfile.mkdtemp()))
    try:
        attacks(target, args.quick)
    finally:
        target.stop()
    reconciler(args.quick)


if __name__ == "__main__":
    main()
