"""kubectl fiar on the real control plane, for every node and pod state of the demo and then some.

The demo's own parts run: one ``fiar-agent`` per host fixture (recorded and modelled hosts), the
operator with its webhooks, a policy and one vLLM pod per node, bound by the scheduler. Added: a
GPU node no agent probed, a node an admin labelled by hand whose verdict then changes (its pod runs
a stale backend), nodes with a corrupt or deeply nested probe report, a pod created before the
policy (unconfigured). The plugin runs through the real ``kubectl`` (found on PATH as
``kubectl-fiar``), as the cluster admin and as the chart's operator account: its output is the
same, so it reads nothing more than the operator may.

Golden text where it is stable (ages and times masked): ``FIAR_UPDATE_GOLDEN=1`` rewrites it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

import fiar_contract as contract
from devcluster import build, demo
from devcluster.binaries import helm
from devcluster.cluster import ControlPlane, Tier
from devcluster.waiting import wait_for

pytestmark = pytest.mark.controlplane

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).parent / "golden"
NS = "inference"
VLLM = {"app.kubernetes.io/name": "vllm"}
BIN = Path(sys.executable).parent


def vllm_pod(name: str, node: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {"name": "vllm", "image": "vllm/vllm-openai:latest", "args": ["meta-llama/Llama-3.1-8B-Instruct"]}
        ],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(VLLM)}, "spec": spec}


class Fleet:
    def __init__(self, plane: ControlPlane, tmp: Path) -> None:
        self.plane = plane
        self.tmp = tmp

    def kubectl_fiar(self, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        env.pop("NO_COLOR", None)
        argv = [
            str(build.binary_path("kubectl")),
            "fiar",
            *args,
            "--kubeconfig",
            str(kubeconfig or self.plane.kubeconfig),
        ]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture(scope="module")
def fleet(controlplane_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("kubectl-fiar")
    plane = ControlPlane(tmp / "plane", Tier.C)
    plane.start()
    try:
        _populate(plane)
        yield Fleet(plane, tmp)
    except BaseException:
        print(plane.logs())
        raise
    finally:
        plane.stop()


def _populate(plane: ControlPlane) -> None:
    fixtures = sorted(demo.FIXTURES.glob("*.json"))
    demo.start_operator(plane)
    demo.start_agents(plane, fixtures)
    gpu = {"nvidia.com/gpu.present": "true"}
    taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    plane.add_node("zz-never-probed", labels=gpu, taints=taint)
    hand = {**gpu, contract.LABEL_BACKEND: "trtllm", contract.LABEL_TRTLLM: "pass", contract.LABEL_GPUS: "2"}
    plane.add_node("zz-labelled-by-hand", labels=hand, taints=taint)
    plane.add_node(
        "zz-corrupt-report",
        labels=hand,
        taints=taint,
        annotations={contract.ANNOTATION_PROBE_REPORT: '{"schema": "fiar.io/probe-report", "version'},
    )
    plane.add_node(
        "zz-deep-report",
        labels={**gpu, contract.LABEL_MULTICAST: "yes"},
        taints=taint,
        annotations={contract.ANNOTATION_PROBE_REPORT: "[" * 100_000},
    )
    plane.add_node("cpu-only")
    names = [demo.node_name(f) for f in fixtures]
    with plane.api_client() as api:
        core = client.CoreV1Api(api)
        wait_for(
            lambda: all((core.read_node(n).metadata.labels or {}).get(contract.LABEL_BACKEND) for n in names),
            120,
            "every agent's verdict",
        )
        plane.create_namespace(NS)
        core.create_namespaced_pod(NS, vllm_pod("before-the-policy", "zz-never-probed"))
        policies = client.CustomObjectsApi(api)
        wait_for(lambda: demo._crd_ready(api), 30, "the CRD")
        policies.create_cluster_custom_object(
            contract.GROUP,
            contract.VERSION,
            contract.PLURAL,
            {
                "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
                "kind": contract.KIND,
                "metadata": {"name": "vllm"},
                "spec": {
                    "podSelector": {"matchLabels": VLLM},
                    "backends": list(contract.BACKENDS),
                    "fallbackBackend": "auto",
                },
            },
        )
        probe = vllm_pod("probe", None)
        wait_for(
            lambda: (core.create_namespaced_pod(NS, probe, dry_run="All").metadata.labels or {}).get(
                contract.LABEL_POD_POLICY
            ),
            30,
            "webhooks active",
        )
        for n in [*names, "zz-labelled-by-hand"]:
            core.create_namespaced_pod(NS, vllm_pod(f"vllm-{n}", n))

        def running() -> bool:
            pods = core.list_namespaced_pod(NS).items
            return len(pods) == len(names) + 2 and all(
                p.status.phase == "Running"
                and (p.status.container_statuses or [None])[0] is not None
                and p.status.container_statuses[0].state.running is not None
                for p in pods
            )

        wait_for(running, 90, "the vLLM pods running")
        # The node labelled by hand stops verifying trtllm: the operator re-annotates its running pod,
        # whose container still runs the old value (stale).
        core.patch_node(
            "zz-labelled-by-hand",
            {"metadata": {"labels": {contract.LABEL_BACKEND: "none", contract.LABEL_TRTLLM: "fail"}}},
        )

        def counted() -> bool:
            status = (
                policies.get_cluster_custom_object(contract.GROUP, contract.VERSION, contract.PLURAL, "vllm").get(
                    "status"
                )
                or {}
            )
            pods = status.get("pods") or {}
            return pods.get("stale") == 1 and pods.get("unconfigured") == 1 and pods.get("decided") == 5

        wait_for(counted, 60, "the policy status counting the stale and the unconfigured pod")


TIME = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\b")
AGE = re.compile(r"(?<=\s)\d+[smhd](?=\s)")
SECONDS = re.compile(r"\b\d+\.\d s\b")


def masked(text: str) -> str:
    """Times and ages masked; columns joined by three spaces (an age's width moves the columns)."""
    text = SECONDS.sub("<seconds>", AGE.sub("<age>", TIME.sub("<time>", text)))
    return "\n".join(re.sub(r"(?<=\S) {3,}(?=\S)", "   ", line) for line in text.split("\n"))


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FIAR_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"differs from {path} (FIAR_UPDATE_GOLDEN=1 rewrites it)"


def test_status_groups_the_demo_fleet_by_verdict_with_policies_and_what_needs_attention(fleet: Fleet) -> None:
    result = fleet.kubectl_fiar("status")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout  # not a terminal: no colour, and no forged escape sequence
    golden("status.txt", masked(result.stdout))
    wide = fleet.kubectl_fiar("status", "-o", "wide")
    assert wide.returncode == 0 and "REPORT" in wide.stdout.splitlines()[3]


def test_status_as_json_has_every_node_and_the_policys_counts(fleet: Fleet) -> None:
    result = fleet.kubectl_fiar("status", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert "cpu-only" not in nodes
    assert doc["counts"] == {"mnnvl": 2, "trtllm": 4, "none": 4, "unprobed": 2}
    assert nodes["h200x2-host"]["verdict"] == "trtllm" and nodes["h200x2-host"]["results"] == {
        "mnnvl": "skipped",
        "trtllm": "pass",
    }
    assert (
        nodes["gb200-nvl72-clique"]["clique"].endswith(".32766")
        and nodes["gb200-nvl72-clique"]["model"] == "NVIDIA GB200"
    )
    probed = [n for n in nodes.values() if not n["name"].startswith("zz-")]
    assert all(n["probeAgeSeconds"] is not None for n in probed)
    # every agent wrote the node condition in step with its labels
    expected = {
        "mnnvl": "True (BackendVerified)",
        "trtllm": "True (BackendVerified)",
        "none": "False (NoBackendVerified)",
    }
    assert {n["name"]: n["condition"] for n in probed} == {n["name"]: expected[n["verdict"]] for n in probed}
    assert not any(n["conditionDiffers"] for n in nodes.values())
    assert nodes["zz-deep-report"]["multicast"] == "invalid" and "not JSON" in nodes["zz-deep-report"]["reportProblem"]
    (policy,) = doc["policies"]
    assert policy["pods"] == {
        "decided": 5,
        "fallback": 4,
        "pending": 0,
        "fusionOff": 4,
        "stale": 1,
        "unconfigured": 1,
        "fusionUncontrolled": 0,
        "multicastGuarded": 7,
        "flashinferNotTurnedOff": 4,
        "valuesNotApplied": 0,
        "releaseNotQualified": 0,
    }
    assert doc["stalePods"] == [f"{NS}/vllm-zz-labelled-by-hand"]
    kinds = [(a["kind"], a["subject"]) for a in doc["attention"]]
    assert kinds[:2] == [("stale-pod", f"{NS}/vllm-zz-labelled-by-hand"), ("unconfigured", "policy vllm")]
    assert ("report", "zz-corrupt-report") in kinds and ("unprobed", "zz-never-probed") in kinds
    assert json.loads(fleet.kubectl_fiar("status", "--json", "-n", "elsewhere").stdout)["stalePods"] == []


def test_why_node_says_what_was_read_which_test_ran_and_where_it_failed(fleet: Fleet) -> None:
    result = fleet.kubectl_fiar("why", "h200nvl-bridge-null-multicast")
    assert result.returncode == 0, result.stderr
    golden("why-node-null-multicast.txt", masked(result.stdout))
    for name in ("zz-never-probed", "zz-corrupt-report", "zz-deep-report", "gb200-nvl72-clique", "h200x1-device"):
        out = fleet.kubectl_fiar("why", "node", name)
        assert out.returncode == 0 and "What this means for pods" in out.stdout and "\x1b" not in out.stdout, out.stderr
    doc = json.loads(fleet.kubectl_fiar("why", "h200x2-device", "-o", "json").stdout)
    assert (
        doc["node"]["report"]["tests"][1]["backend"] == "trtllm"
        and round(doc["node"]["report"]["tests"][1]["vsNccl"], 1) == 0.8
    )
    assert [p["name"] for p in doc["pods"]] == ["vllm-h200x2-device"]


def test_why_pod_says_what_it_got_from_which_node_and_policy_and_whether_it_runs_it(fleet: Fleet) -> None:
    result = fleet.kubectl_fiar("why", "pod", f"{NS}/vllm-h200nvl-bridge-null-multicast")
    assert result.returncode == 0, result.stderr
    golden("why-pod-null-multicast.txt", masked(result.stdout))
    stale = fleet.kubectl_fiar("why", "pod", "vllm-zz-labelled-by-hand", "-n", NS)
    assert "still runs with trtllm until it restarts" in stale.stdout, stale.stdout
    unmanaged = fleet.kubectl_fiar("why", "pod", f"{NS}/before-the-policy")
    assert "Not managed by fiar" in unmanaged.stdout
    doc = json.loads(fleet.kubectl_fiar("why", "pod", f"{NS}/vllm-gb200-nvl72-clique", "--json").stdout)
    assert doc["pod"]["backend"] == "mnnvl" and doc["runsItsDecision"] is True and doc["node"]["verdict"] == "mnnvl"


def test_forged_pod_annotations_are_shown_as_text(fleet: Fleet) -> None:
    with fleet.plane.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(
            NS,
            {
                "metadata": {"name": "forged", "labels": {contract.LABEL_POD_POLICY: "ghost"}, "annotations": {}},
                "spec": {"nodeName": "zz-never-probed", "containers": [{"name": "c", "image": "x"}]},
            },
        )
        core.patch_namespaced_pod(
            "forged",
            NS,
            {
                "metadata": {
                    "annotations": {
                        contract.ANNOTATION_POD_DECISION: '{"reason": "\\u001b]0;owned\\u0007", "node": "elsewhere"}',
                        contract.ANNOTATION_POD_BACKEND: "\x1b[2Jmnnvl",
                    },
                    "labels": {contract.LABEL_POD_POLICY: "ghost"},
                }
            },
        )
    try:
        out = fleet.kubectl_fiar("why", "pod", f"{NS}/forged")
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout
        assert "Got:       VLLM_FLASHINFER_ALLREDUCE_BACKEND=invalid" in out.stdout
        assert "fiar.io/decision names node 'elsewhere'" in out.stdout
        status = fleet.kubectl_fiar("status")
        assert status.returncode == 0 and "\x1b" not in status.stdout
        assert f"decision   {NS}/forged   fiar.io/decision names node 'elsewhere'" in masked(status.stdout)
    finally:
        with fleet.plane.api_client() as api:
            client.CoreV1Api(api).delete_namespaced_pod("forged", NS, grace_period_seconds=0)


def test_exit_codes_follow_kubectl(fleet: Fleet, tmp_path: Path) -> None:
    missing = fleet.kubectl_fiar("why", "no-such-node")
    assert missing.returncode == 1 and 'nodes "no-such-node" not found' in missing.stderr
    assert fleet.kubectl_fiar("why").returncode == 2
    assert fleet.kubectl_fiar("status", "-o", "yaml").returncode == 2
    down = tmp_path / "down.kubeconfig"
    doc = yaml.safe_load(fleet.plane.kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    down.write_text(yaml.safe_dump(doc))
    result = fleet.kubectl_fiar("status", kubeconfig=down)
    assert result.returncode == 1 and "Traceback" not in result.stderr and result.stderr.strip()
    nocontext = fleet.kubectl_fiar("status", "--context", "nowhere")
    assert nocontext.returncode == 1 and "nowhere" in nocontext.stderr


def _operator_role() -> dict[str, Any]:
    rendered = helm(
        "template",
        "fiar",
        str(ROOT / "charts" / "fiar"),
        "--namespace",
        "fiar-system",
        "--kube-version",
        "1.36.3",
        "--show-only",
        "templates/operator-rbac.yaml",
    ).stdout
    return next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ClusterRole")


def test_it_reads_nothing_the_operators_account_may_not(fleet: Fleet, tmp_path: Path) -> None:
    role = _operator_role()
    with fleet.plane.api_client() as api:
        rbac, core = client.RbacAuthorizationV1Api(api), client.CoreV1Api(api)
        fleet.plane.create_namespace("fiar-reader")
        core.create_namespaced_service_account("fiar-reader", {"metadata": {"name": "operator-twin"}})
        rbac.create_cluster_role({"metadata": {"name": "fiar-operator-twin"}, "rules": role["rules"]})
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": "fiar-operator-twin"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "fiar-operator-twin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "operator-twin", "namespace": "fiar-reader"}],
            }
        )
    kubeconfig = fleet.plane.write_kubeconfig(
        tmp_path / "twin.kubeconfig",
        "operator-twin",
        token=fleet.plane.service_account_token("fiar-reader", "operator-twin"),
    )
    as_admin: Callable[..., str] = lambda *a: masked(fleet.kubectl_fiar(*a).stdout)  # noqa: E731
    for args in (("status",), ("why", "h200x2-host"), ("why", "pod", f"{NS}/vllm-h200x2-host")):
        result = fleet.kubectl_fiar(*args, kubeconfig=kubeconfig)
        assert result.returncode == 0, result.stderr
        assert masked(result.stdout) == as_admin(*args)


