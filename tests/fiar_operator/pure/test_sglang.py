"""SGLang containers read the pod's one decision: the SGLang column of the decision table (every host
fixture x group shape), and every SGLang command form after the kubelet's expansion (the option lands
before the user's options, the user's options survive, re-running the mutation changes nothing, a
command fiar does not understand is left exactly as it was). bench/sglang_check.py runs the same forms
through SGLang's own parser and post-process passes."""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest

import fiar_contract as contract
from devcluster import workloads
from devcluster.kubelet import container_process
from fiar_operator.admission.mutation import default_backend_ops, plan_pod_create
from fiar_operator.core import patches
from fiar_operator.core.commands import SGLANG_TOKEN, plan_command
from fiar_operator.core.decide import Decision, decide, pending
from fiar_operator.core.pods import pod_record
from fiar_operator.core.policy import Policy, parse_policy

from .builders import MODEL, shape_plan
from .builders import SGLANG_FORMS as FORMS

B, M, MN, T, C, CC = (
    contract.LABEL_BACKEND,
    contract.LABEL_MULTICAST,
    contract.LABEL_MNNVL,
    contract.LABEL_TRTLLM,
    contract.LABEL_CLIQUE,
    contract.LABEL_COMPUTE_CAPABILITY,
)
CLIQUE = "6f1c2b8e-4d3a-4f0e-9b7c-5a1d2e3f4a5b.32766"
OFF = contract.SGLANG_FLAGS["off"]
ENGINE = contract.SGLANG_FLAGS["engine"]
SM90, SM100 = {CC: "9.0"}, {CC: "10.0"}

# The labels the agent writes for the shipped host fixtures (tests/node_agent/pure/test_verdict_over_fixtures.py),
# nodes of other generations and verdicts, the same without the compute capability (an agent that predates
# the label), and a node never probed.
FIXTURES: dict[str, dict[str, str]] = {
    "h200x2-host": {B: "trtllm", M: "disabled", MN: "skipped", T: "pass", **SM90},
    "h100x8-nvswitch-healthy": {B: "mnnvl", M: "supported", MN: "pass", T: "pass", **SM90},
    "h100x8-nvswitch-fabric-manager-down": {B: "trtllm", M: "unknown", MN: "fail", T: "pass", **SM90},
    "h200nvl-bridge-null-multicast": {B: "none", M: "unsupported", MN: "fail", T: "pass", **SM90},
    "h100x4-pcie-no-nvlink": {B: "none", M: "unsupported", MN: "fail", T: "fail", **SM90},
    "gb200-nvl72-clique": {B: "mnnvl", M: "supported", MN: "pass", T: "pass", C: CLIQUE, **SM100},
    "sm90-mnnvl-trtllm-failed": {B: "mnnvl", M: "supported", MN: "pass", T: "fail", **SM90},
    "sm100-mnnvl-trtllm-failed": {B: "mnnvl", M: "supported", MN: "pass", T: "fail", **SM100},
    "sm100-trtllm-without-multicast": {B: "trtllm", M: "unsupported", MN: "skipped", T: "pass", **SM100},
    "sm120-trtllm": {B: "trtllm", M: "unsupported", MN: "skipped", T: "pass", CC: "12.0"},
    "h200x2-host-unlabelled": {B: "trtllm", M: "disabled", MN: "skipped", T: "pass"},
    "trtllm-without-multicast-unlabelled": {B: "trtllm", M: "unsupported", MN: "skipped", T: "pass"},
    "mnnvl-trtllm-unlabelled": {B: "mnnvl", M: "supported", MN: "pass", T: "pass", C: CLIQUE},
    "unprobed": {},
}
SHAPES = ("single", "group-pinned-imex", "group-pinned-no-imex", "group-unpinned-imex")

# SGLang's option per fixture and shape under the default policy (mnnvl, trtllm).
EXPECTED: dict[str, dict[str, str]] = {
    # SM90: SGLang's own choice is trtllm on one node, verified here
    "h200x2-host": {"single": ENGINE},
    "h100x8-nvswitch-healthy": {"single": ENGINE},
    "h100x8-nvswitch-fabric-manager-down": {"single": ENGINE},
    "h200nvl-bridge-null-multicast": {"single": OFF},
    "h100x4-pcie-no-nvlink": {"single": OFF},
    "gb200-nvl72-clique": {
        "single": ENGINE,
        "group-pinned-imex": ENGINE,
        "group-pinned-no-imex": OFF,
        "group-unpinned-imex": ENGINE,
    },
    # SGLang's auto picks trtllm on SM90, which failed here: off
    "sm90-mnnvl-trtllm-failed": {"single": OFF},
    # and mnnvl on SM100, which passed
    "sm100-mnnvl-trtllm-failed": {"single": ENGINE},
    # mnnvl on SM100 (MiMo: cutedsl, whose failing workspace stops the server): not verified
    "sm100-trtllm-without-multicast": {"single": OFF},
    # SGLang turns the fusion on only on SM90 and SM10x
    "sm120-trtllm": {"single": ENGINE},
    # generation not known: either backend, so both must be verified
    "h200x2-host-unlabelled": {"single": OFF},
    "trtllm-without-multicast-unlabelled": {"single": OFF},
    "mnnvl-trtllm-unlabelled": {
        "single": ENGINE,
        "group-pinned-imex": ENGINE,
        "group-pinned-no-imex": OFF,
        "group-unpinned-imex": ENGINE,
    },
    "unprobed": {"single": OFF},
}


