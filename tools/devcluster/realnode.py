"""One real kubelet node beside a tier-C control plane (tier D): containerd, runc and a bridge CNI.

Everything the node makes on the host is named after its id and recorded in ``<workdir>/realnode.json``
before it is made, so that ``teardown`` (from the fixture, or from ``devcluster down`` in another
shell) removes exactly that and nothing else:

- containerd with its own root, state, socket and runc root under ``<workdir>/containerd``
  (containerd 1.6 keeps shim sockets in ``/run/containerd/s``, named by a hash of our socket);
- a Linux bridge ``fiar-<id>`` with a /24 pod network routed from the host (the API server reaches
  webhook pods on their pod IP: it runs with ``--enable-aggregator-routing``);
- a nat chain ``FIAR-<id>`` that sends pods' traffic for the ``kubernetes`` Service
  (10.96.0.1:443) to the API server on 127.0.0.1 (there is no kube-proxy), with
  ``route_localnet`` on the bridge only;
- a cgroup ``/fiar-<id>`` in every hierarchy (the kubelet's ``cgroupRoot``);
- network namespaces ``/run/netns/cni-*`` that appeared while the node ran, and every mount under
  the work directory (the kubelet bind-mounts its root dir; volumes are tmpfs);
- the kubelet's device-plugin socket, at a fixed path whatever its root dir
  (``/var/lib/kubelet/device-plugins``), with its folders when they were not there before.

Facts of the machines this runs on: the node IP must not be a loopback address (the host's
interface address is used); without CAP_SYS_RESOURCE runc cannot lower oom_score_adj, so the CRI
config sets ``restrict_oom_score_adj``; cgroup v1 needs ``failCgroupV1: false``; images are imported
from OCI archives and never garbage-collected (there is no registry to pull them from again).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from devcluster import binfmt, build, images
from devcluster.cluster import Component, ControlPlaneError, free_port

if TYPE_CHECKING:
    from devcluster.cluster import ControlPlane

KUBERNETES_SERVICE_IP = "10.96.0.1"
"""The ``kubernetes`` Service's ClusterIP (the first address of ``--service-cluster-ip-range``)."""

CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_CACHE = Path("/var/lib/cni/results")
KUBELET_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
"""Where every kubelet serves its device-plugin socket, whatever its --root-dir."""
CNI_PLUGINS = ("bridge", "host-local", "loopback")
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "ip", "umount")
STATE_FILE = "realnode.json"


def unavailable_reason() -> str | None:
    """Why a real node cannot run on this host (None when it can): the text tier-D tests skip with."""
    if not sys.platform.startswith("linux"):
        return f"tier D needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "tier D needs root (containerd, mounts, cgroups, a bridge); run the suite as root"
    missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
    missing += [f"{CNI_BIN_DIR}/{p}" for p in CNI_PLUGINS if not (CNI_BIN_DIR / p).is_file()]
    missing += [t for t in images.missing_tools() if t not in missing]
    if missing:
        return (
            f"tier D needs {', '.join(missing)}: apt-get install containerd runc containernetworking-plugins "
            "iptables buildah mmdebstrap arch-test qemu-user-static (make realnode-deps does it as root)"
        )
    for arch in images.ARCHITECTURES:
        foreign = binfmt.unavailable_reason(arch)
        if foreign:
            return f"tier D builds and runs {arch} images: {foreign} (make realnode-deps installs it as root)"
    if host_ip() is None:
        return "tier D needs a non-loopback IPv4 address for the node (the kubelet rejects loopback node IPs)"
    return None


def build_cli() -> int:
    """``devcluster build --realnode``: the images of tier D, or why tier D cannot run here."""
    reason = unavailable_reason()
    if reason:
        print(f"tier D cannot run here, its tests will skip: {reason}")
        return 0
    return images_cli()


