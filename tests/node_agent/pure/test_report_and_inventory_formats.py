"""The recorded-host format round-trips; the report annotation is versioned, compact and bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from node_agent import hardware, inventory, report
from node_agent.errors import FixtureError
from node_agent.probe import ProbeConfig, probe
from node_agent.smoke.outcome import BenchPoint, Measurements, SmokeOutcome

SHIPPED = sorted(p.stem for p in hardware.FIXTURES.glob("*.json"))


@pytest.mark.parametrize("name", SHIPPED)
def test_fixture_round_trips(name: str) -> None:
    doc = json.loads((hardware.FIXTURES / f"{name}.json").read_text())
    inv = inventory.from_dict(doc)
    assert inventory.from_dict(inventory.to_dict(inv)) == inv
    assert len(inv.gpus) == len(doc["gpus"])


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"gpus": {}}, "gpus: expected a list"),
        ({"gpus": [{"index": 0, "nvlinks": [{"active": "yes"}]}]}, "gpus[0].nvlinks[0].active: expected an integer"),
        ({"gpus": [{"index": 0, "cc": [9]}]}, "gpus[0].cc: expected [major, minor]"),
        ({"gpus": [{"index": 0}, {"index": 0}]}, "duplicate index"),
        ({"gpus": [{"index": 0, "fabric_v2": {"state": 3, "clusterUuid": "xyz"}}]}, "expected 32 hex digits"),
        ({"p2p": {"0-1": {}}}, "p2p: bad key '0-1'"),
        ({"env": {"NCCL_NVLS_ENABLE": 0}}, "env: expected an object of strings"),
    ],
)
def test_malformed_hosts_are_named_precisely(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(FixtureError, match=message.replace("[", r"\[").replace("]", r"\]")):
        inventory.from_dict(doc)


def test_modelled_fixture_without_a_source_is_rejected(tmp_path: Path) -> None:
    doc = json.loads((hardware.FIXTURES / "h200x2-host.json").read_text())
    doc["modelled"] = True
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FixtureError, match="must cite the report it models"):
        hardware.load_fixture(path)


def test_unknown_simulated_outcome_is_rejected(tmp_path: Path) -> None:
    doc = json.loads((hardware.FIXTURES / "h200x2-host.json").read_text())
    doc["simulate"] = {"smoke": {"trtllm": {"outcome": "maybe"}}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(FixtureError, match="outcome 'maybe'"):
        hardware.load_fixture(path)


def test_report_is_versioned_and_other_versions_are_ignored() -> None:
    result = probe(hardware.SimulatedHardware(Path("h200x2-host")), ProbeConfig(), environ={})
    text = report.dumps(result.report)
    assert ", " not in text.split('"reasons"')[0] and ": " not in text.split('"reasons"')[0], "compact JSON"
    doc = report.loads(text)
    assert doc is not None
    for key in ("schema", "version", "agent", "probe_time", "status", "labels", "reasons", "versions", "inventory",
                "fingerprint", "policy", "tests", "benchmark", "config"):  # fmt: skip
        assert key in doc
    assert doc["versions"]["driver"] == "580.159.04"
    assert doc["versions"]["cuda_driver"] == "13.0"
    assert report.loads(text.replace('"version":1', '"version":2')) is None
    assert report.loads("not json") is None
    assert report.loads(None) is None


def test_oversized_report_drops_benchmark_points_first() -> None:
    result = probe(hardware.SimulatedHardware(Path("h200x2-host")), ProbeConfig(), environ={})
    points = tuple(BenchPoint(h, t, 50.0, 40.0, 4.0) for h in range(4096, 4096 + 3000) for t in (1,))
    big = dict(result.report)
    slow = SmokeOutcome("trtllm", "pass", "ok", measured=Measurements(bench=points))
    big["tests"] = {**big["tests"], "trtllm": slow.to_dict()}
    text = report.dumps(big)
    assert len(text.encode()) <= report.MAX_BYTES
    assert "bench" not in json.loads(text)["tests"]["trtllm"]
    assert json.loads(text)["labels"] == result.labels


HOSTILE = [
    ("[" * 100_000 + "]" * 100_000, "not JSON (RecursionError)"),
    ('{"a":' * 20_000 + "1" + "}" * 20_000, "not JSON (RecursionError)"),
    (" " * (report.MAX_READ_BYTES + 1), "over the"),
    ("[1, 2]", "not an object"),
    ('{"schema":"fiar.io/probe-report","version":1,"tests":[1]}', "tests is a list"),
    ('{"schema":"fiar.io/probe-report","version":1,"labels":"x"}', "labels is a str"),
    ('{"schema":"fiar.io/probe-report","version":1,"fingerprint":{"a":1}}', "fingerprint is a dict"),
]


@pytest.mark.parametrize(("text", "why"), HOSTILE)
def test_a_hostile_report_annotation_is_no_report(text: str, why: str) -> None:
    doc, reason = report.parse(text)
    assert doc is None
    assert reason is not None and why in reason
    assert report.loads(text) is None


def test_odd_test_entries_of_a_previous_report_are_ignored() -> None:
    result = probe(hardware.SimulatedHardware(Path("h200x2-host")), ProbeConfig(), environ={})
    doc = json.loads(report.dumps(result.report))
    doc["tests"]["trtllm"]["bench"] = ["not a point"]
    doc["labels"]["fiar.io/backend"] = "definitely"
    parsed, why = report.PreviousReport.parse(json.dumps(doc))
    assert parsed is not None, why
    fingerprint = result.report["fingerprint"]
    assert report.reusable_tests(parsed, fingerprint) == {}
    assert report.previous_verdict(parsed, fingerprint, True) is None, "a label value outside the contract"


def test_a_test_entry_with_a_number_too_large_for_an_int_is_left_out_without_a_traceback() -> None:
    result = probe(hardware.SimulatedHardware(Path("h200x1-device")), ProbeConfig(), environ={})
    doc = json.loads(report.dumps(result.report))
    doc["tests"]["trtllm"]["devices"] = [1e999]  # valid JSON; int() of it raises OverflowError
    parsed, why = report.PreviousReport.parse(json.dumps(doc))
    assert parsed is not None, why
    assert set(parsed.tests) == {"mnnvl"}, "the odd entry is left out, the other one kept"
    assert report.reusable_tests(parsed, result.report["fingerprint"]) == {}


@pytest.mark.parametrize("steps", [{"import": "x"}, {"import": None}, {"import": [1]}])
def test_a_test_entry_whose_step_times_are_not_numbers_is_left_out(steps: dict[str, Any]) -> None:
    result = probe(hardware.SimulatedHardware(Path("h200x1-device")), ProbeConfig(), environ={})
    doc = json.loads(report.dumps(result.report))
    doc["tests"]["trtllm"]["steps"] = steps
    parsed, why = report.PreviousReport.parse(json.dumps(doc))
    assert parsed is not None, why
    assert set(parsed.tests) == {"mnnvl"}


def test_a_report_without_a_probe_time_is_no_previous_report() -> None:
    result = probe(hardware.SimulatedHardware(Path("h200x1-device")), ProbeConfig(), environ={})
    doc = json.loads(report.dumps(result.report))
    del doc["probe_time"]
    assert report.PreviousReport.parse(json.dumps(doc)) == (None, "no probe_time")


def test_a_previous_report_read_back_from_the_annotation_equals_the_probe_it_came_from() -> None:
    result = probe(hardware.SimulatedHardware(Path("h200x1-device")), ProbeConfig(), environ={})
    parsed, why = report.PreviousReport.parse(report.dumps(result.report))
    assert parsed == result.as_previous(), why


ODD_VALUES: list[Any] = [None, True, -1, 1e999, "x", "9" * 5000, [], {}, [1e999], {"a": None}, [["x"]]]


def _field_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    children = doc.items() if isinstance(doc, dict) else enumerate(doc[:2]) if isinstance(doc, list) else ()
    for key, value in children:
        found.append((*prefix, key))
        found += _field_paths(value, (*prefix, key))
    return found


def test_any_field_of_a_report_set_to_an_odd_value_is_read_without_a_traceback() -> None:
    result = probe(hardware.SimulatedHardware(Path("h200x2-host")), ProbeConfig(benchmark=False), environ={})
    fingerprint = result.report["fingerprint"]
    base = json.loads(report.dumps(result.report))
    variants = 0
    for path in _field_paths(base):
        for value in ODD_VALUES:
            doc = json.loads(json.dumps(base))
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = value
            parsed, why = report.PreviousReport.parse(json.dumps(doc))
            assert parsed is not None or why
            report.reusable_tests(parsed, fingerprint)
            for policy in (True, False):
                report.previous_verdict(parsed, fingerprint, policy)
                report.previous_verdict(parsed, None, policy)
            variants += 1
    assert variants > 1000
