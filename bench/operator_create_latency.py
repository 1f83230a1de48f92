"""Pod CREATE latency through the API server with and without fiar, before and after, in one run.

On one local control plane (etcd + kube-apiserver), ``--creators`` threads create ``--pods`` pods
per batch, for pods no policy selects (``unmanaged``, app=web) and pods a policy selects
(``managed``, app=vllm in the policy's namespace), then delete them. Each round runs every
configuration in turn (alternated, so load drifts hit all alike):

    without          no operator, no webhook configuration
    operator:V       the operator of variant V running, no webhook configuration
    fiar:V           the operator running, its webhook configuration registered (chart settings)
    fiar2s:V         the same with a 2 s webhook timeout instead of the default (only with --only)
    frozen:V         the same, with the operator process stopped (SIGSTOP): a hung operator
    noop             bench/noop_webhook.py registered with the same configuration: a webhook that
                     allows everything and patches nothing, on the same serving stack (aiohttp, TLS,
                     one Python process); the floor any webhook costs here (only with --only)
    patch            the same no-op webhook answering every managed pod with fiar's own JSONPatch for
                     it, computed once: what the API server spends on applying fiar's change, told
                     from what the operator spends on deciding it (only with --only)
    label            the same with only the patch's op that adds fiar's policy label: the smallest
                     change any mutating webhook makes (only with --only)
    kyverno          Kyverno's admission controller (bench/kyverno_peer.py) with fiar's job written as
                     its policies (bench/kyverno), registering its own webhooks (only with --only)
    kyverno-frozen   the same, with Kyverno's process stopped (SIGSTOP) (only with --only)

For ``after`` the operator is started with ``--webhook-config``, so it narrows its configuration to
the policies (matchConditions); ``before`` is the source tree at ``--before`` (see operator_fleet.py),
started so too with ``--before-narrowed`` (a tree that has the option).
Reported per configuration and kind: p50 and p99 of the CREATE round trip (ms), pods/s, the managed
pods created without fiar's label (their review failed or timed out), for ``operator:V`` the
operator's CPU milliseconds per pod event (each pod makes an ADDED and a DELETED event; CPU of the
whole process over the batch, divided by the events), and for ``fiar``: the bucket of the 99th
percentile of the operator's own time per pod review and of the API server's time per call; for
every configuration, the CPU milliseconds per managed pod of each process on the machine (etcd, the
API server, the creators, the webhook), over the batch and its deletion: where the two cores go.

``--fleet NODES PODS`` first fills the plane with that many nodes and bound pods (operator_fleet.py's
shapes), so every webhook process serves a cluster of that size. ``--bind`` then binds each managed
pod of a batch to a node (a Binding POST, as the scheduler makes it; ``--creators`` at a time), reports
bindings per second and their p99, and counts the pods whose annotation ``fiar.io/backend`` is not
what fiar decides for their node (``wrong``). For every configuration, ``missing`` counts the managed
pods created without the ``VLLM_FLASHINFER_ALLREDUCE_BACKEND`` entry, and ``rss_peak_mib`` the webhook
process's peak resident memory (VmHWM) over the configuration.

``--modes closed pinned open`` runs each of those loop modes in every configuration, one after the
other on the same webhook process, so that a configuration's modes share its start: ``closed`` (the
closed loop), ``pinned`` (the closed loop with the control plane on core 0 and the webhook on core 1,
set with ``taskset`` on the running processes), ``open`` (the open loop at ``--rate``, default 200).

By default the creators run a closed loop (each makes its next pod when its last is created), which
keeps the machine's CPU saturated, so a round trip is mostly a wait for CPU and its percentiles follow
the CPU each pod costs in all processes together. ``--rate R`` makes R pods per second due instead
(an open loop, each round trip counted from when its pod was due): the latency at a load the machine
has room for.

    PYTHONPATH=tools .venv/bin/python bench/operator_create_latency.py --before /tmp/fiar-before [--pin]

``--only without fiar:after frozen:after`` runs those configurations only, in that order.
``--pin`` puts the control plane on core 0 and the operator on core 1, which tells the cost of
sharing two cores (contention) from the cost of the webhook calls themselves.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import kyverno_peer
from operator_fleet import NAMESPACES, cpu_seconds, create, established, node_body, populate, populate_nodes
from operator_process import NoopWebhookProcess, OperatorProcess, buckets, quantile_bound, total

import fiar_contract as contract
from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for
from fiar_operator import crd
from fiar_operator.admission import mutation
from fiar_operator.core import patches, policy
from fiar_operator.core.decide import decide
from fiar_operator.reconcile import webhookconfig
from fiar_operator.state import kube

CONFIG = "fiar-bench"
NOOPS = ("noop", "patch", "label")
"""Configurations served by bench/noop_webhook.py."""
HANDLER = "fiar_webhook_duration_seconds"
MANAGED_NS, PLAIN_NS = "bench-managed", "bench-plain"


def start_operator(plane: ControlPlane, source: Path | None, workdir: Path, narrow: bool, pin: bool) -> OperatorProcess:
    """The operator with a serving certificate of the plane's CA, ready; narrowing its configuration
    to the policies when ``narrow``."""
    assert plane.ca is not None
    pair = plane.ca.issue("fiar-operator", hosts=("127.0.0.1", "localhost"))
    operator = OperatorProcess(
        plane.kubeconfig,
        workdir,
        source=source,
        tls=pair.write(workdir, "serving"),
        webhook_config=CONFIG if narrow else None,
        pin_core=1 if pin else None,
    )
    operator.wait_ready()
    return operator


def start_noop(plane: ControlPlane, workdir: Path, pin: bool, patch: str | None = None) -> NoopWebhookProcess:
    assert plane.ca is not None
    pair = plane.ca.issue("fiar-operator", hosts=("127.0.0.1", "localhost"))
    noop = NoopWebhookProcess(workdir, pair.write(workdir, "serving"), pin_core=1 if pin else None, patch=patch)
    noop.wait_ready()
    return noop


RELEASED_IMAGE = "vllm/vllm-openai:v0.33.0"
"""The image of every benchmark pod: a release tag, as a Deployment names it. With an untagged image
fiar cannot tell which of vLLM's FlashInfer paths its fusion control turns off, and posts one
``FlashInferNotTurnedOff`` Warning per managed pod on a node that verifies no backend
(``--untagged`` measures that; BENCHMARKS.md)."""
IMAGE = RELEASED_IMAGE


def pod(i: int, managed: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{i:06d}", "labels": {"app": "vllm" if managed else "web"}},
        "spec": {"containers": [{"name": "vllm", "image": IMAGE, "command": ["vllm", "serve", "m"]}]},
    }


def has_env(created: dict[str, Any]) -> bool:
    """Whether the created pod's vllm container carries the variable (from any webhook)."""
    for container in created["spec"].get("containers") or []:
        if container.get("name") == "vllm":
            return any(e.get("name") == contract.ENV_VAR for e in container.get("env") or [])
    return False


