"""The operator answers every review before the API server gives up on it, by a margin."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from fiar_operator.admission import transport
from fiar_operator.core import settings
from fiar_operator.reconcile import webhookconfig

CHART = Path(__file__).resolve().parents[3] / "charts" / "fiar"


def test_the_webhooks_wait_the_api_servers_minimum_by_default() -> None:
    assert webhookconfig.TIMEOUT_SECONDS == 1
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["operator"]["webhook"]["timeoutSeconds"] == webhookconfig.TIMEOUT_SECONDS
    hooks = webhookconfig.configuration(b"ca", url="https://127.0.0.1:9443")["webhooks"]
    assert {h["timeoutSeconds"] for h in hooks} == {1}


def test_a_stuck_review_is_answered_before_the_shortest_timeout_with_time_to_spare() -> None:
    margin = 0.3  # the API server's connection, the transfer, the wait for the event loop
    assert transport.WORK_DEADLINE + margin <= min(1, webhookconfig.TIMEOUT_SECONDS)
    assert transport.Bounds().work_deadline == transport.WORK_DEADLINE


def test_the_binding_webhooks_read_ends_inside_the_review_deadline() -> None:
    assert settings.MAX_READ_TIMEOUT + 0.1 <= transport.WORK_DEADLINE
    assert settings.Settings().read_timeout <= settings.MAX_READ_TIMEOUT
    schema = json.loads((CHART / "values.schema.json").read_text())
    read = schema["properties"]["operator"]["properties"]["readTimeoutSeconds"]
    assert read["maximum"] == settings.MAX_READ_TIMEOUT
