"""The measurements of a smoke test: every rank's ``ok`` events merged into one ``Measurements``.

Pure. Every step's duration is merged (max over ranks); what else an ``ok`` event of a step
carries (versions, JIT, numerics, latency, benchmark points) is merged by that step's function in
``STEP_MERGES``, the worst rank counting. A new measurement is one function and one line there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from node_agent.smoke.outcome import BenchPoint, Measurements, SmokeRequest


@dataclass
class _Merging:
    """The measurements while they are merged, event by event."""

    steps: dict[str, float] = field(default_factory=dict)
    jit: dict[str, Any] = field(default_factory=dict)
    numerics: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)
    bench: dict[tuple[int, int], BenchPoint] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)


def _merge_import(m: _Merging, event: Mapping[str, Any]) -> None:
    if not m.versions:
        m.versions = dict(event.get("versions", {}))


def _merge_jit(m: _Merging, event: Mapping[str, Any]) -> None:
    m.jit["seconds"] = m.steps["jit"]
    m.jit["cached"] = bool(event.get("cached", False)) and m.jit.get("cached", True)
    if "source" in event:
        m.jit["source"] = event["source"]


def _merge_check(m: _Merging, event: Mapping[str, Any]) -> None:
    m.numerics[f"{event.get('step')}_checks"] = int(event.get("checks", 0))
    err = float(event.get("max_abs_err", 0.0))
    m.numerics["max_abs_err"] = max(float(m.numerics.get("max_abs_err", 0.0)), err)


def _merge_timing(m: _Merging, event: Mapping[str, Any]) -> None:
    for key in ("eager_us", "graph_us"):
        if key in event:
            m.latency[key] = round(max(m.latency.get(key, 0.0), float(event[key])), 2)


def _merge_benchmark(m: _Merging, event: Mapping[str, Any]) -> None:
    for raw in event.get("points", ()):
        point = BenchPoint.from_dict(raw)
        where = (point.hidden, point.tokens)
        old = m.bench.get(where)
        if old is None:
            m.bench[where] = point
            continue
        graph = [g for g in (old.backend_graph_us, point.backend_graph_us) if g is not None]
        m.bench[where] = BenchPoint(
            point.hidden,
            point.tokens,
            max(old.nccl_us, point.nccl_us),
            max(old.backend_us, point.backend_us),
            max(graph) if graph else None,
        )


STEP_MERGES: Mapping[str, Callable[[_Merging, Mapping[str, Any]], None]] = {
    "import": _merge_import,
    "jit": _merge_jit,
    "eager": _merge_check,
    "graph": _merge_check,
    "timing": _merge_timing,
    "benchmark": _merge_benchmark,
}
"""What an ``ok`` event of a step adds besides its duration (which every step has)."""


def merge(request: SmokeRequest, ranks: Sequence[Sequence[Mapping[str, Any]]]) -> Measurements:
    """Every rank's ``ok`` events as one set of measurements."""
    m = _Merging()
    for events in ranks:
        for e in events:
            if e.get("status") != "ok":
                continue
            step = str(e.get("step"))
            m.steps[step] = round(max(m.steps.get(step, 0.0), float(e.get("dt", 0.0))), 4)
            merge_step = STEP_MERGES.get(step)
            if merge_step is not None:
                merge_step(m, e)
    if m.numerics:
        m.numerics["reference"] = "sum over ranks computed in fp32 from the same bf16 inputs"
        m.numerics["shape"] = [request.tokens, request.hidden]
    return Measurements(m.steps, m.jit, m.numerics, m.latency, tuple(m.bench[k] for k in sorted(m.bench)), m.versions)
