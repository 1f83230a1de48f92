"""``fiar-agent`` as a user runs it: exit codes, JSON output with labels, clear errors at start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fiar_contract as contract
from node_agent import hardware, inventory


def agent(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in contract.HOST_POLICY_ENV and k != "NODE_NAME"}
    return subprocess.run(
        [sys.executable, "-m", "node_agent", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_probe_json_prints_the_report_with_its_labels() -> None:
    proc = agent("probe", "--simulate", "h200x2-host", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "fiar.io/probe-report" and doc["version"] == 1
    assert doc["labels"][contract.LABEL_BACKEND] == "trtllm"
    assert "trtllm: smoke test, 2 ranks" in proc.stderr, "progress goes to stderr"


def test_probe_summary_is_readable() -> None:
    proc = agent("probe", "--simulate", "h100x8-nvswitch-healthy")
    assert proc.returncode == 0, proc.stderr
    assert "fiar.io/backend=mnnvl" in proc.stdout
    assert "reasons:" in proc.stdout


def test_forbid_multicast_flag() -> None:
    proc = agent("probe", "--simulate", "h100x8-nvswitch-healthy", "--json", "--forbid-multicast")
    labels = json.loads(proc.stdout)["labels"]
    assert labels[contract.LABEL_MULTICAST] == "disabled"
    assert labels[contract.LABEL_MNNVL] == "skipped"


def test_degraded_probe_exits_1(host_file: Callable[..., Path]) -> None:
    def no_driver(doc: dict[str, Any]) -> None:
        doc["simulate"] = {"nvml": "missing"}

    proc = agent("probe", "--simulate", str(host_file("h200x2-host", no_driver)), "--json")
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["status"] == "degraded"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["probe", "--simulate", "no-such-host"], "simulated host no-such-host: no such file"),
        (["probe", "--simulate", "h200x2-host", "--gpus", "3"], "--gpus must be a power of two"),
        (["probe", "--simulate", "h200x2-host", "--timeout", "0"], "--timeout must be positive"),
        (["run", "--simulate", "h200x2-host"], "no node name"),
        (["run", "--simulate", "h200x2-host", "--node-name", "n", "--kubeconfig", "/nonexistent"], "cannot load"),
        (["run", "--simulate", "h200x2-host", "--node-name", "n", "--interval", "-1"], "--interval must be positive"),
        (
            ["run", "--simulate", "h200x2-host", "--node-name", "n", "--retry-interval", "0"],
            "--retry-interval must be positive",
        ),
        (["run", "--simulate", "h200x2-host", "--node-name", "n", "--metrics-addr", "nope"], "HOST:PORT"),
    ],
)
def test_invalid_configuration_exits_2_with_a_clear_message(args: list[str], message: str) -> None:
    proc = agent(*args, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "invalid configuration" in proc.stderr
    assert message in proc.stderr


def test_malformed_fixture_is_a_configuration_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gpus": [{"index": "zero"}]}))
    proc = agent("probe", "--simulate", str(bad))
    assert proc.returncode == 2
    assert "gpus[0].index: expected an integer" in proc.stderr


def test_inventory_prints_the_recorded_host_format(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    proc = agent("inventory", "--simulate", "h200x2-host", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    printed = inventory.from_dict(json.loads(out.read_text()))
    recorded = inventory.from_dict(json.loads((hardware.FIXTURES / "h200x2-host.json").read_text()))
    assert printed == recorded


def test_inventory_without_a_driver_exits_1(host_file: Callable[..., Path]) -> None:
    def no_driver(doc: dict[str, Any]) -> None:
        doc["simulate"] = {"nvml": "missing"}

    proc = agent("inventory", "--simulate", str(host_file("h200x2-host", no_driver)))
    assert proc.returncode == 1
    assert "NVML" in proc.stderr
