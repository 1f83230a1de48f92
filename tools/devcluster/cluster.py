"""Start and stop a real Kubernetes control plane on 127.0.0.1.

Tiers:
    A: etcd + kube-apiserver (secure serving, client-cert auth, RBAC, service-account tokens)
    B: A + kube-controller-manager (garbage collection, namespaces, Deployments, service accounts)
    C: B + kube-scheduler + kwok (fake nodes; scheduled pods reach Running)
    D: C + one real kubelet node (containerd, runc, bridge CNI; ``devcluster.realnode``), with the
       API server set up for pods that run: service-account tokens mounted, webhook Services reached
       on their endpoints' pod IPs, kubelet logs and exec through client certificates

Every process runs in its own process group with its log in ``<workdir>/logs``; readiness is
polled on each component's health endpoint, never guessed with sleeps. ``state.json`` in the
work directory records PIDs and ports so that a plane started from the shell can be stopped from
another shell (``python -m devcluster down``).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from devcluster import build

if TYPE_CHECKING:  # cryptography loads only when a plane starts (GPU hosts run tests without it)
    from devcluster import pki, realnode


MARKER = ".fiar-devcluster"
"""A file in every work directory a plane ran in: only such a directory is ever deleted."""


class Tier(enum.IntEnum):
    A = 1
    B = 2
    C = 3
    D = 4


class ControlPlaneError(RuntimeError):
    """A component did not start or did not become ready; the message carries its log tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    health_url: str
    tls_ca: Path | None = None  # verify health with this CA; None = plain http or unverified https
    pid: int | None = None
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"\n=== start {time.strftime('%H:%M:%S')}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self._popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid = self._popen.pid

    def tail(self, lines: int = 60) -> str:
        return _tail(self.log, lines)

    def alive(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        if self.pid is None:
            return False
        # A PID read back from state.json may have been reused since: it is ours only if it still
        # runs the program we started.
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        # A script runs as "<interpreter> <script> ...": its path is then the second word.
        return self.argv[0].encode() in cmdline[:2]

    def healthy(self) -> bool:
        ctx: ssl.SSLContext | None = None
        if self.health_url.startswith("https") and self.tls_ca is not None:
            ctx = ssl.create_default_context(cafile=str(self.tls_ca))
        elif self.health_url.startswith("https"):
            # Components without a CA here serve self-signed loopback certificates: health only.
            ctx = ssl._create_unverified_context()
        try:
            with urllib.request.urlopen(self.health_url, timeout=2, context=ctx) as resp:
                return int(resp.status) == 200
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ControlPlaneError(f"{self.name} exited during start-up; log tail:\n{_tail(self.log, 40)}")
            if self.healthy():
                return
            time.sleep(0.1)
        raise ControlPlaneError(f"{self.name} not ready after {timeout:.0f}s; log tail:\n{_tail(self.log, 40)}")

    def stop(self, grace: float = 10.0) -> None:
        if self.pid is None:
            return
        if not self.alive():
            self.pid, self._popen = None, None
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.alive():
            if self._popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._popen.wait(timeout=0.1)
            else:
                time.sleep(0.1)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            if self._popen is not None:
                self._popen.wait(timeout=5)
        self.pid = None
        self._popen = None


class ControlPlane:
    """A local control plane of the given tier in ``workdir``.

    Usage::

        with ControlPlane(tmp_path, Tier.C) as plane:
            api = plane.api_client()
            plane.add_node("gpu-a", labels={"fiar.io/backend": "trtllm"})
    """

    def __init__(
        self,
        workdir: Path,
        tier: Tier = Tier.C,
        binaries: Mapping[str, Path] | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.tier = tier
        self._bin = dict(binaries) if binaries else {}
        self.pki_dir = self.workdir / "pki"
        self.log_dir = self.workdir / "logs"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.ca_file = self.pki_dir / "ca.crt"
        self.audit_log = self.log_dir / "audit.log"
        self.components: dict[str, Component] = {}
        self.apiserver_port = 0
        self.ca: pki.CertificateAuthority | None = None
        self.real_node: realnode.RealNode | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def binary(self, name: str) -> str:
        path = self._bin.get(name) or build.binary_path(name)
        if not Path(path).is_file():
            raise ControlPlaneError(
                f"{name} is not built ({path}); run 'python -m devcluster build' (or 'make controlplane')"
            )
        return str(path)

    def start(self, timeout: float = 120.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / MARKER).touch()
        self.pki_dir.mkdir(exist_ok=True)
        self._write_pki()
        try:
            self._define_components()
            for name in self._order():
                comp = self.components[name]
                comp.start()
                comp.wait_ready(timeout)
            self._write_state()
            if self.tier >= Tier.B:
                self._wait_for_default_serviceaccount(timeout)
            if self.tier >= Tier.D:
                from devcluster import realnode

                self.real_node = realnode.RealNode(self)
                self.real_node.start(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.real_node is not None:
            self.real_node.stop()
        elif (self.workdir / "realnode").is_dir():  # attached from another process: host state only
            from devcluster import realnode

            for name in ("kubelet", "containerd"):
                if name in self.components:
                    self.components[name].stop()
            realnode.teardown(self.workdir / "realnode")
        # Programs started beside the plane first, then the plane from the top down.
        core = self._order()
        for name in [n for n in reversed(list(self.components)) if n not in core] + list(reversed(core)):
            comp = self.components.get(name)
            if comp is not None:
                comp.stop()
        state = self.workdir / "state.json"
        if state.exists():
            state.unlink()

    def restart_apiserver(self, downtime: float = 0.0) -> None:
        """Stop kube-apiserver, wait ``downtime`` seconds, start it again on the same port."""
        comp = self.components["kube-apiserver"]
        comp.stop()
        time.sleep(downtime)
        comp.start()
        comp.wait_ready(120)
        self._write_state()

    def start_process(self, name: str, argv: list[str], health_url: str, timeout: float = 120.0) -> Component:
        """Start a program beside the plane (an operator, an agent); ``down`` stops it with the plane."""
        comp = Component(name, argv, self.log_dir / f"{name}.log", health_url)
        self.components[name] = comp
        comp.start()
        self._write_state()
        comp.wait_ready(timeout)
        return comp

    def stop_component(self, name: str) -> None:
        self.components[name].stop()
        self._write_state()

    def start_component(self, name: str, timeout: float = 120.0) -> None:
        comp = self.components[name]
        comp.start()
        comp.wait_ready(timeout)
        self._write_state()

    def logs(self, lines: int = 60) -> str:
        """The tail of every component's log, for test failure reports."""
        parts = []
        for name, comp in self.components.items():
            parts.append(f"----- {name} ({comp.log}) -----\n{_tail(comp.log, lines)}")
        if self.real_node is not None:  # the containers' own logs, while their pods exist
            for log in sorted(self.real_node.dir.glob("pod-logs/*/*/*.log")):
                parts.append(f"----- container {log.parent.parent.name}/{log.parent.name} -----\n{_tail(log, lines)}")
        return "\n".join(parts)

    # -- clients -------------------------------------------------------------------------------
    def api_client(self) -> Any:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        return client.ApiClient(cfg)

    def write_kubeconfig(self, path: Path, user: str, groups: tuple[str, ...] = (), token: str | None = None) -> Path:
        """A kubeconfig for ``user`` (client certificate) or for a bearer ``token``."""
        if token is not None:
            auth: dict[str, str] = {"token": token}
        else:
            assert self.ca is not None
            pair = self.ca.issue(user, organizations=groups, client=True)
            crt, key = pair.write(self.pki_dir, f"user-{user.replace(':', '_')}")
            auth = {"client-certificate": str(crt), "client-key": str(key)}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "fiar-dev", "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}
            ],
            "users": [{"name": user, "user": auth}],
            "contexts": [{"name": "fiar-dev", "context": {"cluster": "fiar-dev", "user": user}}],
            "current-context": "fiar-dev",
        }
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def service_account_token(self, namespace: str, account: str, pod: Any = None, seconds: int = 3600) -> str:
        """A token of ``namespace/account`` from the TokenRequest API; bound to ``pod`` (a V1Pod) when
        given, so that the API server adds the pod's node name to the requests it authenticates."""
        from kubernetes import client

        spec: dict[str, Any] = {"audiences": [self.server], "expirationSeconds": seconds}
        if pod is not None:
            spec["boundObjectRef"] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": pod.metadata.name,
                "uid": pod.metadata.uid,
            }
        with self.api_client() as api:
            request = client.CoreV1Api(api).create_namespaced_service_account_token(account, namespace, {"spec": spec})
        return str(request.status.token)

    def create_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        from kubernetes import client

        with self.api_client() as api:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}})
        return name

    def add_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        capacity: Mapping[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Create a kwok-managed fake Node (tier C) with the given labels, capacity and taints."""
        from kubernetes import client

        cap = {"cpu": "64", "memory": "512Gi", "pods": "110", **(capacity or {})}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                # The labels every kubelet sets on its own node (an x86 node unless ``labels`` says otherwise).
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/os": "linux",
                    "type": "kwok",
                    **(labels or {}),
                },
                "annotations": {"kwok.x-k8s.io/node": "fake", **(annotations or {})},
            },
            "spec": {"taints": taints or []},
            "status": {"capacity": cap, "allocatable": cap},
        }
        with self.api_client() as api:
            created: dict[str, Any] = client.CoreV1Api(api).create_node(body).to_dict()
        return created

    # -- internals -----------------------------------------------------------------------------
    def _order(self) -> list[str]:
        names = ["etcd", "kube-apiserver"]
        if self.tier >= Tier.B:
            names.append("kube-controller-manager")
        if self.tier >= Tier.C:
            names += ["kube-scheduler", "kwok"]
        return names

    def _write_pki(self) -> None:
        from devcluster import pki

        self.ca = pki.CertificateAuthority()
        self.ca_file.write_bytes(self.ca.cert_pem)
        self.ca.pair.write(self.pki_dir, "ca")
        # Pods reach the API server as the `kubernetes` Service (tier D): its ClusterIP and names.
        hosts = ("localhost", "127.0.0.1", "10.96.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
        self.ca.issue("kube-apiserver", hosts=hosts).write(self.pki_dir, "apiserver")
        self.ca.issue("kube-apiserver-kubelet-client", client=True).write(self.pki_dir, "kubelet-client")
        sa = pki.signing_key_pair()
        (self.pki_dir / "sa.pub").write_bytes(sa.cert_pem)
        (self.pki_dir / "sa.key").write_bytes(sa.key_pem)
        (self.pki_dir / "sa.key").chmod(0o600)

    def _define_components(self) -> None:
        etcd_client, etcd_peer = free_port(), free_port()
        self.apiserver_port = self.apiserver_port or free_port()
        p = self.pki_dir
        self.write_kubeconfig(self.kubeconfig, "fiar-admin", groups=("system:masters",))
        comps = [
            Component(
                "etcd",
                [
                    self.binary("etcd"),
                    "--name=default",
                    f"--data-dir={self.workdir / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{etcd_client}",
                    f"--advertise-client-urls=http://127.0.0.1:{etcd_client}",
                    f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                    f"--initial-cluster=default=http://127.0.0.1:{etcd_peer}",
                    "--unsafe-no-fsync=true",
                    "--log-level=warn",
                ],
                self.log_dir / "etcd.log",
                f"http://127.0.0.1:{etcd_client}/health",
            ),
            Component(
                "kube-apiserver",
                [
                    self.binary("kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{etcd_client}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={self.apiserver_port}",
                    f"--tls-cert-file={p / 'apiserver.crt'}",
                    f"--tls-private-key-file={p / 'apiserver.key'}",
                    f"--client-ca-file={p / 'ca.crt'}",
                    "--authorization-mode=RBAC",
                    f"--service-account-issuer=https://127.0.0.1:{self.apiserver_port}",
                    f"--service-account-key-file={p / 'sa.pub'}",
                    f"--service-account-signing-key-file={p / 'sa.key'}",
                    "--service-cluster-ip-range=10.96.0.0/24",
                    "--endpoint-reconciler-type=none",
                    "--allow-privileged=true",
                    *self._apiserver_tier_flags(),
                    "--enable-priority-and-fairness=false",
                    "--max-requests-inflight=0",
                    "--max-mutating-requests-inflight=0",
                    "--v=1",
                ],
                self.log_dir / "kube-apiserver.log",
                f"https://127.0.0.1:{self.apiserver_port}/readyz",
                tls_ca=p / "ca.crt",
            ),
        ]
        if self.tier >= Tier.B:
            port = free_port()
            comps.append(
                Component(
                    "kube-controller-manager",
                    [
                        self.binary("kube-controller-manager"),
                        f"--kubeconfig={self.kubeconfig}",
                        "--leader-elect=false",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={port}",
                        f"--root-ca-file={p / 'ca.crt'}",
                        f"--service-account-private-key-file={p / 'sa.key'}",
                        "--use-service-account-credentials=false",
                        f"--authentication-kubeconfig={self.kubeconfig}",
                        f"--authorization-kubeconfig={self.kubeconfig}",
                        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                        "--concurrent-deployment-syncs=10",
                        "--concurrent-replicaset-syncs=10",
                        "--v=1",
                    ],
                    self.log_dir / "kube-controller-manager.log",
                    f"https://127.0.0.1:{port}/healthz",
                )
            )
        if self.tier >= Tier.C:
            port = free_port()
            comps.append(
                Component(
                    "kube-scheduler",
                    [
                        self.binary("kube-scheduler"),
                        f"--kubeconfig={self.kubeconfig}",
                        "--leader-elect=false",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={port}",
                        f"--authentication-kubeconfig={self.kubeconfig}",
                        f"--authorization-kubeconfig={self.kubeconfig}",
                        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                        "--v=1",
                    ],
                    self.log_dir / "kube-scheduler.log",
                    f"https://127.0.0.1:{port}/healthz",
                )
            )
            port = free_port()
            comps.append(
                Component(
                    "kwok",
                    [
                        self.binary("kwok"),
                        f"--kubeconfig={self.kubeconfig}",
                        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                        f"--config={build.kwok_stages_path()}",
                        f"--server-address=127.0.0.1:{port}",
                        "--node-lease-duration-seconds=40",
                        "--cidr=10.244.0.1/16",
                        "--node-ip=127.0.0.1",
                    ],
                    self.log_dir / "kwok.log",
                    f"http://127.0.0.1:{port}/healthz",
                )
            )
        self.components = {c.name: c for c in comps}

    def _apiserver_tier_flags(self) -> list[str]:
        if self.tier < Tier.D:
            # No pod runs: no service-account token volumes (tests create pods before the
            # controller-manager made the namespace's default ServiceAccount).
            return ["--disable-admission-plugins=ServiceAccount"]
        p = self.pki_dir
        # Pod creations are audited (metadata only), so that Pod Security's audit mode can be read back.
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {"level": "Metadata", "verbs": ["create"], "resources": [{"group": "", "resources": ["pods"]}]},
                {"level": "None"},
            ],
        }
        (p / "audit-policy.yaml").write_text(yaml.safe_dump(policy))
        return [
            f"--audit-policy-file={p / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}",
            # No kube-proxy: webhook Services are reached on an endpoint's pod IP, routed to the bridge.
            "--enable-aggregator-routing=true",
            f"--kubelet-client-certificate={p / 'kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'kubelet-client.key'}",
            f"--kubelet-certificate-authority={p / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP",
        ]

    def _wait_for_default_serviceaccount(self, timeout: float) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        deadline = time.monotonic() + timeout
        with self.api_client() as api:
            core = client.CoreV1Api(api)
            while time.monotonic() < deadline:
                try:
                    core.read_namespaced_service_account("default", "default")
                    return
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                time.sleep(0.2)
        raise ControlPlaneError("the default ServiceAccount never appeared:\n" + self.logs(20))

    def _write_state(self) -> None:
        state = {
            "tier": self.tier.name,
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "components": {
                name: {"pid": c.pid, "argv": c.argv, "log": str(c.log), "health": c.health_url}
                for name, c in self.components.items()
            },
        }
        (self.workdir / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def attach(cls, workdir: Path) -> ControlPlane:
        """Re-open a plane started by another process (from its ``state.json``)."""
        state = json.loads((Path(workdir) / "state.json").read_text())
        plane = cls(Path(workdir), Tier[state["tier"]])
        plane.apiserver_port = int(state["server"].rsplit(":", 1)[1])
        for name, info in state["components"].items():
            plane.components[name] = Component(name, info["argv"], Path(info["log"]), info["health"], pid=info["pid"])
        return plane

    def iter_status(self) -> Iterator[tuple[str, bool]]:
        for name, comp in self.components.items():
            yield name, comp.alive() and comp.healthy()