def batch(
    client: kube.Kube,
    managed: bool,
    count: int,
    creators: int,
    start: int,
    rate: float | None = None,
    keep: bool = False,
) -> tuple[list[float], float, int]:
    """CREATE round trips (ms), seconds for the batch, and the pods whose variable is not as it should
    be: a managed pod created without it (its review timed out, failed or was never made), or an
    unmanaged pod given it. The pods are deleted after, unless ``keep``.

    Without ``rate`` each creator makes its next pod as soon as its last one is created (a closed
    loop: the machine runs flat out). With ``rate`` the pods are due at that many per second, whatever
    the answers (an open loop), and each round trip counts from when its pod was due, so a pod that
    waits for a free creator counts its wait."""
    namespace = MANAGED_NS if managed else PLAIN_NS
    path = f"/api/v1/namespaces/{namespace}/pods"
    began = time.perf_counter()

    def one(i: int) -> tuple[float, bool]:
        due = began + (i - start) / rate if rate else time.perf_counter()
        if (wait := due - time.perf_counter()) > 0:
            time.sleep(wait)
        created = client.call("POST", path, body=pod(i, managed), timeout=30.0)
        return (time.perf_counter() - due) * 1000, has_env(created) == managed

    with concurrent.futures.ThreadPoolExecutor(creators) as pool:
        done = list(pool.map(one, range(start, start + count)))
    elapsed = time.perf_counter() - began
    if not keep:
        delete_pods(client, namespace)
    return [t for t, _ in done], elapsed, sum(not right for _, right in done)


