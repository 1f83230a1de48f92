"""Every API answer is typed in one place (fiar_kube), and both components decide by that type."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

import fiar_kube as kube
from node_agent.errors import ApiUnavailable, NodeNotFound, PublishRejected, publish_error

from .conftest import Answer, Loopback, Seen

STATUS_TYPES = [
    (401, kube.Unauthorized),
    (403, kube.Forbidden),
    (404, kube.NotFound),
    (409, kube.Conflict),
    (410, kube.Gone),
    (422, kube.Invalid),
    (400, kube.Rejected),
    (405, kube.Rejected),
    (408, kube.Unavailable),
    (429, kube.Unavailable),
    (500, kube.Unavailable),
    (503, kube.Unavailable),
    (504, kube.Unavailable),
    (None, kube.Unavailable),
]


@pytest.mark.parametrize(("status", "kind"), STATUS_TYPES)
def test_each_status_has_one_type(status: int | None, kind: type[kube.ApiError]) -> None:
    assert kube.error_type(status) is kind
    error = kube.error_for(status, "x")
    assert type(error) is kind and error.status == status


def test_refusals_share_a_base_and_transient_errors_do_not() -> None:
    for kind in (kube.Unauthorized, kube.Forbidden, kube.Invalid):
        assert issubclass(kind, kube.Rejected)
    for kind in (kube.NotFound, kube.Conflict, kube.Gone, kube.Unavailable):
        assert not issubclass(kind, kube.Rejected)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}, kube.Gone),
        ({"kind": "Status", "code": 500, "message": "etcd"}, kube.Unavailable),
        ({"kind": "Status", "code": "410"}, kube.Unavailable),  # not a number: never taken for 410
        ({"kind": "Status", "code": True}, kube.Unavailable),
        ({}, kube.Unavailable),
        (["not", "a", "status"], kube.Unavailable),
    ],
)
def test_watch_error_events_are_typed_by_their_status(status: Any, kind: type[kube.ApiError]) -> None:
    assert type(kube.status_error(status)) is kind


def test_a_hostile_status_message_is_bounded() -> None:
    error = kube.status_error({"code": 403, "message": "x" * 100_000, "reason": "y" * 100_000})
    assert len(str(error)) <= kube.MAX_ERROR_BODY + 20 and len(error.reason) <= 100


@pytest.mark.parametrize(
    ("error", "agent"),
    [
        (kube.NotFound("n", 404), NodeNotFound),
        (kube.Unavailable("u", 503), ApiUnavailable),
        (kube.Unavailable("no answer"), ApiUnavailable),
        (kube.Forbidden("f", 403), PublishRejected),
        (kube.Conflict("c", 409), PublishRejected),
        (kube.Invalid("i", 422), PublishRejected),
        (ValueError("a stream that is not JSON"), ApiUnavailable),
    ],
)
def test_the_agent_maps_the_seam_types_onto_its_own(error: BaseException, agent: type[Exception]) -> None:
    assert type(publish_error(error)) is agent


def configuration(host: str) -> Any:
    cfg = client.Configuration(host=host)
    cfg.api_key["BearerToken"] = "Bearer t"
    return cfg


def answering(status: int, body: Any) -> Callable[[Seen], Answer]:
    return lambda seen: Answer(status, body)


@pytest.mark.parametrize(("status", "kind"), [s for s in STATUS_TYPES if s[0] is not None])
def test_a_real_answer_raises_its_type_with_the_status_message(
    serve: Callable[..., Loopback], status: int, kind: type[kube.ApiError]
) -> None:
    server = serve(answering(status, {"kind": "Status", "code": status, "message": "the API server says no"}))
    api = kube.Client(configuration(server.url), user_agent="test", environ={})
    with pytest.raises(kind) as raised:
        api.request("GET", "/api/v1/nodes/a")
    assert raised.value.status == status
    assert f"GET /api/v1/nodes/a: HTTP {status} the API server says no" == str(raised.value)


def test_a_successful_answer_is_decoded_and_carries_the_token(serve: Callable[..., Loopback]) -> None:
    server = serve(answering(200, {"kind": "Node", "metadata": {"name": "a"}}))
    api = kube.Client(configuration(server.url), user_agent="fiar-test/1", environ={})
    assert api.request("PATCH", "/api/v1/nodes/a", body={"x": 1}, content_type=kube.MERGE_PATCH) == {
        "kind": "Node",
        "metadata": {"name": "a"},
    }
    seen = server.seen[0]
    assert seen.headers["Authorization"] == "Bearer t" and seen.headers["User-Agent"] == "fiar-test/1"
    assert seen.headers["Content-Type"] == kube.MERGE_PATCH and seen.body == b'{"x": 1}'


def test_a_successful_answer_that_is_not_json_is_unavailable(serve: Callable[..., Loopback]) -> None:
    server = serve(answering(200, b"<html>a proxy's page</html>"))
    api = kube.Client(configuration(server.url), user_agent="t", environ={})
    with pytest.raises(kube.Unavailable, match="GET /api/v1/nodes: the answer is not JSON"):
        api.request("GET", "/api/v1/nodes")


def test_an_error_answer_is_read_only_up_to_its_bound(serve: Callable[..., Loopback]) -> None:
    server = serve(answering(500, b"x" * (1 << 20)))
    api = kube.Client(configuration(server.url), user_agent="t", environ={})
    with pytest.raises(kube.Unavailable) as raised:
        api.request("GET", "/api/v1/nodes")
    assert len(raised.value.body) <= kube.MAX_ERROR_BODY


def test_query_parameters_are_encoded_and_none_left_out(serve: Callable[..., Loopback]) -> None:
    server = serve(answering(200, {}))
    api = kube.Client(configuration(server.url), user_agent="t", environ={})
    api.request("GET", "/api/v1/pods", {"labelSelector": "a in (b,c)", "continue": None, "limit": 5})
    assert server.seen[0].path == "/api/v1/pods?labelSelector=a+in+%28b%2Cc%29&limit=5"


def test_a_refused_connection_is_unavailable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = kube.Client(configuration(f"http://127.0.0.1:{port}"), user_agent="t", environ={})
    with pytest.raises(kube.Unavailable) as raised:
        api.request("GET", "/api/v1/nodes")
    assert raised.value.status is None


def test_a_silent_server_is_unavailable_after_the_read_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        api = kube.Client(configuration(f"http://127.0.0.1:{listener.getsockname()[1]}"), user_agent="t", environ={})
        start = time.monotonic()
        with pytest.raises(kube.Unavailable):
            api.request("GET", "/api/v1/nodes", timeout=(1.0, 0.5))
        assert time.monotonic() - start < 5
