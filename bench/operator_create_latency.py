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

For ``after`` the operator is started with ``--webhook-config``, so it narrows its configuration to
the policies (matchConditions); ``before`` is the source tree at ``--before`` (see operator_fleet.py).
Reported per configuration and kind: p50 and p99 of the CREATE round trip (ms), pods/s, the managed
pods created without fiar's label (their review failed or timed out), for ``operator:V`` the
operator's CPU milliseconds per pod event (each pod makes an ADDED and a DELETED event; CPU of the
whole process over the batch, divided by the events), and for ``fiar``: the bucket of the 99th
percentile of the operator's own time per pod review and of the API server's time per call; for
every configuration, the CPU milliseconds per managed pod of each process on the machine (etcd, the
API server, the creators, the webhook), over the batch and its deletion: where the two cores go.

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
from pathlib import Path
from typing import Any

from operator_fleet import cpu_seconds, create, established
from operator_process import NoopWebhookProcess, OperatorProcess, buckets, quantile_bound, total

import fiar_contract as contract
from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for
from fiar_operator import crd, kube, mutation, patches, policy, webhookconfig

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


def pod(i: int, managed: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{i:06d}", "labels": {"app": "vllm" if managed else "web"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai", "command": ["vllm", "serve", "m"]}]},
    }