def take_events(client: kube.Kube) -> dict[str, int]:
    """Events in the managed namespace by reason (any component), then deleted: what a webhook's
    process posted for one batch (each an API request it paid for)."""
    path = f"/api/v1/namespaces/{MANAGED_NS}/events"
    found: dict[str, int] = {}
    for event in client.call("GET", path, timeout=60.0)["items"]:
        reason = str(event.get("reason") or "")
        found[reason] = found.get(reason, 0) + 1
    if found:
        client.call("DELETE", path, timeout=60.0)
    return found


def delete_pods(client: kube.Kube, namespace: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    client.call("DELETE", path, {"gracePeriodSeconds": 0}, timeout=120.0)
    wait_for(lambda: not client.call("GET", path, {"limit": 1})["items"], 120, "pods deleted")


def bind(client: kube.Kube, start: int, count: int, creators: int, nodes: Sequence[str]) -> tuple[list[float], float]:
    """Bind the managed pods ``start ..`` of a kept batch, pod i to ``nodes[i % len(nodes)]``, as the
    scheduler does (a Binding POST): round trips (ms) and seconds for all."""
    began = time.perf_counter()

    def one(i: int) -> float:
        name = pod(i, True)["metadata"]["name"]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[i % len(nodes)]},
        }
        sent = time.perf_counter()
        client.call("POST", f"/api/v1/namespaces/{MANAGED_NS}/pods/{name}/binding", body=body, timeout=30.0)
        return (time.perf_counter() - sent) * 1000

    with concurrent.futures.ThreadPoolExecutor(creators) as pool:
        times = list(pool.map(one, range(start, start + count)))
    return times, time.perf_counter() - began


def wrong_backends(client: kube.Kube, expected: Mapping[str, str]) -> int:
    """Bound managed pods whose fiar.io/backend annotation is not ``expected`` for their node."""
    pods = client.call("GET", f"/api/v1/namespaces/{MANAGED_NS}/pods")["items"]
    return sum(
        (p["metadata"].get("annotations") or {}).get(contract.ANNOTATION_POD_BACKEND)
        != expected.get(p["spec"].get("nodeName") or "")
        for p in pods
    )


def place(plane: ControlPlane, webhook: int | None, pinned: bool) -> None:
    """Pinned: the control plane on core 0 and the webhook's process on core 1; else both on all
    cores (``taskset`` on every thread of the running processes)."""
    every = f"0-{(os.cpu_count() or 1) - 1}"
    for component in plane.components.values():
        if component.pid is not None:
            cores = "0" if pinned else every
            subprocess.run(["taskset", "-a", "-p", "-c", cores, str(component.pid)], check=True, capture_output=True)
    if webhook is not None:
        subprocess.run(
            ["taskset", "-a", "-p", "-c", "1" if pinned else every, str(webhook)], check=True, capture_output=True
        )


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def p(times: list[float], q: float) -> float:
    return statistics.quantiles(times, n=100, method="inclusive")[int(q) - 1]


def apiserver_metrics(api: Any) -> str:
    """The API server's /metrics (the plane's admin client)."""
    method, url, headers, body, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers, body=body, _request_timeout=10)
    response.read()
    return bytes(response.data).decode()


def process_cpu(plane: ControlPlane, webhook: OperatorProcess | NoopWebhookProcess | None) -> dict[str, float]:
    """CPU seconds so far of each process that shares the machine during a batch (the batch's
    deletion included: it is part of every configuration alike)."""
    own = os.times()
    seconds = {name: cpu_seconds(c.pid) for name, c in plane.components.items() if c.pid is not None}
    seconds["creators"] = own.user + own.system
    seconds["webhook"] = cpu_seconds(webhook.process.pid) if webhook is not None else 0.0
    return seconds


