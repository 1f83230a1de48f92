"""The pod webhook makes each vLLM command form read the fusion decision: after the kubelet's
``$(VAR)`` expansion, every argument is non-empty, the fusion is off or the container's own, the
user's compilation config is kept, re-running the mutation changes nothing, and a command fiar does
not understand is left exactly as it was. (bench/vllm_parser_check.py runs the same containers
through vLLM's own parser.)"""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import pytest

import fiar_contract as contract
from devcluster.kubelet import container_process, expand
from devcluster.workloads import pod
from fiar_operator.admission.mutation import default_backend_ops, plan_pod_create
from fiar_operator.core import patches
from fiar_operator.core.commands import DOTTED_FLAG, plan_command
from fiar_operator.core.decide import Decision
from fiar_operator.core.pods import pod_record

from .builders import FORMS, USER_JSON, mutated, policy

USER_SETTINGS: dict[str, dict[str, Any]] = {
    "user-json": USER_JSON,
    "user-json-inline-in-args": USER_JSON,
    "user-dotted": {"cudagraph_mode": "FULL", "max_cudagraph_capture_size": 64},
}


def bound(out: dict[str, Any], fusion: str, backend: str = "trtllm") -> dict[str, Any]:
    """The pod after its binding: the annotations the binding webhook writes for a decision."""
    decision = Decision(backend, "Verified" if fusion == "on" else "NotVerified", "vllm", fusion=fusion)  # type: ignore[arg-type]
    result = copy.deepcopy(out)
    result["metadata"]["annotations"].update(decision.annotations())
    return result


STANDIN = """#!/bin/sh
# Prints the arguments it was started with, one JSON list: what vLLM's parser would see.
exec python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
"""


