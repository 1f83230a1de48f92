"""Fixtures that run the real operator (``fiar-operator run``) against a local control plane.

The operator runs as a subprocess with a serving certificate issued by the plane's CA; tests
register its webhook configuration (url clientConfig + caBundle, failurePolicy Ignore), limited to
namespaces carrying this session's label, and stop the process by its PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import workloads
from devcluster.cluster import ControlPlane, free_port
from devcluster.waiting import wait_for
from fiar_operator import crd
from fiar_operator.core.errors import ApiError
from fiar_operator.reconcile import webhookconfig
from fiar_operator.state import kube

SESSION_LABEL = "fiar-operator-test"


class Operator:
    """A ``fiar-operator run`` process serving webhooks on 127.0.0.1."""

    def __init__(
        self, plane: ControlPlane, workdir: Path, selector_value: str, extra: tuple[str, ...] = ("--standalone",)
    ) -> None:
        assert plane.ca is not None
        self.plane, self.workdir = plane, workdir
        workdir.mkdir(parents=True, exist_ok=True)
        pair = plane.ca.issue("fiar-operator", hosts=("127.0.0.1", "localhost"))
        self.cert, self.key = pair.write(workdir, "serving")
        self.ca_bundle = plane.ca.cert_pem
        self.port, self.metrics_port = free_port(), free_port()
        self.log = workdir / "operator.log"
        self.selector_value = selector_value
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None
        self.kube = kube.Kube(plane.api_client())

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        exe = Path(sys.executable).parent / "fiar-operator"
        argv = [
            str(exe),
            "run",
            "--kubeconfig",
            str(self.plane.kubeconfig),
            *self.extra,
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(self.port),
            "--tls-cert",
            str(self.cert),
            "--tls-key",
            str(self.key),
            "--metrics-host",
            "127.0.0.1",
            "--metrics-port",
            str(self.metrics_port),
            "--status-interval",
            "0.3",
            "--unconfigured-interval",
            "1",
            "--verbose",
        ]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        wait_for(self.ready, 60, "operator /readyz")

    def ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"the operator exited with {self.process.returncode}:\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=1) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        self.process = None

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as resp:
            return str(resp.read().decode())

    def counter(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include ``labels``."""
        total = 0.0
        for line in self.metrics().splitlines():
            if line.startswith((name + "{", name + " ")):
                series, value = line.rsplit(" ", 1)
                if all(f'{k}="{v}"' in series for k, v in labels.items()):
                    total += float(value)
        return total

    def post(self, path: str, body: bytes) -> tuple[int, Any]:
        ctx = ssl.create_default_context(cafile=str(self.plane.ca_file))
        request = urllib.request.Request(
            self.url + path, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:
                return int(resp.status), json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), json.loads(exc.read() or b"null")

    # -- webhook configuration -------------------------------------------------------------------
    def register(self, name: str, policy_webhook: bool = False) -> dict[str, Any]:
        """The pod and binding webhooks; with ``policy_webhook`` the policy webhook too (as the chart
        installs it: policies are cluster-wide, so it is left out where planes are shared)."""
        selector = webhookconfig.namespace_selector(extra={"matchLabels": {SESSION_LABEL: self.selector_value}})
        config = webhookconfig.configuration(self.ca_bundle, url=self.url, name=name, selector=selector)
        self.kube.apply(kube.MUTATING_CONFIGS, config)
        if policy_webhook:
            self.kube.apply(
                kube.VALIDATING_CONFIGS, webhookconfig.policy_configuration(self.ca_bundle, url=self.url, name=name)
            )
        return config

    def unregister(self, name: str) -> None:
        with contextlib.suppress(ApiError):
            self.kube.delete(kube.MUTATING_CONFIGS, name)
        with contextlib.suppress(ApiError):
            self.kube.delete(kube.VALIDATING_CONFIGS, name)

    def wait_active(self, namespace: str) -> None:
        """Wait until the API server calls this operator's pod webhook for ``namespace``."""
        probe = workloads.probe_pod()

        def called() -> bool:
            before = self.counter("fiar_admission_requests_total", webhook="pods")
            self.kube.call("POST", f"/api/v1/namespaces/{namespace}/pods", {"dryRun": "All"}, body=probe)
            return self.counter("fiar_admission_requests_total", webhook="pods") > before

        wait_for(called, 30, "webhook configuration picked up by the API server")


def install_crd(plane: ControlPlane) -> None:
    client = kube.Kube(plane.api_client())
    client.apply(kube.CRDS, crd.definition())

    def established() -> bool:
        doc = client.call("GET", f"{kube.CRDS}/{crd.definition()['metadata']['name']}")
        return any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (doc.get("status") or {}).get("conditions") or []
        )

    wait_for(established, 30, "CRD Established")


@pytest.fixture(scope="session")
def crd_c(plane_c: ControlPlane) -> ControlPlane:
    install_crd(plane_c)
    return plane_c


