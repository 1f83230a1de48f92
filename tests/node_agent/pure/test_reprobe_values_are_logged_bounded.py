"""A hostile ``fiar.io/reprobe`` value reaches the agent's log as one short, escaped line."""

from __future__ import annotations

import logging

import pytest

import fiar_contract as contract
from node_agent.daemon import Agent, DaemonConfig, shown
from node_agent.hardware import SimulatedHardware
from node_agent.metrics import AgentMetrics, Health
from node_agent.probe import ProbeConfig
from node_agent.publish import NodePublisher, NodeState


def _agent() -> Agent:
    config = DaemonConfig(node_name="gpu-0", kubeconfig=None, probe=ProbeConfig())
    publisher = NodePublisher(client_config=None, node_name="gpu-0")  # never called here
    return Agent(config, SimulatedHardware("h200x2-host"), publisher, AgentMetrics(), Health(60.0))


@pytest.mark.parametrize(
    "value",
    [
        "now\n2026-12-01 00:00:00,000 WARNING forged line",
        "x" * 200 * 1024,
        "\r\x1b[2Kcleared\u2028next",
        "",
    ],
)
def test_a_reprobe_value_is_logged_as_one_bounded_line(value: str, caplog: pytest.LogCaptureFixture) -> None:
    agent = _agent()
    with caplog.at_level(logging.INFO, logger="fiar-agent"):
        agent.on_node_state(NodeState({}, {contract.ANNOTATION_REPROBE: value}))
    lines = [r.getMessage() for r in caplog.records if "reprobe requested" in r.getMessage()]
    assert len(lines) == 1
    line = lines[0]
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u2028" not in line
    assert len(line) < 300


def test_shown_keeps_short_values_whole_and_says_how_long_a_cut_one_was() -> None:
    assert shown("now") == "'now'"
    assert shown("a" * 1000).endswith("... (1000 characters)")