def images_cli() -> int:
    """``devcluster build --images``: every image (each multi-architecture one for all its architectures)."""
    start = time.monotonic()
    for name, image in images.build_images().items():
        took = "cached" if image.build_seconds is None else f"built in {image.build_seconds:.0f}s"
        arches = ",".join(image.architectures) or binfmt.host_arch()
        print(f"{name:13s} {image.ref:48s} {arches:12s} {image.size_bytes / 1e6:6.0f} MB  {took}")
    print(f"images ready in {time.monotonic() - start:.0f}s (cache: {images.cache_dir()})")
    return 0


def agent_image_cli(architectures: tuple[str, ...] | None) -> int:
    """``devcluster build --agent-image``: the real agent image, and its probe run inside it on this host."""
    image, checks = images.build_agent_image(architectures=architectures)
    took = "cached" if image.build_seconds is None else f"built in {image.build_seconds:.0f}s"
    arches = ",".join(image.architectures)
    print(f"agent {image.ref} {arches} {image.size_bytes / 1e6:.0f} MB (archive, gzip layers) {took}")
    for check in checks:
        print(f"agent ({check.arch}): {check.unpacked_bytes / 1e9:.2f} GB unpacked; {check.summary()}")
    return 0


def host_ip() -> str | None:
    """The address of the interface the default route leaves by (else the first global address)."""
    proc = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    route = subprocess.run(["ip", "-4", "route", "show", "default"], capture_output=True, text=True).stdout.split()
    default_dev = route[route.index("dev") + 1] if "dev" in route else None
    found: list[tuple[bool, str]] = []
    for line in proc.stdout.splitlines():
        words = line.split()
        dev, addr = words[1], words[3].split("/")[0]
        if dev.startswith("fiar-") or ipaddress.ip_address(addr).is_loopback:
            continue
        found.append((dev != default_dev, addr))
    return min(found)[1] if found else None


