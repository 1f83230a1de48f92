"""The agent's backend table is the one place per backend: it follows the contract, and the probe,
the smoke workers, prebuild and the verdict read it. Other facts the agent used to state twice
(command-line defaults, benchmark sizes, terminal statuses) are checked to have one source too."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fiar_contract as contract
from node_agent import backends, cli, probe, verdict
from node_agent.daemon import DaemonConfig
from node_agent.policy import HostPolicy, refusal
from node_agent.probe import ProbeConfig
from node_agent.smoke import events, simworker, worker
from node_agent.smoke.outcome import SmokeRequest


def test_the_table_has_one_row_per_contract_backend_in_order_of_preference() -> None:
    assert backends.NAMES == contract.BACKENDS
    assert [b.name for b in backends.TABLE] == list(contract.BACKENDS)


def test_every_world_size_is_a_power_of_two_and_every_backend_runs_on_two_gpus() -> None:
    for spec in backends.TABLE:
        assert spec.world_sizes == tuple(sorted(set(spec.world_sizes)))
        assert all(n >= 2 and n & (n - 1) == 0 for n in spec.world_sizes)
        assert spec.world_sizes[0] == 2  # the probe tests every backend from two GPUs on


@pytest.mark.parametrize("spec", backends.TABLE, ids=lambda s: s.name)
def test_the_probe_uses_the_largest_world_size_of_the_row(spec: backends.BackendSpec) -> None:
    assert probe.world_size(spec.name, 1) is None
    assert probe.world_size(spec.name, 2) == 2
    assert probe.world_size(spec.name, 3) == 2
    assert probe.world_size(spec.name, 1000) == spec.world_sizes[-1]


def test_a_host_that_forbids_multicast_tests_and_prebuilds_only_backends_without_it() -> None:
    assert backends.allowed(False) == backends.TABLE
    assert [b.name for b in backends.allowed(True)] == [b.name for b in backends.TABLE if not b.needs_multicast]
    assert backends.MULTICAST_PROOF in [b.name for b in backends.TABLE if b.needs_multicast]
    forbidding = {"NCCL_NVLS_ENABLE": "0"}
    for spec in backends.TABLE:
        assert (refusal(spec.name, forbidding) is not None) == spec.needs_multicast
        assert refusal(spec.name, {}) is None


def test_a_child_gets_the_rows_variables_and_the_host_policys() -> None:
    for spec in backends.TABLE:
        assert HostPolicy(False).child_env(spec.name) == dict(spec.child_env)
        assert HostPolicy(True).child_env(spec.name) == {**contract.HOST_POLICY_ENV, **dict(spec.child_env)}


def test_the_workers_accept_exactly_the_tables_backends() -> None:
    for name in backends.NAMES:
        assert worker.parse_args(["--backend", name]).backend == name
    with pytest.raises(SystemExit):
        worker.parse_args(["--backend", "nvls"])
    with pytest.raises(SystemExit):
        simworker.main(["--fixture", "x.json", "--backend", "nvls"])


def test_the_verdict_writes_one_result_label_per_row() -> None:
    assert verdict.VERDICT_LABELS[-len(backends.NAMES) :] == tuple(contract.result_label(b) for b in backends.NAMES)
    assert set(contract.RESULT_LABELS) <= set(contract.AGENT_LABELS)


def test_the_cli_takes_its_defaults_from_the_config_dataclasses() -> None:
    args = cli.build_parser().parse_args(["run", "--node-name", "n"])
    assert cli.probe_config(args) == ProbeConfig()
    config = DaemonConfig.from_args(args, ProbeConfig())
    assert dataclasses.replace(config, kubeconfig=None, kernel_cache=None) == DaemonConfig(
        node_name="n", kubeconfig=None, probe=ProbeConfig()
    )


def test_the_worker_takes_its_sizes_from_the_launchers_request() -> None:
    args = worker.parse_args(["--backend", backends.NAMES[0]])
    request = SmokeRequest(backend=backends.NAMES[0], devices=(0, 1), timeout_s=1.0)
    assert (args.hidden, args.tokens, args.iters) == (request.hidden, request.tokens, request.iters)
    assert (args.bench_hidden, args.bench_tokens) == (request.bench_hidden, request.bench_tokens)


def test_every_failure_status_ends_a_rank() -> None:
    assert set(events.FAILURE_STATUSES) | {"done"} == events.TERMINAL


FAKE_MODULE = """
class Spec:
    def __init__(self, name):
        self.name, self.is_aot = name, True

    def get_library_path(self):
        return "/aot/" + self.name + ".so"


def {gen}():
    return Spec("{name}")


def {load}():
    raise AssertionError("prebuild builds, it never loads")
"""


def test_prebuild_finds_each_rows_module_by_flashinfers_names(tmp_path: Path) -> None:
    # A stand-in FlashInfer with the module and function names of FlashInfer 0.6 (flashinfer/comm/).
    comm = tmp_path / "flashinfer" / "comm"
    comm.mkdir(parents=True)
    (tmp_path / "flashinfer" / "__init__.py").write_text("")
    (comm / "__init__.py").write_text("")
    for module, name in (("trtllm_ar", "trtllm_comm"), ("trtllm_mnnvl_ar", "trtllm_mnnvl_comm")):
        text = FAKE_MODULE.format(gen=f"gen_{name}_module", load=f"get_{name}_module", name=name)
        (comm / f"{module}.py").write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run(
        [sys.executable, "-m", "node_agent.smoke.prebuild"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    modules = json.loads(out.stdout)["modules"]
    assert list(modules) == list(backends.NAMES)
    assert {name: m["source"] for name, m in modules.items()} == dict.fromkeys(backends.NAMES, "aot")
    assert modules["mnnvl"]["module"] == "trtllm_mnnvl_comm" and modules["trtllm"]["module"] == "trtllm_comm"
