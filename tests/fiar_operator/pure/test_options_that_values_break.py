"""Every row of the option-breaks table over every node case, command form and option spelling: the pod
never gets a value its option makes vLLM refuse, the decision says what it left out, and deciding again
over the mutated pod gives the same decision (docs/vllm-flashinfer-paths.md, options that fiar's
values break)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

import fiar_contract as contract
from fiar_operator.admission.mutation import plan_pod_create
from fiar_operator.core import commands, options, patches
from fiar_operator.core.decide import decide, pending
from fiar_operator.core.pods import pod_options, pod_record, vllm_release
from fiar_operator.reconcile.rules import not_applied, not_applied_message, pod_outcome

from .builders import policy, shape_plan

B, MN, T, W, C = (
    contract.LABEL_BACKEND,
    contract.LABEL_MNNVL,
    contract.LABEL_TRTLLM,
    contract.LABEL_MNNVL_WORKSPACE,
    contract.LABEL_CLIQUE,
)
CLIQUE = "6f1c2b8e-4d3a-4f0e-9b7c-5a1d2e3f4a5b.32766"
NODES: dict[str, dict[str, str]] = {
    "mnnvl": {B: "mnnvl", MN: "pass", T: "pass", W: "created", C: CLIQUE},
    "mnnvl-trtllm-failed": {B: "mnnvl", MN: "pass", T: "fail", W: "created", C: CLIQUE},
    "trtllm": {B: "trtllm", MN: "skipped", T: "pass"},
    "none-no-multicast": {B: "none", MN: "fail", T: "pass", W: "no-multicast"},
    "none-failed-on-every-rank": {B: "none", MN: "fail", T: "fail", W: "failed-on-every-rank"},
    "none": {B: "none", MN: "fail", T: "fail"},
    "unprobed": {},
}
SHAPES = ("single", "group-pinned-imex")
MUSE = '{"decode_backend":"latency_specialized"}'
# Each row's option in every spelling vLLM's parser takes (JSON, `=`, dotted, dotted + separate value).
SPELLINGS: dict[str, dict[str, list[str]]] = {
    "muse-spark-latency-specialized": {
        "json": ["--additional-config", MUSE, "-tp", "8"],
        "equals": [f"--additional-config={MUSE}", "--tensor-parallel-size=16"],
        "dotted": ["--additional-config.decode_backend=latency_specialized", "-tp", "8"],
        "dotted-separate": ["--additional_config.decode_backend", "latency_specialized", "-tp=8"],
    },
    "hisparse-mnnvl": {
        "json": ["-ac", '{"hisparse_config":{}}'],
        "equals": ['--attention-config={"hisparse_config":{"device_buffer_size":4096}}'],
        "dotted": ["-ac.hisparse_config.device_buffer_size=4096"],
        "connector": ["--kv-transfer-config", '{"kv_connector":"HiSparseConnector","kv_role":"kv_both"}'],
        "multi-connector": [
            "--kv-transfer-config",
            json.dumps(
                {
                    "kv_connector": "MultiConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"connectors": [{"kv_connector": "HiSparseConnector"}]},
                }
            ),
        ],
        "connector-dotted": ["--kv-transfer-config.kv_connector=HiSparseConnector"],
    },
}
RELEASES = ("0.33.0", "0.34.0", None)


def container(form: str, extra: list[str], release: str | None) -> dict[str, Any]:
    image = f"vllm/vllm-openai:v{release}" if release else "registry.example/serving:latest"
    model = ["deepseek-ai/DeepSeek-V3.2"]
    if form == "vllm-serve":
        return {"name": "vllm", "image": image, "command": ["vllm", "serve", *model, *extra]}
    if form == "api-server":
        argv = ["python3", "-m", commands.API_SERVER_MODULE, "--model", *model, *extra]
        return {"name": "vllm", "image": image, "command": argv}
    if form == "image-entrypoint":
        return {"name": "vllm", "image": f"vllm/vllm-openai:v{release or '0.34.0'}", "args": [*model, *extra]}
    if form == "shell":
        script = " ".join(["exec vllm serve", *model, *(f"'{e}'" for e in extra), '"${FIAR_VLLM_ARGS}"'])
        return {"name": "vllm", "image": image, "command": ["sh", "-c", script]}
    assert form == "kserve"
    return {
        "name": "vllm",
        "image": image,
        "command": ["bash", "-c", "vllm serve /mnt/models ${VLLM_ADDITIONAL_ARGS} $@", "--"],
        "args": ["--port", "8000"],
        "env": [{"name": "VLLM_ADDITIONAL_ARGS", "value": " ".join(f"'{e}'" for e in extra)}],
    }


FORMS = ("vllm-serve", "api-server", "image-entrypoint", "shell", "kserve")


def pod(c: dict[str, Any]) -> dict[str, Any]:
    labels = {contract.LABEL_POD_POLICY: "vllm"}
    return {"metadata": {"name": "p", "namespace": "ml", "uid": "u1", "labels": labels}, "spec": {"containers": [c]}}


def decided(p: dict[str, Any], node: str, shape: str, chosen: Any = None) -> Any:
    chosen = chosen or policy()
    record = pod_record(p)
    labels = NODES[node]
    nodes = {node: labels}
    return decide(
        chosen,
        node,
        labels if labels else None,
        shape_plan(shape),
        nodes,
        release=vllm_release(record, chosen),
        options=pod_options(record, chosen),
    )


def breaks(row: str, annotations: dict[str, str], release: str | None) -> list[str]:
    """What of ``annotations`` the release's check refuses for the row (tp 8/16 given)."""
    found = []
    line = None if release is None else tuple(int(x) for x in release.split(".")[:2])
    if row == "muse-spark-latency-specialized" and (line is None or line >= (0, 34)):
        if annotations[contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER] == "0":
            found.append("VLLM_ALLREDUCE_USE_FLASHINFER=0")
        if annotations[contract.ANNOTATION_POD_BACKEND] not in ("auto", "mnnvl"):
            found.append("backend " + annotations[contract.ANNOTATION_POD_BACKEND])
    hisparse = row == "hisparse-mnnvl" and (line is None or line >= (0, 33))
    if hisparse and annotations[contract.ANNOTATION_POD_BACKEND] == "mnnvl":
        found.append("mnnvl")
    return found