def policy(**spec: Any) -> Policy:
    return parse_policy({"metadata": {"name": "p"}, "spec": {"podSelector": {}, **spec}})


def decided(fixture: str, shape: str, chosen: Policy | None = None) -> Decision:
    labels = FIXTURES[fixture]
    return decide(chosen or policy(), fixture, labels, shape_plan(shape), {fixture: labels})


def expected(fixture: str, shape: str) -> str:
    return EXPECTED[fixture].get(shape, EXPECTED[fixture]["single"] if shape == "single" else OFF)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_each_fixture_and_group_shape_gets_its_sglang_option(fixture: str, shape: str) -> None:
    decision = decided(fixture, shape)
    notes = decision.annotations()
    assert notes[contract.ANNOTATION_POD_SGLANG_FLAG] == expected(fixture, shape)
    assert contract.pod_annotation_value(
        contract.ANNOTATION_POD_SGLANG_FLAG, notes[contract.ANNOTATION_POD_SGLANG_FLAG]
    )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_sglang_runs_its_own_choice_only_where_the_pods_fusion_is_on(fixture: str, shape: str) -> None:
    """One decision per pod: SGLang's own choice never where vLLM's fusion is off."""
    decision = decided(fixture, shape)
    if decision.fusion == "off":
        assert decision.sglang_flag == "off"


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_a_policy_that_allows_one_backend_gives_sglang_its_own_choice_only_where_that_is_all_it_can_pick(
    fixture: str,
) -> None:
    generation = FIXTURES[fixture].get(CC)
    never = generation is not None and generation not in ("9.0", "10.0")  # SGLang enables the fusion nowhere
    only_trtllm = decided(fixture, "single", policy(backends=["trtllm"]))
    on_sm90 = generation == "9.0" or never
    assert only_trtllm.sglang_flag == ("engine" if only_trtllm.fusion == "on" and on_sm90 else "off")
    only_mnnvl = decided(fixture, "single", policy(backends=["mnnvl"]))
    on_sm100 = generation == "10.0" or never
    assert only_mnnvl.sglang_flag == ("engine" if only_mnnvl.fusion == "on" and on_sm100 else "off")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fixture", sorted(FIXTURES))
def test_fusion_control_disabled_leaves_sglang_its_own_choice(fixture: str, shape: str) -> None:
    assert decided(fixture, shape, policy(fusionControl="Disabled")).sglang_flag == "engine"


def test_a_pod_not_yet_bound_reads_the_enforce_disable_switch() -> None:
    assert pending(policy()).annotations()[contract.ANNOTATION_POD_SGLANG_FLAG] == OFF


# -- command forms ------------------------------------------------------------------------------------
USER = {
    "sglang-k8s-deployment": ["--model-path", MODEL, "--host", "0.0.0.0", "--port", "30000", "--tp", "2"],
    "lws-sglang": [
        "--model-path",
        MODEL,
        "--tp",
        "2",
        "--dist-init-addr",
        "sglang-0.sglang.ml:20000",
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--trust-remote-code",
        "--host",
        "0.0.0.0",
        "--port",
        "40000",
    ],
    "ome-runtime": [
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "--enable-metrics",
        "--model-path",
        MODEL,
        "--tp-size",
        "2",
        "--mem-frac",
        "0.9",
        "--log-level",
        "debug",
    ],
    "sglang-serve": [MODEL, "--tp", "2"],
    "shell-placeholder": ["--model-path", MODEL, "--tp", "2"],
}
"""The engine's arguments each form gives SGLang, without fiar's option."""


def pod(container: dict[str, Any]) -> dict[str, Any]:
    return workloads.pod(container, generate_name="sglang-")


def mutated(source: dict[str, Any], chosen: Policy | None = None) -> tuple[dict[str, Any], list[str]]:
    plan = plan_pod_create(source, chosen or policy(), {})
    out: dict[str, Any] = patches.apply(copy.deepcopy(source), plan.ops)
    assert out == plan.pod and plan.managed
    return out, plan.warnings


def bound(out: dict[str, Any], flag: str) -> dict[str, Any]:
    result = copy.deepcopy(out)
    result["metadata"]["annotations"][contract.ANNOTATION_POD_SGLANG_FLAG] = flag
    return result


