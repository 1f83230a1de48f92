"""``kubectl fiar status`` shows what the operator holds, read from its ``/indexes`` through the API
server's service proxy; any answer that is not one, or no readable Service, leaves the line out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fiar_kube as kube
from fiar_operator.core.metrics import Metrics
from kubectl_fiar import indexes


def service(name: str, ports: list[str]) -> dict[str, Any]:
    return {"metadata": {"namespace": "fiar-system", "name": name}, "spec": {"ports": [{"name": p} for p in ports]}}


class Api:
    def __init__(self, services: list[dict[str, Any]], answers: dict[str, Any]) -> None:
        self.services, self.answers, self.gets = services, answers, []

    def list(self, path: str, **query: str) -> Iterator[dict[str, Any]]:
        assert path == indexes.SERVICES and query == {"labelSelector": indexes.SELECTOR}
        yield from self.services

    def get(self, path: str) -> Any:
        self.gets.append(path)
        answer = self.answers.get(path)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_the_operators_own_answer_becomes_one_line() -> None:
    metrics = Metrics(lambda: {"pods": 20_000, "nodes": 2_000, "admission_memo": 3}, lambda: {"pods": 21 * 2**20})
    proxy = "/api/v1/namespaces/fiar-system/services/fiar:metrics/proxy/indexes"
    api = Api(
        [service("webhook-only", ["webhook"]), service("fiar", ["webhook", "metrics"])], {proxy: metrics.indexes()}
    )
    where, found = indexes.read(api.list, api.get) or ("", {})
    assert api.gets == [proxy], "a Service without the metrics port is not asked"
    assert indexes.line(where, found) == "operator (fiar-system/fiar) holds 20,000 pods (21.0 MiB), 2,000 nodes\n"


def test_no_readable_service_or_a_hostile_answer_leaves_the_line_out() -> None:
    proxy = "/api/v1/namespaces/fiar-system/services/fiar:metrics/proxy/indexes"
    for answer in (kube.Forbidden("services/proxy"), {"objects": {"pods": "many"}, "bytes": {}}, [1], None):
        api = Api([service("fiar", ["metrics"])], {proxy: answer})
        assert indexes.read(api.list, api.get) is None
    assert indexes.sizes({"objects": {"pods": True}, "bytes": {}}) is None
    assert indexes.sizes({"objects": {"pods": 5, "nodes": -1}, "bytes": {"pods": 2**60}}) == {"pods": 5}