@pytest.fixture(scope="session")
def operator(crd_c: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """One operator for the session on plane C, its webhooks limited to labelled namespaces."""
    running = Operator(crd_c, tmp_path_factory.mktemp("operator"), uuid.uuid4().hex[:8])
    running.start()
    name = f"fiar-test-{running.selector_value}"
    running.register(name)
    yield running
    running.unregister(name)
    running.stop()


@pytest.fixture
def namespace(operator: Operator, unique: str) -> str:
    """A namespace the session operator's webhooks cover (the API server already calls them)."""
    name = operator.plane.create_namespace(f"op-{unique}", {SESSION_LABEL: operator.selector_value})
    operator.wait_active(name)
    return name


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, Operator):
                report.sections.append(("fiar-operator log", value.tail(80)))


class Kit:
    """Small helpers over the raw API for the tests' objects."""

    def __init__(self, plane: ControlPlane, unique: str) -> None:
        self.plane, self.unique = plane, unique
        self.kube = kube.Kube(plane.api_client())
        self.policies: list[str] = []

    @staticmethod
    def wait(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
        return wait_for(predicate, timeout, what)

    def node(self, name: str, verdict: str | None, **labels: str) -> str:
        full = {f"pool-{self.unique}": "gpu", **workloads.GPU_PRESENT, **labels}
        if verdict is not None:
            full["fiar.io/backend"] = verdict
        self.plane.add_node(name, labels=full)
        return name

    def relabel(self, name: str, labels: dict[str, str | None]) -> None:
        self.kube.call(
            "PATCH", f"{kube.NODES}/{name}", body={"metadata": {"labels": labels}}, content_type=kube.MERGE_PATCH
        )

    def policy(self, name: str, namespace: str, **spec: Any) -> dict[str, Any]:
        """Create a policy limited to ``namespace`` and wait until the operator has observed it."""
        spec.setdefault("podSelector", {"matchLabels": {"app": "vllm"}})
        spec.setdefault("namespaceSelector", {"matchLabels": {"kubernetes.io/metadata.name": namespace}})
        created = self.kube.call("POST", kube.POLICIES, body=workloads.policy(name, **spec))
        self.policies.append(name)
        generation = created["metadata"]["generation"]
        wait_for(
            lambda: (self.get_policy(name).get("status") or {}).get("observedGeneration") == generation,
            30,
            f"policy {name} observed by the operator",
        )
        return created

    def get_policy(self, name: str) -> dict[str, Any]:
        doc: dict[str, Any] = self.kube.call("GET", f"{kube.POLICIES}/{name}")
        return doc

    def pod(
        self,
        namespace: str,
        name: str,
        *containers: dict[str, Any],
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        body = workloads.pod(
            *containers,
            name=name,
            namespace=None,
            labels=labels or {"app": "vllm"},
            annotations=annotations or {},
            **{"nodeSelector": {f"pool-{self.unique}": "gpu"}, **spec},
        )
        created: dict[str, Any] = self.kube.call("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)
        return created

    def pods(self, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        doc = self.kube.call("GET", f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": selector})
        items: list[dict[str, Any]] = doc["items"]
        return items

    def running(
        self, namespace: str, count: int, selector: str | None = None, timeout: float = 60
    ) -> list[dict[str, Any]]:
        def check() -> list[dict[str, Any]] | None:
            pods = [p for p in self.pods(namespace, selector) if (p.get("status") or {}).get("phase") == "Running"]
            return pods if len(pods) >= count else None

        result: list[dict[str, Any]] = wait_for(check, timeout, f"{count} running pods in {namespace}")
        return result

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        doc = self.kube.call(
            "GET", f"/api/v1/namespaces/{namespace}/events", {"fieldSelector": f"involvedObject.name={name}"}
        )
        items: list[dict[str, Any]] = doc["items"]
        return items

    def cleanup(self) -> None:
        for name in self.policies:
            with contextlib.suppress(ApiError):
                self.kube.delete(kube.POLICIES, name)


@pytest.fixture
def kit(crd_c: ControlPlane, unique: str) -> Iterator[Kit]:
    helper = Kit(crd_c, unique)
    yield helper
    helper.cleanup()


@pytest.fixture
def start_operator(tmp_path: Path) -> Iterator[Callable[[ControlPlane, str], Operator]]:
    """Start operators on planes a test owns (CRD installed first); all are stopped afterwards."""
    started: list[Operator] = []

    def start(plane: ControlPlane, label: str, extra: tuple[str, ...] = ("--standalone",)) -> Operator:
        install_crd(plane)
        running = Operator(plane, tmp_path / f"operator-{len(started)}", label, extra)
        started.append(running)
        running.start()
        return running

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def make_kit() -> Iterator[Callable[[ControlPlane, str], Kit]]:
    made: list[Kit] = []

    def make(plane: ControlPlane, unique: str) -> Kit:
        made.append(Kit(plane, unique))
        return made[-1]

    yield make
    for helper in made:
        helper.cleanup()
