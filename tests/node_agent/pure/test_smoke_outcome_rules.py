"""The smoke test's outcome rules, each on its own, their order, and the merge of the ranks' measurements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from node_agent.childproc import ChildResult
from node_agent.smoke import rules
from node_agent.smoke.measure import merge
from node_agent.smoke.outcome import BenchPoint, Measurements, SmokeRequest
from node_agent.smoke.rules import Ending, Ruling

REQUEST = SmokeRequest("trtllm", (0, 1), 30.0)
TO_JIT: list[dict[str, Any]] = [{"step": s, "status": "ok", "dt": 0.5} for s in ("import", "init", "jit")]
TO_GRAPH: list[dict[str, Any]] = [*TO_JIT, *({"step": s, "status": "ok", "dt": 0.1} for s in ("workspace", "eager"))]
DONE: list[dict[str, Any]] = [*TO_GRAPH, {"step": "graph", "status": "ok"}, {"step": "done", "status": "done"}]


def child(
    returncode: int | None = 0, stderr: str = "", timed_out: bool = False, cancelled: bool = False
) -> ChildResult:
    return ChildResult(("supervisor",), returncode, timed_out, cancelled, "", stderr, 2.5)


def end(
    *ranks: Sequence[Mapping[str, Any]],
    supervisor: Mapping[str, Any] | None = None,
    result: ChildResult | None = None,
) -> Ending:
    return Ending(REQUEST, ranks, supervisor, result or child())


def fail(step: str, error: str, kind: str = "error") -> dict[str, Any]:
    return {"step": step, "status": "fail", "kind": kind, "error": error}


def test_a_timeout_names_the_step_of_every_unfinished_rank() -> None:
    ruling = rules.timed_out(end(DONE, [*TO_JIT, {"step": "graph", "status": "start"}], result=child(timed_out=True)))
    assert ruling == Ruling(
        "timeout", "hang", "no result within 30s (rank 1 in graph); the whole process group was killed", True
    )
    assert rules.timed_out(end(DONE, DONE)) is None


def test_a_timeout_before_any_rank_started_blames_the_launcher() -> None:
    ruling = rules.timed_out(end(result=child(timed_out=True)))
    assert ruling is not None and "(the launcher)" in ruling.reason


def test_a_stopped_agent_skips_the_test_as_degraded() -> None:
    assert rules.cancelled(end(result=child(cancelled=True))) == Ruling(
        "skipped", "cancelled", "the agent was stopped during the test", True
    )


def test_missing_software_is_unavailable_and_degraded() -> None:
    ruling = rules.software_missing(end([{"step": "import", "status": "missing", "error": "No module named torch"}]))
    assert ruling == Ruling(
        "skipped", "unavailable", "torch or FlashInfer is not importable: No module named torch", True
    )


def test_a_policy_refusal_is_a_conclusive_skip() -> None:
    ruling = rules.refused(end([{"step": "init", "status": "refused", "error": "multicast forbidden"}]))
    assert ruling == Ruling("skipped", "policy", "multicast forbidden", False)


def test_kernels_not_prebuilt_without_a_message_ends_cleanly() -> None:
    ruling = rules.not_prebuilt(end([{"step": "jit", "status": "not_prebuilt"}]))
    assert ruling == Ruling("skipped", "not_prebuilt", "kernels are not prebuilt and JIT was not allowed", True)


def test_only_the_first_terminal_event_of_a_rank_counts() -> None:
    ranks = end([fail("workspace", "boom"), {"step": "x", "status": "missing"}])
    assert rules.software_missing(ranks) is None
    assert rules.failed_step(ranks) == Ruling("fail", "error", "rank 0, step workspace: boom", step="workspace")


def test_an_infrastructure_failure_on_any_rank_says_the_backend_was_not_tested() -> None:
    ranks = end(
        [*TO_GRAPH, fail("graph", "CUDA error: misaligned")],
        [*TO_JIT, fail("workspace", "OSError: No space left on device")],
    )
    ruling = rules.untested_failure(ranks)
    assert ruling is not None and (ruling.result, ruling.kind, ruling.degraded) == ("skipped", "infrastructure", True)
    assert ruling.reason.startswith("rank 1, step workspace: an error of the host's resources")


def test_a_failed_step_keeps_the_kind_the_rank_reported() -> None:
    assert rules.untested_failure(end([*TO_JIT, fail("workspace", "null", "null_mc_ptr")])) is None
    ruling = rules.failed_step(end([*TO_JIT, fail("workspace", "null", "null_mc_ptr")]))
    assert ruling == Ruling("fail", "null_mc_ptr", "rank 0, step workspace: null", step="workspace")


@pytest.mark.parametrize(
    ("events", "code", "result", "kind"),
    [
        (TO_GRAPH, -11, "fail", "crash"),  # past the backend's first step: the backend crashed
        (TO_JIT, -11, "skipped", "startup"),  # before it: the backend was not tested
        (TO_GRAPH, -9, "skipped", "infrastructure"),  # SIGKILL from outside: the OOM killer
    ],
)
def test_a_rank_killed_by_a_signal_the_supervisor_did_not_send(
    events: list[dict[str, Any]], code: int, result: str, kind: str
) -> None:
    ruling = rules.rank_signal(end(events, DONE, supervisor={"returncodes": [code, 0], "killed": []}))
    assert ruling is not None and (ruling.result, ruling.kind) == (result, kind)
    assert ruling.reason.startswith("rank 0 died with SIG")


def test_a_rank_the_supervisor_killed_is_not_a_crash() -> None:
    assert rules.rank_signal(end(TO_GRAPH, DONE, supervisor={"returncodes": [-9, 0], "killed": [0]})) is None


@pytest.mark.parametrize(
    ("events", "returncode", "result", "kind"),
    [
        (TO_GRAPH, -11, "fail", "crash"),
        (TO_JIT, -11, "skipped", "startup"),
        (TO_GRAPH, -9, "skipped", "infrastructure"),
    ],
)
def test_a_supervisor_that_died_without_a_summary(
    events: list[dict[str, Any]], returncode: int, result: str, kind: str
) -> None:
    ruling = rules.supervisor_signal(end(events, result=child(returncode)))
    assert ruling is not None and (ruling.result, ruling.kind) == (result, kind)
    assert rules.supervisor_signal(end(events, supervisor={"returncodes": []}, result=child(returncode))) is None


def test_every_rank_done_is_a_pass_and_a_missing_rank_is_not() -> None:
    assert rules.all_done(end(DONE, DONE)) == Ruling("pass", "ok", "")
    assert rules.all_done(end(DONE)) is None


def test_ranks_that_exited_before_the_backend_are_untested_and_name_an_infrastructure_error() -> None:
    ruling = rules.no_verdict(
        end(TO_JIT, DONE, supervisor={"returncodes": [1, 0]}, result=child(1, "OSError: Too many open files"))
    )
    assert (ruling.result, ruling.kind, ruling.degraded) == ("skipped", "infrastructure", True)
    assert ruling.reason.startswith("rank 0 exited with 1 during after jit: ")
    assert ruling.reason.endswith("| OSError: Too many open files")


def test_a_rank_that_exited_in_the_backend_s_steps_without_a_verdict_failed() -> None:
    ruling = rules.no_verdict(end(TO_GRAPH, DONE, supervisor={"returncodes": [1, 0]}))
    assert ruling == Ruling("fail", "error", "rank 0 exited with 1 during after eager")


def test_the_rules_are_asked_in_the_documented_order() -> None:
    assert (
        rules.timed_out,
        rules.cancelled,
        rules.software_missing,
        rules.refused,
        rules.not_prebuilt,
        rules.untested_failure,
        rules.failed_step,
        rules.rank_signal,
        rules.supervisor_signal,
        rules.all_done,
    ) == rules.OUTCOME_RULES


def test_a_timeout_wins_over_a_failure_the_ranks_reported() -> None:
    ruling = rules.rule(end([*TO_JIT, fail("workspace", "boom")], result=child(timed_out=True)))
    assert ruling.result == "timeout"


def test_when_no_rule_applies_the_test_ended_without_a_verdict() -> None:
    assert rules.rule(end(TO_GRAPH, DONE, supervisor={"returncodes": [0, 0]})).kind == "error"


def test_merge_keeps_the_worst_rank_of_every_measurement() -> None:
    point = {"hidden": 4096, "tokens": 8, "nccl_us": 40.0, "backend_us": 20.0}
    rank0 = [
        {"step": "import", "status": "ok", "dt": 1.0, "versions": {"torch": "2.11.0"}},
        {"step": "jit", "status": "ok", "dt": 3.0, "cached": True, "source": "prebuilt"},
        {"step": "eager", "status": "ok", "dt": 0.2, "checks": 3, "max_abs_err": 0.01},
        {"step": "timing", "status": "ok", "dt": 0.1, "eager_us": 10.0},
        {"step": "benchmark", "status": "ok", "dt": 1.0, "points": [point]},
    ]
    rank1 = [
        {"step": "import", "status": "ok", "dt": 2.0, "versions": {"torch": "other"}},
        {"step": "jit", "status": "ok", "dt": 1.0, "cached": False},
        {"step": "eager", "status": "ok", "dt": 0.1, "checks": 3, "max_abs_err": 0.02},
        {"step": "timing", "status": "ok", "dt": 0.1, "eager_us": 12.0, "graph_us": 5.0},
        {
            "step": "benchmark",
            "status": "ok",
            "dt": 1.0,
            "points": [{**point, "backend_us": 25.0, "backend_graph_us": 9.0}],
        },
        {"step": "graph", "status": "fail", "dt": 9.0},  # not ok: not a measurement
    ]
    measured = merge(REQUEST, [rank0, rank1])
    assert measured == Measurements(
        steps={"import": 2.0, "jit": 3.0, "eager": 0.2, "timing": 0.1, "benchmark": 1.0},
        jit={"seconds": 3.0, "cached": False, "source": "prebuilt"},
        numerics={
            "eager_checks": 3,
            "max_abs_err": 0.02,
            "reference": "sum over ranks computed in fp32 from the same bf16 inputs",
            "shape": [REQUEST.tokens, REQUEST.hidden],
        },
        latency_us={"eager_us": 12.0, "graph_us": 5.0},
        bench=(BenchPoint(4096, 8, 40.0, 25.0, 9.0),),
        versions={"torch": "2.11.0"},
    )


def test_merge_of_no_events_is_empty() -> None:
    assert merge(REQUEST, [[], []]) == Measurements()


def test_a_new_rule_is_one_function_and_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    def driver_reset(end: Ending) -> Ruling | None:
        if "Xid 79" in end.child.stderr:
            return Ruling("skipped", "infrastructure", "the GPU fell off the bus", True)
        return None

    monkeypatch.setattr(rules, "OUTCOME_RULES", (driver_reset, *rules.OUTCOME_RULES))
    outcome = rules.classify(REQUEST, [DONE, DONE], {"returncodes": [0, 0]}, child(0, "NVRM: Xid 79"), {})
    assert (outcome.result, outcome.reason) == ("skipped", "the GPU fell off the bus")
    assert outcome.measured.steps["import"] == 0.5, "the measurements are merged whatever the rule"