def fiar_patch(body: dict[str, Any], spec: dict[str, Any], label_only: bool = False) -> str:
    """fiar's JSONPatch (base64) for the managed pod of this benchmark under its policy, as the pod
    webhook answers it while the pod waits for a node; ``label_only``: its one op that adds the
    policy label (the smallest change a mutating webhook makes)."""
    chosen = policy.parse_policy({**body, "spec": spec})
    ops = mutation.plan_pod_create(pod(0, managed=True), chosen, {}).ops
    return patches.encode([op for op in ops if op["path"].startswith("/metadata/labels")] if label_only else ops)


WEBHOOK_SECONDS = "apiserver_admission_webhook_admission_duration_seconds"


def register(client: kube.Kube, plane: ControlPlane, port: int, timeout: int = webhookconfig.TIMEOUT_SECONDS) -> None:
    config = webhookconfig.configuration(
        plane.ca_file.read_bytes(), url=f"https://127.0.0.1:{port}", name=CONFIG, timeout=timeout
    )
    client.apply(kube.MUTATING_CONFIGS, config)
    time.sleep(2)  # the API server picks configurations up within about a second


WEBHOOK_NAMES = {"fiar": webhookconfig.POD_HOOK, "kyverno": "mutate.kyverno.svc-ignore"}
"""The pod webhook whose calls the API server's histogram is read for, by kind of configuration."""


def start_webhook(
    kind: str,
    variant: str,
    source: Path | None,
    plane: ControlPlane,
    client: kube.Kube,
    workdir: Path,
    body: dict[str, Any],
    spec: dict[str, Any],
    narrowed: bool = False,
) -> OperatorProcess | None:
    """The process a configuration runs, ready and registered (None for ``without``); ``narrowed``:
    the ``before`` operator narrows its configuration too (a tree that has ``--webhook-config``)."""
    running: OperatorProcess | None = None
    if kind == "without":
        return None
    if kind in ("kyverno", "kyverno-frozen"):
        docs = kyverno_peer.policies({"app": "vllm"}, [MANAGED_NS])
        return kyverno_peer.start(client, plane.kubeconfig, workdir, docs)
    if kind == "noop":
        running = start_noop(plane, workdir, pin=False)
    elif kind in ("patch", "label"):
        running = start_noop(plane, workdir, pin=False, patch=fiar_patch(body, spec, label_only=kind == "label"))
    else:
        narrow = variant == "after" or narrowed
        running = start_operator(plane, source, workdir, narrow=narrow, pin=False)
        time.sleep(3)
    try:
        if kind in ("fiar", "fiar2s", "frozen", *NOOPS):
            register(client, plane, running.port, 2 if kind == "fiar2s" else webhookconfig.TIMEOUT_SECONDS)
            if variant == "after" or (narrowed and kind not in NOOPS):
                wait_for(
                    lambda: "matchConditions" in client.call("GET", f"{kube.MUTATING_CONFIGS}/{CONFIG}")["webhooks"][0],
                    30,
                    "conditions set",
                )
                time.sleep(2)
    except BaseException:
        running.stop()
        raise
    return running


def stop_webhook(kind: str, running: OperatorProcess | None, client: kube.Kube) -> None:
    if running is not None:
        running.stop()
    if kind in ("fiar", "fiar2s", "frozen", *NOOPS):
        client.delete(kube.MUTATING_CONFIGS, CONFIG)
        time.sleep(2)
    elif kind in ("kyverno", "kyverno-frozen"):
        kyverno_peer.remove_webhooks(client)
        time.sleep(2)