CASES = [
    (row, spelling, form, node, shape, release)
    for row, spellings in SPELLINGS.items()
    for spelling in spellings
    for form in FORMS
    for node in NODES
    for shape in SHAPES
    for release in RELEASES
    if not (form == "image-entrypoint" and release is None)
]


@pytest.mark.parametrize(("row", "spelling", "form", "node", "shape", "release"), CASES)
def test_a_pod_with_the_option_never_gets_a_value_that_breaks_it(
    row: str, spelling: str, form: str, node: str, shape: str, release: str | None
) -> None:
    c = container(form, SPELLINGS[row][spelling], release)
    read = commands.vllm_options(c)
    assert read is not None and options.ROW[row].read_set(read), (read, c)
    decision = decided(pod(c), node, shape)
    annotations = decision.annotations()
    assert breaks(row, annotations, release) == []
    plain = decided(pod(container(form, [], release)), node, shape)
    if breaks(row, plain.annotations(), release):
        assert decision.not_applied, decision
        assert all(options.ROW[row].option in why for why in decision.not_applied)
    # The webhook's CREATE mutation and the decision taken again over the mutated pod: the same.
    out = plan_pod_create(pod(c), policy(), {})
    mutated = patches.apply(copy.deepcopy(pod(c)), out.ops)
    assert breaks(row, out.decision.annotations(), release) == []
    assert decided(mutated, node, shape) == decision


def test_hisparse_on_an_mnnvl_node_runs_trtllm_where_the_node_verifies_it() -> None:
    c = container("vllm-serve", SPELLINGS["hisparse-mnnvl"]["json"], "0.34.0")
    d = decided(pod(c), "mnnvl", "single")
    assert (d.backend, d.fusion, d.reason) == ("trtllm", "on", "Verified")
    assert d.not_applied and d.not_applied[0].startswith("VLLM_FLASHINFER_ALLREDUCE_BACKEND=mnnvl left out")
    d = decided(pod(c), "mnnvl-trtllm-failed", "single")
    assert (d.backend, d.fusion) == ("auto", "off")
    assert "Qwen3.5 (qwen3_5, with its fused norm + FP8/NVFP4 quant)" in d.not_turned_off


def test_hisparse_in_a_multi_pod_group_gets_auto_which_vllm_turns_into_no_flashinfer_backend() -> None:
    c = container("vllm-serve", SPELLINGS["hisparse-mnnvl"]["connector"], "0.34.0")
    d = decided(pod(c), "mnnvl", "group-pinned-imex", policy(multiNode="Always", imexChannel="Provided"))
    assert (d.backend, d.fusion) == ("auto", "off")
    assert d.not_applied