def _mountinfo() -> list[str]:
    """Mount points of this mount namespace, in mount order (octal escapes decoded)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        raw = line.split()[4]
        points.append(raw.encode().decode("unicode_escape"))
    return points


def _cgroup_mounts() -> list[Path]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split()[0] in ("cgroup", "cgroup2"):
            out.append(Path(left.split()[4]))
    return out


def _free_subnet() -> ipaddress.IPv4Network:
    routes = subprocess.run(["ip", "-4", "route", "show"], capture_output=True, text=True, check=True).stdout
    used = []
    for line in routes.splitlines():
        with contextlib.suppress(ValueError):
            used.append(ipaddress.ip_network(line.split()[0], strict=False))
    for third in range(100, 250):
        net = ipaddress.IPv4Network(f"10.89.{third}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise ControlPlaneError("no free /24 in 10.89.100.0-10.89.249.0 for the pod network")


@dataclass
class NodeState:
    """What the node made on the host; written before each thing is made."""

    workdir: str
    node_id: str
    node_name: str
    bridge: str
    chain: str
    subnet: str
    cgroup_root: str
    netns_before: list[str] = field(default_factory=list)
    run_containerd_existed: bool = True
    run_netns_existed: bool = True
    var_lib_cni_existed: bool = True
    var_lib_kubelet_existed: bool = True
    iptables_rule: list[str] = field(default_factory=list)

    def save(self) -> None:
        (Path(self.workdir) / STATE_FILE).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, workdir: Path) -> NodeState | None:
        path = workdir / STATE_FILE
        if not path.is_file():
            return None
        return cls(**json.loads(path.read_text()))

    @property
    def containerd_dir(self) -> Path:
        return Path(self.workdir) / "containerd"

    @property
    def socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"


class RealNode:
    """The real node of a tier-D plane: call ``start`` after the plane is up, ``stop`` before it stops."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.dir = plane.workdir / "realnode"
        node_id = uuid.uuid4().hex[:6]
        self.state = NodeState(
            workdir=str(self.dir),
            node_id=node_id,
            node_name=f"realnode-{node_id}",
            bridge=f"fiar-{node_id}",
            chain=f"FIAR-{node_id.upper()}",
            subnet="",
            cgroup_root=f"/fiar-{node_id}",
        )
        self.ip = host_ip() or ""
        self.images: dict[str, images.Image] = {}
        self.timings: dict[str, float] = {}

    @property
    def name(self) -> str:
        return self.state.node_name

    def ctr(self, *args: str, timeout: float = 300) -> str:
        argv = ["ctr", "--address", str(self.state.socket), "--namespace", "k8s.io", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise ControlPlaneError(f"ctr {' '.join(args[:3])} exited {proc.returncode}: {proc.stderr[-2000:]}")
        return proc.stdout

    def import_platform(self, name: str, arch: str) -> str:
        """Import ``arch``'s image of the multi-architecture image ``name`` under its own tag; return the ref.

        containerd resolves an index to this host's architecture; a pod that should run the ``arch``
        image on this node (under qemu, ``devcluster/binfmt.py``) names this single-manifest tag.
        """
        image = self.images[name]
        ref = f"{image.ref}-{arch}"
        binfmt.ensure(arch)
        archive = images.platform_archive(image.archive, arch, ref, self.dir / f"{name}-{arch}.tar")
        try:
            self.ctr("images", "import", str(archive), timeout=600)
        finally:
            archive.unlink(missing_ok=True)
        return ref

    # -- start ----------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> None:
        reason = unavailable_reason()
        if reason:
            raise ControlPlaneError(reason)
        t0 = time.monotonic()
        self.images = images.build_images()
        self.timings["images"] = time.monotonic() - t0
        self.dir.mkdir(parents=True, exist_ok=True)
        st = self.state
        st.subnet = str(_free_subnet())
        st.netns_before = sorted(os.listdir("/run/netns")) if Path("/run/netns").is_dir() else []
        st.run_containerd_existed = Path("/run/containerd").exists()
        st.run_netns_existed = Path("/run/netns").exists()
        st.var_lib_cni_existed = CNI_CACHE.parent.exists()
        st.var_lib_kubelet_existed = KUBELET_DEVICE_PLUGINS.parent.exists()
        st.save()
        self._network()
        self._cgroups()
        t1 = time.monotonic()
        self._containerd(timeout)
        for image in self.images.values():
            self.ctr("images", "import", str(image.archive), timeout=600)
        self.timings["containerd+import"] = time.monotonic() - t1
        t2 = time.monotonic()
        self._kubelet(timeout)
        self.timings["kubelet ready"] = time.monotonic() - t2

    def _network(self) -> None:
        st = self.state
        net = ipaddress.ip_network(st.subnet)
        gateway = f"{net.network_address + 1}/{net.prefixlen}"
        _sh("ip", "link", "add", st.bridge, "type", "bridge")
        _sh("ip", "addr", "add", gateway, "dev", st.bridge)
        _sh("ip", "link", "set", st.bridge, "up")
        Path(f"/proc/sys/net/ipv4/conf/{st.bridge}/route_localnet").write_text("1")
        _sh("iptables", "-w", "-t", "nat", "-N", st.chain)
        port = str(self.plane.apiserver_port)
        _sh(
            "iptables", "-w", "-t", "nat", "-A", st.chain, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp",
            "--dport", "443", "-j", "DNAT", "--to-destination", f"127.0.0.1:{port}",
        )  # fmt: skip
        st.iptables_rule = ["PREROUTING", "-i", st.bridge, "-j", st.chain]
        st.save()
        _sh("iptables", "-w", "-t", "nat", "-A", *st.iptables_rule)
        cni_dir = self.dir / "cni"
        cni_dir.mkdir(exist_ok=True)
        conf = {
            "cniVersion": "0.4.0",
            "name": st.bridge,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": st.bridge,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": st.subnet, "gateway": str(net.network_address + 1)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(cni_dir / "ipam"),
                    },
                }
            ],
        }
        (cni_dir / "10-fiar.conflist").write_text(json.dumps(conf, indent=1))

    def _cgroups(self) -> None:
        for mount in _cgroup_mounts():
            (mount / self.state.cgroup_root.lstrip("/")).mkdir(exist_ok=True)

    def _containerd(self, timeout: float) -> None:
        d = self.state.containerd_dir
        d.mkdir(exist_ok=True)
        metrics_port = free_port()
        config = f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