FAKE_PYTHON = """#!/bin/sh
exec /usr/bin/env -u PATH python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
"""


def sglang_arguments(argv: list[str], env: dict[str, str], tmp: Any) -> list[str]:
    """What SGLang's parser gets: after the entry in exec form; for a shell string, what a real bash
    starts ``python3 -m sglang.launch_server`` with (a stand-in python3 prints it)."""
    if argv[0].endswith("sh") and argv[1] == "-c":
        (tmp / "python3").write_text(
            "#!/bin/sh\nexec /usr/bin/python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n"
        )
        (tmp / "python3").chmod(0o755)
        proc = subprocess.run(
            ["bash", *argv[1:]],
            env={**env, "PATH": f"{tmp}:/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        words: list[str] = json.loads(proc.stdout.splitlines()[0])
        return words[2:]  # after -m sglang.launch_server
    return argv[2:] if argv[0] == "sglang" else argv[3:]


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("flag", sorted(contract.SGLANG_FLAGS.values()))
def test_every_sglang_form_reads_its_option_before_the_users_options(form: str, flag: str, tmp_path: Any) -> None:
    out, warnings = mutated(pod(FORMS[form]))
    assert not any("fusion not controlled" in w for w in warnings)
    argv, env = container_process(bound(out, flag), out["spec"]["containers"][0])
    assert all(argv), f"an empty argument in {argv}"
    assert not any("$(FIAR" in t for t in argv), "every reference is expanded"
    tokens = sglang_arguments(argv, env, tmp_path)
    at = 1 if form == "sglang-serve" else 0  # `sglang serve MODEL`: the model path stays first
    assert tokens[at] == f"--{flag}"
    assert tokens[:at] + tokens[at + 1 :] == USER[form], "the user's options, in their order"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_rerunning_the_mutation_on_an_sglang_container_changes_nothing(form: str) -> None:
    out, _warnings = mutated(pod(FORMS[form]))
    again = plan_pod_create(out, policy(), {})
    assert again.ops == [] and again.managed


@pytest.mark.parametrize("form", sorted(FORMS))
def test_an_sglang_container_is_managed_and_reads_only_its_own_variables(form: str) -> None:
    """Selected like every container fiar manages (the backend variable, and whatever else every selected
    container gets); the fusion through FIAR_SGLANG_*, none of vLLM's command variables."""
    out, _warnings = mutated(pod(FORMS[form]))
    container = out["spec"]["containers"][0]
    names = [e["name"] for e in container["env"]]
    assert names[:2] == [contract.ENV_SGLANG_FLAG, contract.ENV_SGLANG_ARGS]
    assert contract.ENV_VAR in names
    assert not {contract.ENV_FUSE_ALLREDUCE_RMS, contract.ENV_VLLM_ARGS, contract.ENV_ALLREDUCE_USE_FLASHINFER} & set(
        names
    )
    assert out["metadata"]["annotations"][contract.ANNOTATION_POD_SGLANG_FLAG] == OFF, "off until bound"
    assert contract.ANNOTATION_POD_SGLANG_FLAG in pod_record(out).reads


def test_the_exec_token_never_expands_to_an_empty_argument_even_without_the_annotation() -> None:
    out, _warnings = mutated(pod(FORMS["sglang-k8s-deployment"]))
    del out["metadata"]["annotations"][contract.ANNOTATION_POD_SGLANG_FLAG]
    argv, _env = container_process(out, out["spec"]["containers"][0])
    assert all(argv) and argv[3] == "--"
    assert default_backend_ops(out), "a pod that lost the annotation gets SGLang's own default back"


def test_the_token_goes_where_the_entry_ends_in_command_or_args() -> None:
    plan = plan_command(FORMS["sglang-k8s-deployment"])
    assert plan.command is None and plan.args is not None and plan.args[0] == SGLANG_TOKEN
    plan = plan_command(FORMS["lws-sglang"])
    assert plan.args is None and plan.command is not None and plan.command[3] == SGLANG_TOKEN


BAD = {
    "both": ["--enforce-disable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend", "trtllm"],
    "unknown-backend": ["--flashinfer-allreduce-fusion-backend=nccl"],
    "config-file": ["--config", "/etc/sglang.yaml"],
    "abbreviated-fusion-option": ["--enforce-disable-flashinfer"],
    "backend-without-value": ["--flashinfer-allreduce-fusion-backend"],
    "placeholder-not-after-the-entry": [],
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_an_sglang_command_fiar_does_not_understand_is_left_exactly_as_it_was_and_reported(case: str) -> None:
    container = copy.deepcopy(FORMS["sglang-k8s-deployment"])
    container["args"] += BAD[case]
    if case == "placeholder-not-after-the-entry":
        container = copy.deepcopy(FORMS["shell-placeholder"])
        container["args"] = [f'exec python3 -m sglang.launch_server --model-path {MODEL} "${{FIAR_SGLANG_ARGS}}"']
    out, warnings = mutated(pod(container))
    changed = out["spec"]["containers"][0]
    env = changed.pop("env", [])
    assert changed == container, "command, args and everything else unchanged"
    assert contract.ENV_SGLANG_FLAG not in [e["name"] for e in env]
    assert any("fusion not controlled" in w for w in warnings)
    assert pod_record(out).uncontrolled == (container["name"],), "reported in the policy status and by event"


@pytest.mark.parametrize(
    "own",
    [
        ["--flashinfer-allreduce-fusion-backend", "auto"],
        ["--flashinfer-allreduce-fusion-backend=mnnvl"],
        ["--enforce-disable-flashinfer-allreduce-fusion"],
        ["--enable-flashinfer-allreduce-fusion"],
    ],
    ids=["backend", "backend-inline", "enforce-disable", "deprecated-enable"],
)
def test_a_users_own_sglang_fusion_options_are_kept_under_respect_explicit_fusion(own: list[str]) -> None:
    container = copy.deepcopy(FORMS["sglang-k8s-deployment"])
    container["args"] += own
    out, warnings = mutated(pod(container))
    changed = out["spec"]["containers"][0]
    assert changed["command"] == container["command"] and changed["args"] == container["args"]
    assert any("respectExplicitFusion" in w for w in warnings)
    assert pod_record(out).uncontrolled == ()
    overridden, _warnings = mutated(pod(container), policy(respectExplicitFusion=False))
    argv, _env = container_process(bound(overridden, OFF), overridden["spec"]["containers"][0])
    assert argv[3:] == [f"--{OFF}", *USER["sglang-k8s-deployment"]], "fiar's option in place of the user's"


@pytest.mark.parametrize(
    "container",
    [
        {
            "name": "router",
            "image": "docker.io/lmsysorg/sglang-router:v0.2.3",
            "command": ["python3", "-m", "sglang_router.launch_router", "--host", "0.0.0.0", "--port", "8080"],
        },
        {
            "name": "vllm-worker",
            "image": "vllm/vllm-openai:latest",
            "command": [
                "sh",
                "-c",
                "bash /vllm-workspace/examples/online_serving/multi-node-serving.sh worker "
                "--ray_address=$(LWS_LEADER_ADDRESS)",
            ],
        },
    ],
    ids=["sglang-router", "lws-vllm-ray-worker"],
)
def test_a_container_that_runs_no_engine_server_is_left_alone_and_not_reported(container: dict[str, Any]) -> None:
    out, warnings = mutated(pod(container))
    assert {k: v for k, v in out["spec"]["containers"][0].items() if k != "env"} == container
    assert not any("fusion not controlled" in w for w in warnings)
    assert pod_record(out).uncontrolled == ()


def test_the_lws_vllm_leader_is_told_where_the_placeholder_goes_in_its_own_command() -> None:
    leader = {
        "name": "vllm-leader",
        "image": "vllm/vllm-openai:latest",
        "command": [
            "sh",
            "-c",
            "bash /vllm-workspace/examples/online_serving/multi-node-serving.sh leader "
            "--ray_cluster_size=$(LWS_GROUP_SIZE); python3 -m vllm.entrypoints.openai.api_server --port 8080 "
            "--model meta-llama/Meta-Llama-3.1-405B-Instruct --tensor-parallel-size 8 --pipeline_parallel_size 2",
        ],
    }
    plan = plan_command(leader)
    assert not plan.understood
    assert plan.reason == (
        "a shell command: put \"${FIAR_VLLM_ARGS}\" after 'python3 -m vllm.entrypoints.openai.api_server' in it"
    )
    shell = {
        "name": "s",
        "image": "lmsysorg/sglang",
        "command": ["bash", "-c", f"python3 -m sglang.launch_server --model {MODEL}"],
    }
    assert "\"${FIAR_SGLANG_ARGS}\" after 'python3 -m sglang.launch_server'" in plan_command(shell).reason


def test_an_sglang_value_outside_the_allowlist_is_read_as_absent_and_replaced_by_sglangs_default() -> None:
    out, _warnings = mutated(pod(FORMS["sglang-k8s-deployment"]))
    copied = copy.deepcopy(out)
    copied["metadata"] = {
        "name": "copy",
        "namespace": "ml",
        "annotations": {contract.ANNOTATION_POD_SGLANG_FLAG: "log-level=info --trust-remote-code"},
    }
    assert pod_record(copied).sglang is None
    notes = patches.apply(copied, default_backend_ops(copied))["metadata"]["annotations"]
    assert notes[contract.ANNOTATION_POD_SGLANG_FLAG] == ENGINE
