"""Kyverno's admission controller on the local control plane, out of cluster: the peer fiar is compared with.

The binary is built from the pinned wrapper module ``tools/controlplane/kyverno``
(``PYTHONPATH=tools .venv/bin/python -m devcluster build kyverno``, cached in ~/.cache/fiar). Its CRDs
and its ConfigMap come from the same pinned module source (``config/crds``, and the Helm chart's
default ``config`` values), so they match the binary. ``install`` puts them on a plane; a
``KyvernoProcess`` runs ``kyverno`` with ``--kubeconfig`` and ``--serverIP`` (Kyverno's out-of-cluster
mode): it makes its own CA and serving pair (Secrets in its namespace), and registers its own webhook
configurations for the policies, pointing at https://127.0.0.1:<port>.

The policies are fiar's reading of Kyverno's samples (bench/kyverno/README.md): ``policies``
loads them with the pods and namespaces to select.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from operator_process import OperatorProcess

from devcluster import build
from devcluster.cluster import free_port
from devcluster.waiting import wait_for
from fiar_operator.core.errors import Conflict, NotFound
from fiar_operator.state import kube

NAMESPACE = "kyverno"
POLICY_DIR = Path(__file__).with_name("kyverno")
POLICY_FILES = ("backend-env.yaml", "backend-binding.yaml")
CA_SECRET = "kyverno-svc.kyverno.svc.kyverno-tls-ca"
TLS_SECRET = "kyverno-svc.kyverno.svc.kyverno-tls-pair"
"""The Secrets of Kyverno's own CA and serving pair, named as its Helm chart names them."""
RESOURCE_MUTATING = "kyverno-resource-mutating-webhook-cfg"
CLUSTER_POLICIES = "/apis/kyverno.io/v1/clusterpolicies"
VALIDATING_CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
BINDING_FILTERS = ("[Binding,*,*]", "[Pod/binding,*,*]")
"""The chart's resourceFilters that keep Kyverno from seeing Bindings: removed, as the sample
other/mutate-pod-binding asks."""


def binary() -> Path:
    path = build.binary_path("kyverno")
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run 'PYTHONPATH=tools .venv/bin/python -m devcluster build kyverno'")
    return path