[grpc]
  address = "{self.state.socket}"
[ttrpc]
  address = "{self.state.socket}.ttrpc"
[metrics]
  address = "127.0.0.1:{metrics_port}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images["pause"].ref}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d / "state" / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.dir / "cni"}"
    max_conf_num = 1
"""
        (d / "config.toml").write_text(config)
        comp = Component(
            "containerd",
            ["containerd", "--config", str(d / "config.toml")],
            self.plane.log_dir / "containerd.log",
            f"http://127.0.0.1:{metrics_port}/v1/metrics",
        )
        self.plane.components["containerd"] = comp
        comp.start()
        self.plane._write_state()
        comp.wait_ready(timeout)

    def _kubelet(self, timeout: float) -> None:
        plane, st = self.plane, self.state
        assert plane.ca is not None
        pki = self.dir / "pki"
        pki.mkdir(exist_ok=True)
        serving_crt, serving_key = plane.ca.issue(st.node_name, hosts=(self.ip, st.node_name)).write(pki, "serving")
        kubeconfig = plane.write_kubeconfig(
            self.dir / "kubelet.kubeconfig", f"system:node:{st.node_name}", groups=("system:nodes",)
        )
        # The plane authorizes with RBAC alone (no Node authorizer): bind the node's own user.
        from kubernetes import client

        with plane.api_client() as api:
            client.RbacAuthorizationV1Api(api).create_cluster_role_binding(
                {
                    "metadata": {"name": f"fiar-{st.node_name}"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
                    "subjects": [
                        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": f"system:node:{st.node_name}"}
                    ],
                }
            )
        port, healthz = free_port(), free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{st.socket}",
            "imageServiceEndpoint": f"unix://{st.socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": st.cgroup_root,
            "failSwapOn": False,
            "failCgroupV1": False,
            "address": self.ip,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "tlsCertFile": str(serving_crt),
            "tlsPrivateKeyFile": str(serving_key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(plane.ca_file)},
            },
            "authorization": {"mode": "AlwaysAllow"},  # only clients with a certificate of the plane's CA
            "podLogsDir": str(self.dir / "pod-logs"),
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "makeIPTablesUtilChains": False,
            "resolvConf": "/etc/resolv.conf",
            "maxPods": 40,
            "serializeImagePulls": False,
            "nodeStatusReportFrequency": "10s",
            "shutdownGracePeriod": "0s",
        }
        (self.dir / "kubelet-config.yaml").write_text(yaml.safe_dump(config))
        comp = Component(
            "kubelet",
            [
                str(build.binary_path("kubelet")),
                f"--config={self.dir / 'kubelet-config.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={self.dir / 'kubelet'}",
                f"--cert-dir={pki}",
                f"--hostname-override={st.node_name}",
                f"--node-ip={self.ip}",
                "--node-labels=fiar.io/real-node=true",
                "--v=1",
            ],
            plane.log_dir / "kubelet.log",
            f"http://127.0.0.1:{healthz}/healthz",
        )
        plane.components["kubelet"] = comp
        comp.start()
        plane._write_state()
        comp.wait_ready(timeout)
        self._wait_node_ready(timeout)

    def _wait_node_ready(self, timeout: float) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        deadline = time.monotonic() + timeout
        with self.plane.api_client() as api:
            core = client.CoreV1Api(api)
            while time.monotonic() < deadline:
                try:
                    node = core.read_node(self.name)
                    conds = {c.type: c.status for c in node.status.conditions or []}
                    if conds.get("Ready") == "True":
                        return
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                time.sleep(0.2)
        raise ControlPlaneError(f"node {self.name} not Ready after {timeout:.0f}s:\n{self.plane.logs(30)}")

    # -- stop -----------------------------------------------------------------------------------
    def drain(self, timeout: float = 60.0) -> None:
        """Taint the node NoExecute and delete its pods, so that the kubelet tears every sandbox down."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        with self.plane.api_client() as api:
            core = client.CoreV1Api(api)
            try:
                core.patch_node(
                    self.name,
                    {"spec": {"taints": [{"key": "fiar.io/teardown", "effect": "NoExecute"}], "unschedulable": True}},
                )
            except ApiException:
                return
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.name}").items
                if not pods:
                    return
                for pod in pods:
                    if pod.metadata.deletion_timestamp is None:
                        with contextlib.suppress(ApiException):
                            core.delete_namespaced_pod(
                                pod.metadata.name, pod.metadata.namespace, grace_period_seconds=1
                            )
                time.sleep(0.5)

    def stop(self) -> None:
        if self.plane.components.get("kubelet") is not None and self.plane.components["kubelet"].alive():
            with contextlib.suppress(Exception):
                self.drain()
        for name in ("kubelet", "containerd"):
            comp = self.plane.components.get(name)
            if comp is not None:
                comp.stop()
        teardown(self.dir)


