"""The resident agent never imports torch or FlashInfer, the generated Kubernetes API classes, or the operator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "flashinfer", "node_agent.smoke.worker", "kubernetes.client.api.core_v1_api", "fiar_operator")

CHECK = """
import sys
from node_agent import cli, daemon, publish
rc = cli.main(["probe", "--simulate", "h100x8-nvswitch-healthy", "--json"])
publish.NodePublisher(publish.load_client_config(sys.argv[1]), "gpu-0")._transport()
heavy = [m for m in sys.modules if m in {heavy!r} or m.split(".")[0] in ("torch", "flashinfer", "fiar_operator")]
print("HEAVY", heavy, file=sys.stderr)
sys.exit(10 if heavy else rc)
"""

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_probe_and_publisher_import_nothing_heavy(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    proc = subprocess.run(
        [sys.executable, "-c", CHECK.format(heavy=HEAVY), str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "HEAVY []" in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
