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


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit setting ``value`` at a dotted ``path`` (``gpus.0.nvlinks``) of a fixture."""

    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[int(last) if isinstance(node, list) else last] = value

    return edit


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("gpus.0.nvlinks", -1, "gpus[0].nvlinks: expected a list, got -1"),
        ("errors", 5, "errors: expected a list of strings, got 5"),
        ("simulate.smoke", "x", "simulate.smoke: expected an object, got 'x'"),
        ("simulate.software", "torch", "simulate.software: expected an object, got 'torch'"),
        ("simulate.smoke.trtllm", {"outcome": "fail", "step": 3}, "simulate.smoke.trtllm.step: 3 is not one of"),
        ("simulate.smoke.trtllm", {"jit_s": "slow"}, "simulate.smoke.trtllm.jit_s: expected a non-negative number"),
        ("simulate.smoke.trtllm", {"bench": [{"hidden": 1}]}, "simulate.smoke.trtllm.bench[0].tokens"),
        ("simulate.smoke.trtllm", {"latency_us": [1]}, "simulate.smoke.trtllm.latency_us: expected an object"),
        ("simulate.native_probe", "explode", "simulate.native_probe: 'explode' is not one of"),
        ("torch", ["2.11"], "torch: expected a string or null"),
    ],
)
def test_corrupted_fixtures_exit_2_with_a_message_and_no_traceback(
    host_file: Callable[..., Path], path: str, value: Any, message: str
) -> None:
    proc = agent("probe", "--simulate", str(host_file("h200x2-host", _set(path, value))), "--no-benchmark")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "invalid configuration" in proc.stderr and message in proc.stderr, proc.stderr


def test_a_fixture_nested_5000_deep_exits_2(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"gpus": [], "x": ' + "[" * 5000 + "]" * 5000 + "}")
    proc = agent("probe", "--simulate", str(deep))
    assert proc.returncode == 2, proc.stderr
    assert "nested too deeply" in proc.stderr and "Traceback" not in proc.stderr


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