def batch(
    client: kube.Kube, managed: bool, count: int, creators: int, start: int, rate: float | None = None
) -> tuple[list[float], float, int]:
    """CREATE round trips (ms), seconds for the batch, and the pods created without fiar's policy
    label (a managed pod whose review timed out or failed: created as sent).

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
        labelled = contract.LABEL_POD_POLICY in (created["metadata"].get("labels") or {})
        return (time.perf_counter() - due) * 1000, labelled

    with concurrent.futures.ThreadPoolExecutor(creators) as pool:
        done = list(pool.map(one, range(start, start + count)))
    elapsed = time.perf_counter() - began
    client.call("DELETE", path, {"gracePeriodSeconds": 0}, timeout=60.0)
    wait_for(lambda: not client.call("GET", path, {"limit": 1})["items"], 60, "pods deleted")
    return [t for t, _ in done], elapsed, sum(not labelled for _, labelled in done)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="source tree of the operator to compare with")
    parser.add_argument("--pods", type=int, default=300, help="pods per batch")
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
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fiar-create-"))
    print(f"# {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}; work in {workdir}")
    print(
        f"# {args.pods} pods per batch, {args.creators} creators, {args.rounds} rounds, pinned: {args.pin}, "
        f"rate: {args.rate or 'closed loop'}"
    )
    plane = ControlPlane(workdir / "plane", Tier.A)
    plane.start()
    if args.pin:
        for component in plane.components.values():
            subprocess.run(["taskset", "-a", "-p", "-c", "0", str(component.pid)], check=True, capture_output=True)
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
        spec = {
            "podSelector": {"matchLabels": {"app": "vllm"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MANAGED_NS}},
        }
        body = {"apiVersion": "fiar.io/v1alpha1", "kind": "FiAllreducePolicy", "metadata": {"name": "bench"}}
        create(client, kube.POLICIES, {**body, "spec": spec})
        variants: list[tuple[str, Path | None]] = [("after", None)]
        if args.before is not None:
            variants.insert(0, ("before", args.before))
        kinds = ("operator", "fiar", "fiar2s", "frozen")
        configurations = ["without"] + [f"{c}:{v}" for c in kinds for v, _ in variants if c != "fiar2s"]
        if args.only:
            configurations = list(args.only)  # in the order given
        api = plane.api_client()
        means: dict[tuple[str, str], list[float]] = {}
        """(configuration, measure) -> per managed batch: mean time per review in the operator and per
        call in the API server (ms), and the operator's CPU per managed pod (ms, its watch included)."""
        shares: dict[tuple[str, str], list[float]] = {}
        """(configuration, process) -> per managed batch: CPU ms per pod of each process (the
        control plane's, this benchmark's creators, the webhook's): where the machine's two cores go."""
        unlabelled: dict[tuple[str, str], int] = {}
        """(configuration, kind) -> managed pods created without fiar's label."""
        handler: dict[str, list[tuple[float, float]]] = {}
        """Configuration -> (p99 bucket bound of the pod webhook, s; reviews) per managed batch: the
        operator's own time per review, and the API server's time per call."""
        counter = args.pods * 2
        for managed in (False, True):  # warm-up, not counted
            batch(client, managed, args.pods, args.creators, 0 if managed else args.pods)
        for _ in range(args.rounds):
            for configuration in configurations:
                kind, _, variant = configuration.partition(":")
                source = dict(variants).get(variant)
                running: OperatorProcess | None = None
                if kind == "noop":
                    running = start_noop(plane, workdir, pin=args.pin)
                elif kind in ("patch", "label"):
                    patch = fiar_patch(body, spec, label_only=kind == "label")
                    running = start_noop(plane, workdir, pin=args.pin, patch=patch)
                elif kind != "without":
                    running = start_operator(plane, source, workdir, narrow=variant == "after", pin=args.pin)
                    time.sleep(3)
                try:
                    if kind in ("fiar", "fiar2s", "frozen", *NOOPS):
                        assert running is not None
                        register(client, plane, running.port, 2 if kind == "fiar2s" else webhookconfig.TIMEOUT_SECONDS)
                        if variant == "after":
                            wait_for(
                                lambda: (
                                    "matchConditions"
                                    in client.call("GET", f"{kube.MUTATING_CONFIGS}/{CONFIG}")["webhooks"][0]
                                ),
                                30,
                                "conditions set",
                            )
                            time.sleep(2)
                    if kind == "frozen":
                        assert running is not None
                        running.freeze()
                    for managed in (False, True):
                        label = "managed" if managed else "unmanaged"
                        spent_before = process_cpu(plane, running)
                        server_text = apiserver_metrics(api)
                        seen = buckets(server_text, WEBHOOK_SECONDS, name=webhookconfig.POD_HOOK)
                        seen_total = total(server_text, WEBHOOK_SECONDS, name=webhookconfig.POD_HOOK)
                        own_text = running.metrics() if kind.startswith("fiar") and running is not None else ""
                        mine, mine_total = (
                            buckets(own_text, HANDLER, webhook="pods"),
                            total(own_text, HANDLER, webhook="pods"),
                        )
                        times, elapsed, bare = batch(client, managed, args.pods, args.creators, counter, args.rate)
                        if managed and kind != "frozen":
                            after = process_cpu(plane, running)
                            for name, seconds in after.items():
                                shares.setdefault((configuration, name), []).append(
                                    (seconds - spent_before[name]) * 1000 / args.pods
                                )
                        key = (configuration, label)
                        unlabelled[key] = unlabelled.get(key, 0) + (bare if managed else 0)
                        if kind.startswith("fiar") and managed:
                            assert running is not None
                            own_text, server_text = running.metrics(), apiserver_metrics(api)
                            own = quantile_bound(buckets(own_text, HANDLER, webhook="pods"), mine, 0.99)
                            now = buckets(server_text, WEBHOOK_SECONDS, name=webhookconfig.POD_HOOK)
                            call = quantile_bound(now, seen, 0.99)
                            handler.setdefault(configuration, []).extend([own, call])
                            for name, (s1, n1), (s0, n0) in (
                                ("operator_mean_ms", total(own_text, HANDLER, webhook="pods"), mine_total),
                                (
                                    "api_server_mean_ms",
                                    total(server_text, WEBHOOK_SECONDS, name=webhookconfig.POD_HOOK),
                                    seen_total,
                                ),
                            ):
                                means.setdefault((configuration, name), []).append(1000 * (s1 - s0) / max(n1 - n0, 1))
                            webhook_cpu = shares[(configuration, "webhook")][-1]
                            means.setdefault((configuration, "operator_cpu_ms_per_managed_pod"), []).append(webhook_cpu)
                        counter += args.pods
                        results.setdefault((configuration, label), []).extend(times)
                        rates.setdefault((configuration, label), []).append(args.pods / elapsed)
                        if kind == "operator" and running is not None:
                            time.sleep(1)  # the DELETED events reach the operator
                            spent = cpu_seconds(running.process.pid) - spent_before["webhook"]
                            cpu.setdefault(variant, []).append(spent * 1000 / (2 * args.pods))
                finally:
                    if running is not None:
                        running.stop()
                    if kind in ("fiar", "fiar2s", "frozen", *NOOPS):
                        client.delete(kube.MUTATING_CONFIGS, CONFIG)
                        time.sleep(2)
        base = {label: p(results[("without", label)], 99) for label in ("unmanaged", "managed")}
        for (configuration, label), times in sorted(results.items()):
            row = {
                "configuration": configuration,
                "pods": label,
                "p50_ms": round(p(times, 50), 1),
                "p99_ms": round(p(times, 99), 1),
                "p99_ratio": round(p(times, 99) / base[label], 2),
                "pods_per_s": round(statistics.mean(rates[(configuration, label)]), 1),
                "unlabelled": unlabelled.get((configuration, label), 0),
            }
            print(json.dumps(row))
        for configuration, bounds in handler.items():
            own, call = bounds[0::2], bounds[1::2]
            print(
                json.dumps(
                    {
                        "pod_webhook_p99_le_s": configuration,
                        "operator_handler": [b for b, _ in own],
                        "api_server_call": [b for b, _ in call],
                        "reviews": [n for _, n in own],
                        "calls": [n for _, n in call],
                    }
                )
            )
        for (configuration, name), values in sorted(means.items()):
            print(json.dumps({"managed_batches": configuration, name: [round(v, 2) for v in values]}))
        for (configuration, name), values in sorted(shares.items()):
            print(json.dumps({"cpu_ms_per_managed_pod": configuration, name: [round(v, 2) for v in values]}))
        for variant, values in cpu.items():
            print(json.dumps({"operator_cpu_ms_per_pod_event": variant, "mean": round(statistics.mean(values), 3)}))
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