def test_hisparse_never_gets_the_failing_mnnvl_value() -> None:
    c = container("vllm-serve", SPELLINGS["hisparse-mnnvl"]["json"], "0.34.0")
    plain = decided(pod(container("vllm-serve", [], "0.33.0")), "none-no-multicast", "single")
    assert plain.backend == "mnnvl" and plain.off_by  # the release's failing-mnnvl value
    d = decided(pod(c), "none-no-multicast", "single")
    assert (d.backend, d.off_by, d.fusion) == ("trtllm", None, "off")


def test_muse_spark_keeps_the_standalone_allreduce_and_gets_auto_not_trtllm() -> None:
    c = container("vllm-serve", SPELLINGS["muse-spark-latency-specialized"]["json"], "0.34.0")
    d = decided(pod(c), "none", "single")
    a = d.annotations()
    assert a[contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER] == "1"
    assert a[contract.ANNOTATION_POD_FUSE_ALLREDUCE_RMS] == "false"  # compile mode NONE: the pass never runs
    assert len(d.not_applied) == 1 and "VLLM_ALLREDUCE_USE_FLASHINFER=0 left out" in d.not_applied[0]
    d = decided(pod(c), "trtllm", "single")
    assert (d.backend, d.fusion) == ("auto", "on")


def test_muse_spark_at_tp4_keeps_trtllm() -> None:
    extra = ["--additional-config", MUSE, "-tp", "4"]
    d = decided(pod(container("vllm-serve", extra, "0.34.0")), "trtllm", "single")
    assert (d.backend, d.not_applied) == ("trtllm", ())


def test_deepseek_v41_latency_specialized_gets_fiars_whole_decision_its_check_reads_only_multicast() -> None:
    """Its check reads neither fusion nor backend variable (bench/vllm_option_check.py): on 0.33, where the
    Muse Spark row does not apply, its pod gets the fusion off and the guard exactly as any pod."""
    c = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.33.0",
        "command": ["vllm", "serve", "deepseek-ai/DeepSeek-V4.1", "--additional-config", MUSE, "-tp", "4"],
    }
    torch_guard = next(g.annotation for g in contract.MULTICAST_GUARD if g.env == "TORCH_SYMM_MEM_DISABLE_MULTICAST")
    for node, chosen, use_flashinfer, guard in (
        ("none", policy(), "0", "1"),
        ("mnnvl", policy(), "1", "0"),
        ("mnnvl-trtllm-failed", policy(backends=["trtllm"]), "0", "0"),  # multicast works, the fusion off
    ):
        d = decided(pod(c), node, "single", chosen)
        a = d.annotations()
        assert (a[contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER], a[torch_guard]) == (use_flashinfer, guard)
        assert d.not_applied == () and not d.standalone_kept


def test_the_rows_apply_from_the_release_that_has_the_check() -> None:
    muse = container("vllm-serve", SPELLINGS["muse-spark-latency-specialized"]["json"], "0.33.0")
    assert decided(pod(muse), "none", "single").not_applied == ()
    hisparse = container("vllm-serve", SPELLINGS["hisparse-mnnvl"]["json"], "0.32.0")
    assert decided(pod(hisparse), "mnnvl", "single").backend == "mnnvl"


@pytest.mark.parametrize(
    ("extra", "unread"),
    [
        (["--additional-config", "decode_backend=latency_specialized"], "--additional-config: not a JSON object"),
        (["--additional-config", "[1, 2]"], "--additional-config: not a JSON object"),
        (
            ["--additional-config.decode_backend=a", "--additional-config.decode_backend=b"],
            "set twice to different values",
        ),
        (["--additional-config", "{" * 20000], "over 16384 characters"),
        (["-ac"], "--attention-config: without a value"),
        (["--kv-transfer-config", "{'kv_connector': 'HiSparseConnector'}"], "--kv-transfer-config: not a JSON object"),
    ],
)
def test_an_option_fiar_cannot_read_is_never_guessed_every_row_it_may_set_applies(
    extra: list[str], unread: str
) -> None:
    c = container("vllm-serve", [*extra, "-tp", "8"], "0.34.0")
    read = commands.vllm_options(c)
    assert read is not None and any(unread in u for u in read.unread), read
    for node in ("mnnvl", "none-no-multicast", "trtllm"):
        d = decided(pod(c), node, "single")
        a = d.annotations()
        flag = extra[0].split("=")[0].split(".")[0]
        if flag in ("--additional-config",):
            assert a[contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER] == "1"
            assert a[contract.ANNOTATION_POD_BACKEND] in ("auto", "mnnvl")
        else:
            assert a[contract.ANNOTATION_POD_BACKEND] != "mnnvl"
        assert all("could not read" in why for why in d.not_applied)