FLEET_GPU_EVERY = 5
"""One fleet node in this many is a GPU node (operator_fleet.py's default)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="source tree of the operator to compare with")
    parser.add_argument(
        "--before-narrowed",
        action="store_true",
        help="start the --before operator with --webhook-config too, so both narrow their configuration",
    )
    parser.add_argument("--pods", type=int, default=300, help="pods per batch")
    parser.add_argument("--frozen-pods", type=int, help="pods per batch of a frozen configuration (default --pods)")
    parser.add_argument("--creators", type=int, default=20)
    parser.add_argument(
        "--rate", type=float, help="pods per second due in each batch (an open loop; default: closed loop)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--only",
        nargs="+",
        help="configurations to run (e.g. without fiar:after frozen:after); default: all",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the control plane on core 0, the operator on core 1 (as on a real cluster, apart)",
    )
    parser.add_argument("--modes", nargs="+", choices=("closed", "pinned", "open"), help="loop modes, in turn")
    parser.add_argument("--fleet", type=int, nargs=2, metavar=("NODES", "PODS"), help="fill the plane first")
    parser.add_argument("--bind", action="store_true", help="bind every managed pod, and check its backend")
    parser.add_argument("--untagged", action="store_true", help="pods of an untagged vLLM image (see RELEASED_IMAGE)")
    args = parser.parse_args()
    if args.untagged:
        global IMAGE
        IMAGE = "vllm/vllm-openai"
    modes: list[str] = args.modes or ["open" if args.rate else "pinned" if args.pin else "closed"]
    rate_open = args.rate or 200.0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fiar-create-"))
    print(f"# {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}; work in {workdir}")
    print(
        f"# {args.pods} pods per batch ({args.frozen_pods or args.pods} frozen), {args.creators} creators, "
        f"{args.rounds} rounds, modes {modes} (open loop at {rate_open}/s), fleet {args.fleet}, bind {args.bind}",
        flush=True,
    )
    plane = ControlPlane(workdir / "plane", Tier.A)
    plane.start()
    client = kube.Kube(plane.api_client(), pool_size=64)
    results: dict[tuple[str, str], list[float]] = {}
    rates: dict[tuple[str, str], list[float]] = {}
    cpu: dict[str, list[float]] = {}
    try:
        client.apply(kube.CRDS, crd.definition())
        wait_for(lambda: established(client), 30, "CRD established")
        for namespace in (MANAGED_NS, PLAIN_NS):
            create(client, kube.NAMESPACES, {"metadata": {"name": namespace}})
        create(client, kube.NODES, {"metadata": {"name": "gpu-0", "labels": {contract.LABEL_BACKEND: "trtllm"}}})
        if args.fleet:
            for namespace in (f"fleet-{k}" for k in range(NAMESPACES)):
                create(client, kube.NAMESPACES, {"metadata": {"name": namespace}})
            populate_nodes(plane, args.fleet[0], FLEET_GPU_EVERY)
            populate(plane, args.fleet[0], FLEET_GPU_EVERY, range(args.fleet[1]), managed=False, decision=None)
        spec = {
            "podSelector": {"matchLabels": {"app": "vllm"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MANAGED_NS}},
        }
        body = {"apiVersion": "fiar.io/v1alpha1", "kind": "FiAllreducePolicy", "metadata": {"name": "bench"}}
        create(client, kube.POLICIES, {**body, "spec": spec})
        chosen = policy.parse_policy(client.call("GET", f"{kube.POLICIES}/bench"))
        targets = [f"node-{i:05d}" for i in range(args.fleet[0])] if args.fleet else ["gpu-0"]
        expected = {
            name: decide(
                chosen,
                name,
                node_body(int(name[5:]), FLEET_GPU_EVERY)["metadata"]["labels"]
                if args.fleet
                else {contract.LABEL_BACKEND: "trtllm"},
            ).backend
            for name in targets
        }
        variants: list[tuple[str, Path | None]] = [("after", None)]
        if args.before is not None:
            variants.insert(0, ("before", args.before))
        kinds = ("operator", "fiar", "fiar2s", "frozen")
        configurations = ["without"] + [f"{c}:{v}" for c in kinds for v, _ in variants if c != "fiar2s"]
        if args.only:
            configurations = list(args.only)  # in the order given
        if any(c.startswith("kyverno") for c in configurations):
            kyverno_peer.install(client)
        api = plane.api_client()
        means: dict[tuple[str, str], list[float]] = {}
        """(cell, measure) -> per managed batch: mean time per review in the operator and per
        call in the API server (ms), and the operator's CPU per managed pod (ms, its watch included)."""
        shares: dict[tuple[str, str], list[float]] = {}
        """(cell, process) -> per managed batch: CPU ms per pod of each process (the
        control plane's, this benchmark's creators, the webhook's): where the machine's two cores go."""
        wrong: dict[tuple[str, str], int] = {}
        """(cell, kind) -> pods whose variable is missing (managed) or was given (unmanaged)."""
        handler: dict[str, list[tuple[float, float]]] = {}
        """Cell -> (p99 bucket bound of the pod webhook, s; reviews) per managed batch: the
        operator's own time per review, and the API server's time per call."""
        binds: dict[str, list[float]] = {}
        bind_rates: dict[str, list[float]] = {}
        bind_wrong: dict[str, int] = {}
        rss: dict[str, list[float]] = {}
        events: dict[tuple[str, str], int] = {}
        """(cell, reason) -> Events posted in the managed namespace over its managed batches."""
        counter = args.pods * 2
        for managed in (False, True):  # warm-up, not counted
            batch(client, managed, args.pods, args.creators, 0 if managed else args.pods)
        for _ in range(args.rounds):
            for configuration in configurations:
                kind, _, variant = configuration.partition(":")
                source = dict(variants).get(variant)
                frozen = kind in ("frozen", "kyverno-frozen")
                count = (args.frozen_pods or args.pods) if frozen else args.pods
                print(f"# {time.strftime('%H:%M:%S')} {configuration}", flush=True)
                running = start_webhook(kind, variant, source, plane, client, workdir, body, spec, args.before_narrowed)
                try:
                    if frozen:
                        assert running is not None
                        running.freeze()
                    for mode in modes:
                        cell = f"{configuration}@{mode}"
                        rate = rate_open if mode == "open" else None
                        place(plane, running.pid if running is not None else None, mode == "pinned")
                        for managed in (False, True):
                            label = "managed" if managed else "unmanaged"
                            spent_before = process_cpu(plane, running)
                            server_text = apiserver_metrics(api)
                            hook = WEBHOOK_NAMES.get(kind.split("-")[0], webhookconfig.POD_HOOK)
                            seen = buckets(server_text, WEBHOOK_SECONDS, name=hook)
                            seen_total = total(server_text, WEBHOOK_SECONDS, name=hook)
                            own_text = running.metrics() if kind.startswith("fiar") and running is not None else ""
                            mine, mine_total = (
                                buckets(own_text, HANDLER, webhook="pods"),
                                total(own_text, HANDLER, webhook="pods"),
                            )
                            keep = managed and args.bind
                            if managed:
                                take_events(client)
                            times, elapsed, bad = batch(client, managed, count, args.creators, counter, rate, keep)
                            if keep:
                                taken, seconds = bind(client, counter, count, args.creators, targets)
                                binds.setdefault(cell, []).extend(taken)
                                bind_rates.setdefault(cell, []).append(count / seconds)
                                bind_wrong[cell] = bind_wrong.get(cell, 0) + wrong_backends(client, expected)
                                delete_pods(client, MANAGED_NS)
                            if managed and not frozen:
                                after = process_cpu(plane, running)
                                for name, seconds in after.items():
                                    shares.setdefault((cell, name), []).append(
                                        (seconds - spent_before[name]) * 1000 / count
                                    )
                            if managed:
                                for reason, n in take_events(client).items():
                                    events[(cell, reason)] = events.get((cell, reason), 0) + n
                            key = (cell, label)
                            wrong[key] = wrong.get(key, 0) + bad
                            if kind in ("fiar", "fiar2s", "kyverno") and managed:
                                assert running is not None
                                server_text = apiserver_metrics(api)
                                now = buckets(server_text, WEBHOOK_SECONDS, name=hook)
                                call = quantile_bound(now, seen, 0.99)
                                own: tuple[float, float] = (float("nan"), 0.0)
                                if kind.startswith("fiar"):
                                    own_text = running.metrics()
                                    own = quantile_bound(buckets(own_text, HANDLER, webhook="pods"), mine, 0.99)
                                    s1, n1 = total(own_text, HANDLER, webhook="pods")
                                    means.setdefault((cell, "operator_mean_ms"), []).append(
                                        1000 * (s1 - mine_total[0]) / max(n1 - mine_total[1], 1)
                                    )
                                handler.setdefault(cell, []).extend([own, call])
                                s1, n1 = total(server_text, WEBHOOK_SECONDS, name=hook)
                                means.setdefault((cell, "api_server_mean_ms"), []).append(
                                    1000 * (s1 - seen_total[0]) / max(n1 - seen_total[1], 1)
                                )
                                webhook_cpu = shares[(cell, "webhook")][-1]
                                means.setdefault((cell, "webhook_cpu_ms_per_managed_pod"), []).append(webhook_cpu)
                            counter += count
                            results.setdefault((cell, label), []).extend(times)
                            rates.setdefault((cell, label), []).append(count / elapsed)
                            if kind == "operator" and running is not None:
                                time.sleep(1)  # the DELETED events reach the operator
                                spent = cpu_seconds(running.process.pid) - spent_before["webhook"]
                                cpu.setdefault(variant, []).append(spent * 1000 / (2 * count))
                    if running is not None:
                        rss.setdefault(configuration, []).append(peak_rss_mib(running.pid))
                finally:
                    place(plane, None, False)
                    stop_webhook(kind, running, client)
        for (cell, label), times in sorted(results.items()):
            mode = cell.rsplit("@", 1)[1]
            base = results.get((f"without@{mode}", label))
            row = {
                "configuration": cell.rsplit("@", 1)[0],
                "mode": mode,
                "pods": label,
                "p50_ms": round(p(times, 50), 1),
                "p99_ms": round(p(times, 99), 1),
                "p99_ratio": round(p(times, 99) / p(base, 99), 2) if base else None,
                "pods_per_s": round(statistics.mean(rates[(cell, label)]), 1),
                "wrong_env": wrong.get((cell, label), 0),
            }
            print(json.dumps(row))
        for cell, times in sorted(binds.items()):
            base = binds.get(f"without@{cell.rsplit('@', 1)[1]}")
            print(
                json.dumps(
                    {
                        "bind": cell,
                        "p50_ms": round(p(times, 50), 1),
                        "p99_ms": round(p(times, 99), 1),
                        "p99_ratio": round(p(times, 99) / p(base, 99), 2) if base else None,
                        "binds_per_s": round(statistics.mean(bind_rates[cell]), 1),
                        "wrong_backend": bind_wrong[cell],
                    }
                )
            )
        for configuration, values in rss.items():
            print(json.dumps({"rss_peak_mib": configuration, "values": [round(v) for v in values]}))
        for (cell, reason), n in sorted(events.items()):
            print(json.dumps({"events_in_managed_namespace": cell, "reason": reason, "count": n}))
        for cell, bounds in handler.items():
            own_bounds, call_bounds = bounds[0::2], bounds[1::2]
            print(
                json.dumps(
                    {
                        "pod_webhook_p99_le_s": cell,
                        "operator_handler": [b for b, _ in own_bounds],
                        "api_server_call": [b for b, _ in call_bounds],
                        "reviews": [n for _, n in own_bounds],
                        "calls": [n for _, n in call_bounds],
                    }
                )
            )
        for (cell, name), values in sorted(means.items()):
            print(json.dumps({"managed_batches": cell, name: [round(v, 2) for v in values]}))
        for (cell, name), values in sorted(shares.items()):
            print(json.dumps({"cpu_ms_per_managed_pod": cell, name: [round(v, 2) for v in values]}))
        for variant, values in cpu.items():
            print(json.dumps({"operator_cpu_ms_per_pod_event": variant, "mean": round(statistics.mean(values), 3)}))
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