def teardown(node_dir: Path) -> list[str]:
    """Remove everything a real node recorded in ``node_dir``; return what could not be removed."""
    st = NodeState.load(node_dir)
    if st is None:
        return []
    shim_sockets = _shim_sockets(st)
    cni_cache = _cni_cache_files(st)
    _kill_leftovers(st)
    _unmount_under(st)
    for sock in shim_sockets:
        sock.unlink(missing_ok=True)
    # The images unpacked for this node (hundreds of MB) go with it; the logs stay.
    for part in ("root", "state", "opt"):
        shutil.rmtree(st.containerd_dir / part, ignore_errors=True)
    for mount in _cgroup_mounts():
        root = mount / st.cgroup_root.lstrip("/")
        if root.is_dir():
            for sub in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
    _quiet("ip", "link", "del", st.bridge)
    if st.iptables_rule:
        _quiet("iptables", "-w", "-t", "nat", "-D", *st.iptables_rule)
    _quiet("iptables", "-w", "-t", "nat", "-F", st.chain)
    _quiet("iptables", "-w", "-t", "nat", "-X", st.chain)
    for f in cni_cache:
        f.unlink(missing_ok=True)
    if not st.var_lib_kubelet_existed:
        (KUBELET_DEVICE_PLUGINS / "kubelet.sock").unlink(missing_ok=True)
    for path, existed in (
        (Path("/run/containerd/s"), st.run_containerd_existed),
        (Path("/run/containerd"), st.run_containerd_existed),
        (Path("/run/netns"), st.run_netns_existed),
        (CNI_CACHE, st.var_lib_cni_existed),
        (CNI_CACHE.parent, st.var_lib_cni_existed),
        (KUBELET_DEVICE_PLUGINS, st.var_lib_kubelet_existed),
        (KUBELET_DEVICE_PLUGINS.parent, st.var_lib_kubelet_existed),
    ):
        if not existed:
            with contextlib.suppress(OSError):
                path.rmdir()
    left = leftovers(st)
    if not left:
        (node_dir / STATE_FILE).unlink(missing_ok=True)
    return left


def _cni_cache_files(st: NodeState) -> list[Path]:
    """libcni's result cache of our network and of each of our sandboxes' loopback."""
    if not CNI_CACHE.is_dir():
        return []
    out = list(CNI_CACHE.glob(f"{st.bridge}-*"))
    for top in ("root", "state"):
        sandboxes = st.containerd_dir / top / "io.containerd.grpc.v1.cri" / "sandboxes"
        if sandboxes.is_dir():
            out += [CNI_CACHE / f"cni-loopback-{s.name}-lo" for s in sandboxes.iterdir()]
    return out