# -- the HTML page in a real headless Chromium -----------------------------------------------------------
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
SCREENSHOT = ROOT / "docs" / "kubectl-fiar-report.png"


def _need_chromium() -> str:
    if CHROMIUM is None:
        why = "no chromium on PATH (Debian package chromium: `make browser-deps` as root installs it)"
        if os.environ.get("FIAR_REQUIRE_REALNODE"):
            pytest.fail(why)
        pytest.skip(why)
    return CHROMIUM


async def _render(
    chromium: str, page: Path, profile: Path
) -> tuple[list[dict[str, Any]], dict[str, Any], bytes, list[str]]:
    """Open ``page`` in headless Chromium through the DevTools protocol: every node cell as rendered
    (its computed colour and size), the page's counts, a screenshot, and every URL it requested."""
    import aiohttp

    proc = await asyncio.create_subprocess_exec(
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "--window-size=1100,800",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        browser = ""
        while not browser:
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, "chromium exited before it listened"
            browser = line.split("DevTools listening on ", 1)[1].strip() if "DevTools listening on" in line else ""
        port = browser.split(":")[2].split("/")[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as answer:
                target = next(t for t in await answer.json() if t["type"] == "page")
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=64 << 20) as ws:
                ids = iter(range(1, 1000))
                requested: list[str] = []
                loaded = asyncio.Event()

                async def call(method: str, **params: Any) -> dict[str, Any]:
                    mine = next(ids)
                    await ws.send_json({"id": mine, "method": method, "params": params})
                    while True:
                        msg = await asyncio.wait_for(ws.receive_json(), 30)
                        if msg.get("method") == "Network.requestWillBeSent":
                            requested.append(msg["params"]["request"]["url"])
                        if msg.get("method") == "Page.loadEventFired":
                            loaded.set()
                        if msg.get("id") == mine:
                            assert "error" not in msg, msg
                            return dict(msg.get("result") or {})

                await call("Network.enable")
                await call("Page.enable")
                await call(
                    "Emulation.setDeviceMetricsOverride", width=1100, height=800, deviceScaleFactor=1, mobile=False
                )
                await call("Page.navigate", url=page.as_uri())
                while not loaded.is_set():
                    await call("Runtime.evaluate", expression="1")
                script = """JSON.stringify({
                  cells: [...document.querySelectorAll('.node')].map(e => { const r = e.getBoundingClientRect();
                    return {node: e.dataset.node, verdict: e.dataset.verdict,
                            colour: getComputedStyle(e).backgroundColor, width: r.width, height: r.height,
                            title: e.title}; }),
                  counts: Object.fromEntries([...document.querySelectorAll('#counts [data-verdict]')]
                    .map(e => [e.dataset.verdict, +e.dataset.count])),
                  rows: document.querySelectorAll('table.nodes tbody tr').length,
                  policies: [...document.querySelectorAll('table.policies tbody tr')].map(r => r.cells[0].textContent),
                  height: document.documentElement.scrollHeight})"""
                result = await call("Runtime.evaluate", expression=script, returnByValue=True)
                doc = json.loads(result["result"]["value"])
                height = min(int(doc["height"]), 900)
                await call(
                    "Emulation.setDeviceMetricsOverride", width=1100, height=height, deviceScaleFactor=1, mobile=False
                )
                shot = await call("Page.captureScreenshot", format="png")
                return doc["cells"], doc, base64.b64decode(shot["data"]), requested
    finally:
        proc.kill()
        await proc.wait()


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def test_the_html_report_renders_every_node_in_its_verdicts_colour_in_chromium(fleet: Fleet, tmp_path: Path) -> None:
    chromium = _need_chromium()
    from kubectl_fiar import page as fleet_page

    html = tmp_path / "fleet.html"
    result = fleet.kubectl_fiar("report", "--html", str(html))
    assert result.returncode == 0, result.stderr
    status = json.loads(fleet.kubectl_fiar("status", "-o", "json").stdout)
    cells, doc, png, requested = asyncio.run(_render(chromium, html, tmp_path / "profile"))
    verdicts = {n["name"]: n["verdict"] for n in status["nodes"]}
    assert {c["node"]: c["verdict"] for c in cells} == verdicts  # every node, once, with its verdict
    assert len(cells) == len(verdicts)
    for cell in cells:
        assert cell["colour"] == _rgb(fleet_page.COLOURS[cell["verdict"]]), cell
        assert cell["width"] > 10 and cell["height"] > 10 and cell["title"].startswith(cell["node"] + ": ")
    assert doc["counts"] == status["counts"] and doc["rows"] == len(verdicts) and doc["policies"] == ["vllm"]
    assert requested == [html.as_uri()], "the page fetched something besides itself"
    assert png.startswith(b"\x89PNG") and len(png) < 400_000
    if os.environ.get("FIAR_UPDATE_SCREENSHOT"):
        SCREENSHOT.write_bytes(png)
