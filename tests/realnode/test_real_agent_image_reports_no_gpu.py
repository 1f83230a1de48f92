"""The real (CUDA) agent image starts on the real node (tier D) and its probe reports "no GPU" cleanly.

The image is multi-GB and built only on request (``make agent-image``, ``python -m devcluster build
--agent-image``), never by the test setup: without it in the cache this test is skipped with that reason.
The node has no GPU and no NVIDIA container toolkit, so the image's own entry point runs ``fiar-agent
probe --json`` exactly as it would on a GPU node whose driver is missing: exit code 1 (degraded), zero
GPUs, no ``fiar.io/backend`` label, and the reason NVML gave (``fiar-agent`` exit codes: node_agent/cli.py).
Each architecture's image is its own build (``--arch arm64``: a Grace node's image), or one
architecture of the build of both (``--arch amd64,arm64``); a foreign one runs under qemu
(``devcluster/binfmt.py``), imported as its single manifest as a node of that architecture would pull it.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import fiar_contract as contract
from devcluster import binfmt, images
from devcluster.cluster import ControlPlane, ControlPlaneError
from devcluster.waiting import wait_for

pytestmark = [pytest.mark.controlplane, pytest.mark.realnode]

PROGRESS = re.compile(r"^\[\s*\d+\.\d+s\] ")
"""The probe's progress lines on stderr, which the container log interleaves with the report."""


def _report(log: str) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads("\n".join(line for line in log.splitlines() if not PROGRESS.match(line)))
    return parsed


@pytest.mark.parametrize("arch", images.ARCHITECTURES)
def test_the_real_agent_images_probe_reports_no_gpu_on_a_node_without_one(
    plane_d: ControlPlane, arch: str, tmp_path: Path
) -> None:
    host = arch == binfmt.host_arch()
    alone, both = images.agent_image(None if host else (arch,)), images.agent_image(images.ARCHITECTURES)
    image = alone if alone.archive.is_file() else both
    if not image.archive.is_file():
        build = "make agent-image" if host else f"python -m devcluster build --agent-image --arch {arch}"
        pytest.skip(
            f"the real {arch} agent image is not in the cache ({alone.archive}, nor the build of "
            f"{','.join(images.ARCHITECTURES)}: {both.archive}): build it with `{build}`"
        )
    node = plane_d.real_node
    assert node is not None
    ref = image.ref
    if host and image.architectures == (arch,):
        node.ctr("images", "import", str(image.archive), timeout=1200)
    else:
        if not host:
            binfmt.ensure(arch)
        ref = f"{image.ref}-{arch}"
        single = images.platform_archive(image.archive, arch, ref, tmp_path / "agent.tar")
        try:
            node.ctr("images", "import", str(single), timeout=1200)
        finally:
            single.unlink()
    namespace = plane_d.create_namespace(f"agent-image-{uuid.uuid4().hex[:6]}")
    pod = {
        "metadata": {"name": "fiar-agent-probe"},
        "spec": {
            "nodeName": node.name,
            "restartPolicy": "Never",
            "containers": [{"name": "agent", "image": ref, "imagePullPolicy": "Never", "args": ["probe", "--json"]}],
        },
    }
    with plane_d.api_client() as api:
        core = client.CoreV1Api(api)
        try:
            core.create_namespaced_pod(namespace, pod)

            def finished() -> Any:
                found = core.read_namespaced_pod("fiar-agent-probe", namespace)
                return found if found.status.phase in ("Succeeded", "Failed") else None

            done = wait_for(finished, 600, "the agent image's probe to finish on the real node", interval=2)
            terminated = done.status.container_statuses[0].state.terminated
            log = core.read_namespaced_pod_log("fiar-agent-probe", namespace, container="agent")
        finally:
            core.delete_namespace(namespace)
            with contextlib.suppress(ControlPlaneError):  # 7.6 GB unpacked: not kept past this test
                node.ctr("images", "rm", ref)
    assert terminated.exit_code == 1, log[-3000:]  # degraded: the probe finished, no step could answer
    report = _report(log)
    assert report["status"] == "degraded"
    assert report["labels"][contract.LABEL_GPUS] == "0"
    assert contract.LABEL_BACKEND not in report["labels"]
    assert any("inventory unavailable" in reason and "nvml" in reason.lower() for reason in report["reasons"])
    assert "Traceback" not in log