def _shim_sockets(st: NodeState) -> list[Path]:
    """containerd 1.6 names a shim's socket /run/containerd/s/sha256(<our socket>/<namespace>/<id>)."""
    tasks = st.containerd_dir / "state" / "io.containerd.runtime.v2.task"
    out = []
    if tasks.is_dir():
        for ns in tasks.iterdir():
            for task in ns.iterdir() if ns.is_dir() else ():
                digest = hashlib.sha256(f"{st.socket}/{ns.name}/{task.name}".encode()).hexdigest()
                out.append(Path("/run/containerd/s") / digest)
    return out


def _our_processes(st: NodeState) -> list[int]:
    """Shims of our containerd and every process in our cgroups."""
    pids: set[int] = set()
    sock = str(st.socket).encode()
    # containerd and the kubelet by their own config files, the shims by our socket.
    owned = (
        b"--config=" + str(Path(st.workdir) / "kubelet-config.yaml").encode(),
        str(st.containerd_dir / "config.toml").encode(),
    )
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if sock in cmdline or any(own in cmdline for own in owned):
            pids.add(int(proc.name))
    for mount in _cgroup_mounts():
        root = mount / st.cgroup_root.lstrip("/")
        if root.is_dir():
            for procs in root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in procs.read_text().split())
    pids.discard(os.getpid())
    return sorted(pids)


def _kill_leftovers(st: NodeState) -> None:
    for _ in range(50):
        pids = _our_processes(st)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _ours(point: str, st: NodeState) -> bool:
    workdir = st.workdir.rstrip("/")
    if point == workdir or point.startswith(workdir + "/"):
        return True
    netns = Path(point)
    return netns.parent == Path("/run/netns") and netns.name.startswith("cni-") and netns.name not in st.netns_before


def _unmount_under(st: NodeState) -> None:
    for point in reversed(_mountinfo()):
        if _ours(point, st):
            _quiet("umount", "--lazy", point)
    if Path("/run/netns").is_dir():
        for entry in Path("/run/netns").iterdir():
            if entry.name.startswith("cni-") and entry.name not in st.netns_before:
                with contextlib.suppress(OSError):
                    entry.unlink()


def leftovers(st: NodeState) -> list[str]:
    """Whatever the node made that is still there (empty after a clean teardown)."""
    left = [f"process {pid}" for pid in _our_processes(st)]
    left += [f"mount {p}" for p in _mountinfo() if _ours(p, st)]
    for mount in _cgroup_mounts():
        if (mount / st.cgroup_root.lstrip("/")).exists():
            left.append(f"cgroup {mount / st.cgroup_root.lstrip('/')}")
    if Path(f"/sys/class/net/{st.bridge}").exists():
        left.append(f"bridge {st.bridge}")
    if subprocess.run(["iptables", "-w", "-t", "nat", "-S", st.chain], capture_output=True).returncode == 0:
        left.append(f"iptables chain nat/{st.chain}")
    if Path("/run/netns").is_dir():
        left += [f"netns {e}" for e in os.listdir("/run/netns") if e.startswith("cni-") and e not in st.netns_before]
    left += [f"CNI cache {f}" for f in CNI_CACHE.glob(f"{st.bridge}-*")] if CNI_CACHE.is_dir() else []
    if not st.var_lib_kubelet_existed and KUBELET_DEVICE_PLUGINS.parent.exists():
        left.append(str(KUBELET_DEVICE_PLUGINS.parent))
    return left


def _sh(*argv: str) -> None:
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if proc.returncode != 0:
        raise ControlPlaneError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()}")


def _quiet(*argv: str) -> None:
    subprocess.run(list(argv), capture_output=True)