@cache
def module_dir() -> Path:
    """The pinned Kyverno module's source in the Go module cache (downloaded if missing)."""
    env = dict(os.environ, GOTOOLCHAIN="local", GOWORK="off", GOFLAGS="-mod=readonly")
    proc = subprocess.run(
        ["go", "mod", "download", "-json", "github.com/kyverno/kyverno"],
        cwd=build.MODULES_DIR / "kyverno",
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(json.loads(proc.stdout)["Dir"])


def crds() -> list[dict[str, Any]]:
    """Every CustomResourceDefinition of the pinned release (config/crds)."""
    docs: list[dict[str, Any]] = []
    for path in sorted((module_dir() / "config" / "crds").rglob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "CustomResourceDefinition"]
    return docs


def config_data(chart_config: Mapping[str, Any]) -> dict[str, str]:
    """The ConfigMap data the chart renders from its ``config`` values, less the Binding filters and
    the filters that name the chart's own objects (templated; nothing here has those names)."""
    filters = [f for f in chart_config.get("resourceFilters") or [] if "{{" not in f and f not in BINDING_FILTERS]
    webhooks = copy.deepcopy(dict(chart_config.get("webhooks") or {}))
    expressions = webhooks.setdefault("namespaceSelector", {}).setdefault("matchExpressions", [])
    expressions.append({"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE]})
    return {
        "enableDefaultRegistryMutation": str(chart_config.get("enableDefaultRegistryMutation", True)).lower(),
        "defaultRegistry": str(chart_config.get("defaultRegistry", "docker.io")),
        "generateSuccessEvents": str(chart_config.get("generateSuccessEvents", False)).lower(),
        "excludeGroups": ",".join(chart_config.get("excludeGroups") or []),
        "resourceFilters": "".join(filters),
        "webhooks": json.dumps(webhooks),
    }


def config_map() -> dict[str, Any]:
    values = yaml.safe_load((module_dir() / "charts" / "kyverno" / "values.yaml").read_text())
    return {"metadata": {"name": "kyverno", "namespace": NAMESPACE}, "data": config_data(values["config"])}


def policies(
    pod_labels: Mapping[str, str], namespaces: Sequence[str], backend: str | None = None
) -> list[dict[str, Any]]:
    """The two ClusterPolicies of bench/kyverno, picking pods labelled ``pod_labels`` in ``namespaces``
    at CREATE, and the Bindings of pods in ``namespaces``; ``backend``, a JMESPath over the node, in
    place of the binding rule's copy of its label."""
    out: list[dict[str, Any]] = []
    for name in POLICY_FILES:
        policy = yaml.safe_load((POLICY_DIR / name).read_text())
        for rule in policy["spec"]["rules"]:
            resources = rule["match"]["any"][0]["resources"]
            resources["namespaces"] = list(namespaces)
            if "Pod" in resources["kinds"]:
                resources["selector"] = {"matchLabels": dict(pod_labels)}
            for entry in rule.get("context") or []:
                if backend is not None and "apiCall" in entry:
                    entry["apiCall"]["jmesPath"] = backend
        out.append(policy)
    return out


def install(client: kube.Kube) -> None:
    """Kyverno's namespace, CRDs and ConfigMap (idempotent)."""
    with contextlib.suppress(Conflict):
        client.call("POST", kube.NAMESPACES, body={"metadata": {"name": NAMESPACE}})
    for doc in crds():
        client.apply(kube.CRDS, doc)
    names = [d["metadata"]["name"] for d in crds()]

    def established() -> bool:
        for name in names:
            doc = client.call("GET", f"{kube.CRDS}/{name}")
            conditions = (doc.get("status") or {}).get("conditions") or []
            if not any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                return False
        return True

    wait_for(established, 60, "Kyverno's CRDs established")
    path = f"{kube.NAMESPACES}/{NAMESPACE}/configmaps"
    body = config_map()
    try:
        client.call("POST", path, body=body)
    except Conflict:
        client.call("PUT", f"{path}/kyverno", body=body)


def apply_policies(client: kube.Kube, docs: Sequence[Mapping[str, Any]]) -> None:
    """Create or replace the policies (Kyverno must be running: its webhook validates them), and wait
    until Kyverno reports each Ready."""
    for doc in docs:
        client.apply(CLUSTER_POLICIES, doc)

    def ready() -> bool:
        for doc in docs:
            status = client.call("GET", f"{CLUSTER_POLICIES}/{doc['metadata']['name']}").get("status") or {}
            if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
                return False
        return True

    wait_for(ready, 60, "Kyverno's policies ready")


def registered(client: kube.Kube, resources: Sequence[str]) -> bool:
    """Whether Kyverno's resource webhooks now cover every one of ``resources`` (e.g. pods, pods/binding)."""
    try:
        doc = client.call("GET", f"{kube.MUTATING_CONFIGS}/{RESOURCE_MUTATING}")
    except NotFound:
        return False
    covered = {
        r for w in doc.get("webhooks") or [] for rule in w.get("rules") or [] for r in rule.get("resources") or []
    }
    return all(r in covered for r in resources)


def remove_webhooks(client: kube.Kube) -> None:
    """Delete every webhook configuration Kyverno registered (it leaves them behind when it stops)."""
    for collection in (kube.MUTATING_CONFIGS, VALIDATING_CONFIGS):
        for item in client.call("GET", collection)["items"]:
            if item["metadata"]["name"].startswith("kyverno-"):
                client.delete(collection, item["metadata"]["name"])


class KyvernoProcess(OperatorProcess):
    """``kyverno`` (the admission controller) out of cluster on a loopback port, ready when its
    /health/readiness answers 200 (its certificates are in place)."""

    def __init__(self, kubeconfig: Path, workdir: Path, *, pin_core: int | None = None) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        argv = [
            *(["taskset", "-c", str(pin_core)] if pin_core is not None else []),
            str(binary()),
            f"--kubeconfig={kubeconfig}",
            f"--serverIP=127.0.0.1:{self.port}",
            "--webhookServerHost=127.0.0.1",
            f"--webhookServerPort={self.port}",
            f"--caSecretName={CA_SECRET}",
            f"--tlsSecretName={TLS_SECRET}",
            "--metricsHost=127.0.0.1",
            f"--metricsPort={self.metrics_port}",
            "--controllerRuntimeMetricsAddress=0",
            # fiar's webhook timeout. A policy's webhookTimeoutSeconds can only raise the webhook's
            # timeout above this flag (default 10 s): Kyverno takes the largest.
            "--webhookTimeout=1",
            # No reports controller runs here to consume admission reports.
            "--admissionReports=false",
            "--autoMemLimitEnabled=false",
        ]
        env = {
            **os.environ,
            "KYVERNO_NAMESPACE": NAMESPACE,
            "KYVERNO_POD_NAME": "kyverno-bench",
            "KYVERNO_SERVICEACCOUNT_NAME": "kyverno",
            "KYVERNO_DEPLOYMENT": "kyverno",
            "KYVERNO_SVC": "kyverno-svc",
            "INIT_CONFIG": "kyverno",
            "METRICS_CONFIG": "kyverno-metrics",
        }
        self.log = workdir / f"kyverno-{time.monotonic_ns()}.log"
        with self.log.open("wb") as out:
            self.started = time.monotonic()
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def ready(self) -> bool:
        if self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"kyverno exited {self.process.returncode}:\n{tail}")
        try:
            context = ssl._create_unverified_context()  # its own CA; only health is asked
            url = f"https://127.0.0.1:{self.port}/health/readiness"
            with urllib.request.urlopen(url, timeout=1, context=context) as resp:
                return int(resp.status) == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 180.0) -> float:
        return super().wait_ready(timeout)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return bytes(resp.read()).decode()


def start(
    client: kube.Kube, kubeconfig: Path, workdir: Path, docs: Sequence[Mapping[str, Any]], pin_core: int | None = None
) -> KyvernoProcess:
    """Kyverno ready, ``docs`` applied and its webhooks registered for pods and their bindings."""
    process = KyvernoProcess(kubeconfig, workdir, pin_core=pin_core)
    try:
        process.wait_ready()
        apply_policies(client, docs)
        wait_for(lambda: registered(client, ("pods", "pods/binding")), 120, "Kyverno's webhooks registered")
        time.sleep(2)  # the API server picks configurations up within about a second
    except BaseException:
        process.stop()
        raise
    return process