@pytest.fixture(scope="module", autouse=True)
def shell_standins(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A ``vllm`` that prints its argv, and a ``sleep`` that returns at once, for the real shell."""
    folder = tmp_path_factory.mktemp("standin-bin")
    for name, text in (("vllm", STANDIN), ("sleep", "#!/bin/sh\nexit 0\n")):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    _BIN.append(str(folder))


_BIN: list[str] = []


def vllm_tokens(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The arguments vLLM's parser sees: the exec argv, or, for a shell string, the arguments a real
    shell (bash, or sh as the command names it) starts ``vllm serve`` with, in the container's
    environment (eval, ${VLLM_ADDITIONAL_ARGS} and $@ as that shell expands them)."""
    if argv[:1] and argv[0].endswith("sh") and argv[1:2] == ["-c"]:
        shell = "bash" if argv[0].endswith("bash") else "sh"
        proc = subprocess.run(
            [shell, *argv[1:]],
            env={**(env or {}), "PATH": f"{_BIN[-1]}:/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        words: list[str] = json.loads(proc.stdout.splitlines()[0])
        return words[words.index("serve") + 1 :]
    return argv


def effective_compilation_config(tokens: list[str]) -> dict[str, Any]:
    """What vLLM's FlexibleArgumentParser ends with for --compilation-config (argparse_utils.py, 0.25-0.33):
    dotted -cc.* values merge into one JSON appended last, which replaces a JSON --compilation-config."""
    config: dict[str, Any] = {}
    dotted: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        name, eq, value = tokens[i].partition("=")
        name = name.replace("_", "-") if name.startswith("--") and "." not in name else name
        if name in ("--compilation-config", "-cc"):
            if not eq:
                i += 1
                value = tokens[i]
            config = json.loads(value)
        elif name.startswith(("-cc.", "--compilation-config.")):
            if not eq:
                i += 1
                value = tokens[i]
            *path, last = name.split(".", 1)[1].split(".")
            node = dotted
            for key in path:
                node = node.setdefault(key, {})
            try:
                node[last] = json.loads(value)
            except ValueError:
                node[last] = value
        i += 1
    return dotted if dotted else config


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("fusion", ["on", "off"])
def test_every_form_reads_the_fusion_after_the_kubelets_expansion(form: str, fusion: str) -> None:
    out, _warnings = mutated(pod(FORMS[form]))
    argv, env = container_process(bound(out, fusion), out["spec"]["containers"][0])
    assert all(argv), f"an empty argument in {argv}"
    assert not any("$(FIAR" in token for token in argv), "every reference is expanded"
    assert env[contract.ENV_VAR] == "trtllm"
    assert env[contract.ENV_ALLREDUCE_USE_FLASHINFER] == {"on": "1", "off": "0"}[fusion]
    config = effective_compilation_config(vllm_tokens(argv, env))
    assert config["pass_config"]["fuse_allreduce_rms"] is {"on": None, "off": False}[fusion]
    for key, value in USER_SETTINGS.get(form, {}).items():
        if key == "pass_config":
            assert config["pass_config"] == {**value, "fuse_allreduce_rms": config["pass_config"]["fuse_allreduce_rms"]}
        else:
            assert config[key] == value, f"the user's {key} survives"
    if form == "production-stack":
        assert "-O3" in argv and argv[:3] == ["/opt/venv/bin/vllm", "serve", "meta-llama/Llama-3.1-8B"]
    if form == "llmisvc-additional-args":
        assert env["VLLM_ADDITIONAL_ARGS"] == '--enable-prefix-caching "${FIAR_VLLM_ARGS}"', "eval: quoted"
        assert argv == FORMS[form]["command"] + FORMS[form]["args"], "the script and its args are unchanged"


@pytest.mark.parametrize("form", sorted(FORMS))
def test_rerunning_the_mutation_on_its_output_changes_nothing(form: str) -> None:
    out, _warnings = mutated(pod(FORMS[form]))
    again = plan_pod_create(out, policy(), {})
    assert again.ops == [] and again.managed


@pytest.mark.parametrize("form", sorted(FORMS))
def test_annotations_are_written_with_the_safe_default_at_create(form: str) -> None:
    out, _warnings = mutated(pod(FORMS[form]))
    notes = out["metadata"]["annotations"]
    assert notes[contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS] == "false"
    assert notes[contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER] == "0"
    argv, env = container_process(out, out["spec"]["containers"][0])
    assert effective_compilation_config(vllm_tokens(argv, env))["pass_config"]["fuse_allreduce_rms"] is False


def test_exec_token_never_expands_to_an_empty_argument_even_without_the_annotation() -> None:
    out, _warnings = mutated(pod(FORMS["production-stack"]))
    del out["metadata"]["annotations"][contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS]
    argv, _env = container_process(out, out["spec"]["containers"][0])
    assert all(argv) and argv[-1] == "-cc.pass_config.fuse_allreduce_rms="


@pytest.mark.parametrize(
    "container",
    [
        {"name": "vllm", "image": "vllm/vllm-openai", "command": ["sh", "-c", "vllm serve m --port 8000"]},
        {"name": "vllm", "image": "vllm/vllm-openai", "command": ["vllm", "serve", "m", "--config", "/etc/v.yaml"]},
        {"name": "vllm", "image": "vllm/vllm-openai", "command": ["vllm", "serve", "m", "--compilation", "{}"]},
        {"name": "vllm", "image": "vllm/vllm-openai", "command": ["vllm", "serve", "m", "-cc", "3"]},
        {"name": "vllm", "image": "vllm/vllm-openai", "command": ["vllm", "serve", "m", "-cc", "{not json"]},
        {"name": "vllm", "image": "vllm/vllm-openai", "command": ["vllm", "serve", "m", "--compilation-config"]},
        {"name": "vllm", "image": "my/vllm-server:1", "args": ["--model", "m"]},
        {"name": "vllm", "image": "vllm/vllm-openai", "command": ["/entrypoint.sh"], "args": ["serve"]},
        {"name": "vllm", "image": "vllm/vllm-openai", "command": ["vllm", "serve", "m", "--", "x"]},
        {"name": "vllm", "image": "vllm/vllm-openai", "command": "vllm serve m"},
    ],
    ids=[
        "shell-without-placeholder",
        "config-file",
        "abbreviated-flag",
        "json-not-an-object",
        "json-broken",
        "flag-without-value",
        "args-only-unknown-image",
        "wrapper-script",
        "double-dash",
        "command-not-a-list",
    ],
)
def test_a_command_fiar_does_not_understand_is_left_exactly_as_it_was(container: dict[str, Any]) -> None:
    out, warnings = mutated(pod(container))
    changed = out["spec"]["containers"][0]
    env = changed.pop("env", [])
    assert changed == container, "command, args and everything else unchanged"
    assert [e["name"] for e in env] == [contract.ENV_VAR, *(g.env for g in contract.MULTICAST_GUARD)], (
        "the backend variable and the guard, as before"
    )
    assert any("fusion not controlled" in w for w in warnings)
    assert not plan_command(container).understood


@pytest.mark.parametrize(
    "container",
    [
        {"name": "vllm", "command": ["vllm", "serve", "m", "-cc.pass_config.fuse_allreduce_rms=true"]},
        {"name": "vllm", "command": ["vllm", "serve", "m", "-cc", '{"pass_config":{"fuse_allreduce_rms":true}}']},
        {"name": "vllm", "command": ["vllm", "serve", "m", '-cc.pass_config={"fuse_allreduce_rms":true}']},
    ],
    ids=["dotted", "json", "dotted-pass-config"],
)
def test_a_users_own_fusion_setting_is_kept_under_respect_explicit_fusion(container: dict[str, Any]) -> None:
    out, warnings = mutated(pod(container))
    changed = out["spec"]["containers"][0]
    assert changed["command"] == container["command"] and "args" not in changed
    assert [e["name"] for e in changed["env"]] == [contract.ENV_VAR, *(g.env for g in contract.MULTICAST_GUARD)]
    assert any("respectExplicitFusion" in w for w in warnings)
    overridden, _warnings = mutated(pod(container), policy(respectExplicitFusion=False))
    argv, _env = container_process(bound(overridden, "off"), overridden["spec"]["containers"][0])
    assert effective_compilation_config(argv)["pass_config"]["fuse_allreduce_rms"] is False


def test_a_users_own_standalone_allreduce_setting_is_kept_unless_told_otherwise() -> None:
    container = {**FORMS["production-stack"], "env": [{"name": contract.ENV_ALLREDUCE_USE_FLASHINFER, "value": "1"}]}
    out, _warnings = mutated(pod(container))
    _argv, env = container_process(bound(out, "off"), out["spec"]["containers"][0])
    assert env[contract.ENV_ALLREDUCE_USE_FLASHINFER] == "1"
    out, _warnings = mutated(pod(container), policy(respectExplicitFusion=False))
    _argv, env = container_process(bound(out, "off"), out["spec"]["containers"][0])
    assert env[contract.ENV_ALLREDUCE_USE_FLASHINFER] == "0"


def test_fusion_control_disabled_changes_no_command_but_feeds_a_placeholder() -> None:
    out, _warnings = mutated(pod(FORMS["production-stack"]), policy(fusionControl="Disabled"))
    assert out["spec"]["containers"][0]["command"] == FORMS["production-stack"]["command"]
    assert "args" in out["spec"]["containers"][0] and out["spec"]["containers"][0]["args"] == [
        "--tensor-parallel-size",
        "2",
    ]
    out, _warnings = mutated(pod(FORMS["lws-shell-placeholder"]), policy(fusionControl="Disabled"))
    argv, _env = container_process(out, out["spec"]["containers"][0])
    assert "-cc.pass_config.fuse_allreduce_rms=null" in argv[2]


def test_audit_changes_no_command() -> None:
    out, _warnings = mutated(pod(FORMS["production-stack"]), policy(mode="Audit"))
    assert out["spec"]["containers"][0] == FORMS["production-stack"]


def test_a_later_variable_may_refer_to_fiars_variables() -> None:
    container = {
        **FORMS["lws-shell-placeholder"],
        "env": [{"name": "EXTRA", "value": "--enforce-eager $(FIAR_VLLM_ARGS)"}],
    }
    out, _warnings = mutated(pod(container))
    _argv, env = container_process(bound(out, "off"), out["spec"]["containers"][0])
    assert env["EXTRA"] == "--enforce-eager -cc.pass_config.fuse_allreduce_rms=false"


def test_a_pod_copied_with_fiars_variables_but_no_policy_gets_vllms_defaults() -> None:
    out, _warnings = mutated(pod(FORMS["production-stack"]))
    copied = copy.deepcopy(out)
    copied["metadata"] = {"name": "copy", "namespace": "ml"}
    ops = default_backend_ops(copied)
    notes = patches.apply(copied, ops)["metadata"]["annotations"]
    assert notes == {
        contract.ANNOTATION_POD_BACKEND: "auto",
        contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS: "null",
        contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER: "1",
        **{g.annotation: g.own for g in contract.MULTICAST_GUARD},
    }


def test_kubelet_expansion_rules() -> None:
    env = {"A": "x", "EMPTY": ""}
    assert expand("$(A)-$(EMPTY)-$(MISSING)-$$(A)-$(A", env) == "x--$(MISSING)-$(A)-$(A"
    assert DOTTED_FLAG == "-cc.pass_config.fuse_allreduce_rms=$(FIAR_FUSE_ALLREDUCE_RMS)"


def test_a_multi_pod_group_without_an_imex_channel_claim_is_warned_at_create() -> None:
    source = pod(FORMS["production-stack"])
    source["metadata"]["labels"] = {"leaderworkerset.sigs.k8s.io/group-key": "g"}
    source["metadata"]["annotations"] = {"leaderworkerset.sigs.k8s.io/size": "2"}
    _out, warnings = mutated(source)
    assert any("IMEX channel claim" in w for w in warnings)
    source["spec"]["resourceClaims"] = [{"name": "mnnvl-claim", "resourceClaimTemplateName": "cd-0"}]
    source["spec"]["containers"][0]["resources"] = {"claims": [{"name": "mnnvl-claim"}]}
    _out, warnings = mutated(source)
    assert not any("IMEX channel claim" in w for w in warnings)


def test_overriding_a_users_standalone_setting_leaves_no_duplicate_behind() -> None:
    own = {"name": contract.ENV_ALLREDUCE_USE_FLASHINFER, "value": "1"}
    container = {**FORMS["production-stack"], "env": [own, {"name": "A", "value": "x"}, own]}
    out, _warnings = mutated(pod(container), policy(respectExplicitFusion=False))
    names = [e["name"] for e in out["spec"]["containers"][0]["env"]]
    assert names.count(contract.ENV_ALLREDUCE_USE_FLASHINFER) == 1
    _argv, env = container_process(bound(out, "off"), out["spec"]["containers"][0])
    assert env[contract.ENV_ALLREDUCE_USE_FLASHINFER] == "0"
    assert plan_pod_create(out, policy(respectExplicitFusion=False), {}).ops == []


@pytest.mark.parametrize(
    "container",
    [
        {"name": "istio-proxy", "image": "istio/proxyv2:1.24", "args": ["proxy", "sidecar"]},
        {"name": "vllm-worker", "image": "rayproject/ray:2.40", "command": ["sh", "-c", "ray start --block"]},
    ],
    ids=["sidecar", "ray-worker"],
)
def test_a_container_that_names_vllm_nowhere_is_neither_changed_nor_reported(container: dict[str, Any]) -> None:
    out, warnings = mutated(pod(container))
    changed = out["spec"]["containers"][0]
    assert {k: v for k, v in changed.items() if k != "env"} == container
    assert not any("fusion not controlled" in w for w in warnings)
    assert pod_record(out).uncontrolled == ()
    shell = {"name": "vllm", "image": "vllm/vllm-openai", "command": ["sh", "-c", "vllm serve m"]}
    assert pod_record(mutated(pod(shell))[0]).uncontrolled == ("vllm",)


# -- values that reach a shell -------------------------------------------------------------------------
HOSTILE = "false $(touch {marker}) --trust-remote-code"


@pytest.mark.parametrize("form", ["llmisvc-additional-args", "shell-quoted-placeholder"])
def test_a_shell_form_gives_vllm_the_annotation_as_one_argument_and_runs_none_of_it(form: str, tmp_path: Any) -> None:
    """Whatever the annotation holds (the chart's admission policy lets only the cluster admin write a
    value outside fiar's), the shell expands it once, quoted: one argument, never a command."""
    marker = tmp_path / "ran"
    out, _warnings = mutated(pod(FORMS[form]))
    hostile = bound(out, "off")
    hostile["metadata"]["annotations"][contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS] = HOSTILE.format(marker=marker)
    argv, env = container_process(hostile, out["spec"]["containers"][0])
    tokens = vllm_tokens(argv, env)
    assert f"-cc.pass_config.fuse_allreduce_rms={HOSTILE.format(marker=marker)}" in tokens
    assert "--trust-remote-code" not in tokens and not marker.exists()


def test_an_escaped_reference_in_a_users_json_is_not_written_out_for_the_kubelet() -> None:
    container = copy.deepcopy(FORMS["user-json"])
    container["command"][4] = '{"note": "\\u0024(HF_TOKEN)", "pass_config": {}}'
    plan = plan_command(container)
    assert not plan.understood and "'$('" in plan.reason
    out, warnings = mutated(pod(container))
    assert out["spec"]["containers"][0]["command"] == container["command"]
    assert any("fusion not controlled" in w for w in warnings)


def test_a_shell_string_without_a_placeholder_is_told_the_quoted_form() -> None:
    plan = plan_command({"name": "vllm", "image": "vllm/vllm-openai", "command": ["sh", "-c", "vllm serve m"]})
    assert not plan.understood and '"${FIAR_VLLM_ARGS}"' in plan.reason


def test_an_eval_fiar_cannot_place_is_not_understood() -> None:
    container = copy.deepcopy(FORMS["llmisvc-additional-args"])
    container["command"][2] = 'eval "$PRELUDE"; exec vllm serve /mnt/models ${VLLM_ADDITIONAL_ARGS} $@'
    plan = plan_command(container)
    assert not plan.understood and "eval" in plan.reason


@pytest.mark.parametrize("key", sorted(set(contract.POD_ANNOTATION_VALUES) - {contract.ANNOTATION_POD_SGLANG_FLAG}))
def test_a_value_outside_the_allowlist_is_read_as_absent_and_replaced_by_vllms_default(key: str) -> None:
    out, _warnings = mutated(pod(FORMS["production-stack"]))
    copied = copy.deepcopy(out)
    copied["metadata"] = {"name": "copy", "namespace": "ml", "annotations": {key: "false $(id)"}}
    record = pod_record(copied)
    assert record.annotation(key) is None
    notes = patches.apply(copied, default_backend_ops(copied))["metadata"]["annotations"]
    assert all(contract.pod_annotation_value(k, v) == v for k, v in notes.items())
    assert notes[key] != "false $(id)"