def test_a_shell_string_fiar_cannot_split_leaves_out_every_value_any_row_refuses() -> None:
    c = {"name": "vllm", "image": "vllm/vllm-openai:v0.34.0", "command": ["sh", "-c", "vllm serve m '-ac"]}
    d = decided(pod(c), "mnnvl", "single")
    # HiSparse may be set (no mnnvl) and Muse Spark's option at TP 8 may be (no trtllm): auto, fusion off,
    # the standalone allreduce as the container sets it.
    assert (d.backend, d.fusion, d.standalone_kept) == ("auto", "off", True)
    assert len(d.not_applied) == 2 and all("could not read" in why for why in d.not_applied)


def test_a_release_tag_that_names_no_release_counts_as_any_release() -> None:
    c = container("vllm-serve", SPELLINGS["muse-spark-latency-specialized"]["json"], None)
    c["image"] = "vllm/vllm-openai:nightly"
    d = decided(pod(c), "none", "single")
    assert d.release is None and d.standalone_kept


def test_a_pod_without_the_options_is_decided_as_before() -> None:
    for node in NODES:
        for release in RELEASES:
            c = container("vllm-serve", ["--additional-config", '{"other":1}', "-tp", "8"], release)
            assert pod_record(pod(c)).options == ()
            d = decided(pod(c), node, "single")
            assert d.not_applied == () and not d.standalone_kept


def test_the_pending_decision_leaves_the_values_out_too() -> None:
    c = container("vllm-serve", SPELLINGS["muse-spark-latency-specialized"]["json"], "0.34.0")
    record = pod_record(pod(c))
    d = pending(policy(), vllm_release(record, policy()), pod_options(record, policy()))
    assert d.annotations()[contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER] == "1" and d.not_applied


def test_the_decision_names_what_it_left_out_counts_it_and_words_the_warning() -> None:
    c = container("vllm-serve", SPELLINGS["hisparse-mnnvl"]["json"], "0.34.0")
    d = decided(pod(c), "mnnvl", "single")
    doc = json.loads(d.to_json())
    assert doc["notApplied"] == list(d.not_applied)
    bound = pod(c)
    bound["metadata"]["labels"] = {contract.LABEL_POD_POLICY: "vllm"}
    bound["metadata"]["annotations"] = d.annotations()
    bound["spec"]["nodeName"] = "mnnvl"
    record = pod_record(bound)
    assert not_applied(record) == list(d.not_applied)
    assert "valuesNotApplied" in pod_outcome(record, policy())
    message = not_applied_message(record, not_applied(record))
    assert "vLLM 0.34.0" in message and "HiSparse" in message


def test_fusion_control_disabled_still_never_writes_mnnvl_for_hisparse() -> None:
    c = container("vllm-serve", SPELLINGS["hisparse-mnnvl"]["json"], "0.34.0")
    d = decided(pod(c), "mnnvl", "single", policy(fusionControl="Disabled"))
    assert d.backend == "trtllm" and d.fusion == "on"


def test_before_0_34_hisparse_gets_trtllm_where_the_nodes_mnnvl_works_because_auto_would_try_mnnvl() -> None:
    c = container("vllm-serve", SPELLINGS["hisparse-mnnvl"]["json"], "0.33.0")
    d = decided(pod(c), "mnnvl-trtllm-failed", "single")
    assert (d.backend, d.fusion) == ("trtllm", "off")
    c34 = container("vllm-serve", SPELLINGS["hisparse-mnnvl"]["json"], "0.34.0")
    assert decided(pod(c34), "mnnvl-trtllm-failed", "single").backend == "auto"  # 0.34's auto gives trtllm itself


def test_the_options_of_a_pod_no_policy_manages_are_never_read() -> None:
    c = container("vllm-serve", SPELLINGS["hisparse-mnnvl"]["json"], "0.34.0")
    p = pod(c)
    p["metadata"]["labels"] = {}
    assert pod_record(p).options == ()
