"""/healthz fails while any part of the operator has stopped making progress: an event loop that
no longer turns (kopf's, on the main thread), the reconciler, or review threads that all hang. The
webhook server's own loop answers /healthz, so its hang shows as a probe timeout."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import pki
from devcluster.waiting import wait_for
from fiar_operator.admission.server import Bounds, Server, _Progress
from fiar_operator.core.liveness import Heartbeats

from .held_server import HeldAdmission, start_held_server

BOUNDS = Bounds(workers=1, work_deadline=0.3, pool_stall=0.5)


def post_review(server: Server, workdir: Path, uid: str) -> int:
    request = {"uid": uid, "operation": "CREATE", "namespace": "ml", "object": {"metadata": {}, "spec": {}}}
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
    context = ssl.create_default_context(cafile=str(workdir / "ca.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=5)
    try:
        conn.request("POST", "/mutate/pods", body.encode(), {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def healthz(server: Server, timeout: float = 5) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, HeldAdmission, Path]]:
    server, admission = start_held_server(pki.CertificateAuthority(), tmp_path, BOUNDS)
    yield server, admission, tmp_path
    admission.release.set()
    server.stop()


def test_a_heartbeat_silent_beyond_its_bound_is_named_until_it_beats_again() -> None:
    clock = Clock()
    beats = Heartbeats(clock)
    beats.expect("reconciler", 60)
    beats.beat("unknown")  # never expected: ignored
    clock.now += 60
    assert beats.silent() == []
    clock.now += 1
    assert beats.silent() == [("reconciler", 61)]
    beats.beat("reconciler")
    assert beats.silent() == []
    beats.forget("reconciler")
    clock.now += 1000
    assert beats.silent() == []


def test_a_blocked_event_loop_makes_healthz_fail_and_recovers_when_it_turns_again(
    served: tuple[Server, HeldAdmission, Path],
) -> None:
    server, _, _ = served
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    pulse = asyncio.run_coroutine_threadsafe(server.heartbeats.pulse("kopf-loop", within=0.4, every=0.05), loop)
    try:
        assert healthz(server)[0] == 200
        # The loop runs a call that blocks it for 3 s: the beats stop being due after 0.4 s, and the
        # probe has the rest of the 3 s to see it (1.5 s was too little once on a clean-clone run).
        loop.call_soon_threadsafe(time.sleep, 3.0)
        unhealthy = wait_for(lambda: (got := healthz(server))[0] == 503 and got, 2.8, "unhealthy")
        assert "no progress: kopf-loop" in unhealthy[1]
        wait_for(lambda: healthz(server)[0] == 200, 5, "healthy again once the loop turns")
    finally:
        pulse.cancel()
        time.sleep(0.2)  # the task ends on the loop, then the loop stops
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_review_threads_that_all_hang_make_healthz_fail(served: tuple[Server, HeldAdmission, Path]) -> None:
    server, admission, workdir = served
    assert healthz(server)[0] == 200
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answered = pool.submit(post_review, server, workdir, "held")  # holds the one review thread
        assert answered.result(5) == 200, "the review itself is answered at the deadline, unchanged"
        wait_for(lambda: healthz(server)[0] == 503, 5, "unhealthy while no review finishes")
        assert "no review thread finished a review" in healthz(server)[1]
        admission.release.set()
        wait_for(lambda: healthz(server)[0] == 200, 5, "healthy once the thread is free")


def test_a_burst_of_reviews_that_keep_finishing_is_progress() -> None:
    clock = Clock()
    progress = _Progress(clock)
    queued = [concurrent.futures.Future[None]() for _ in range(200)]
    for _ in queued:
        progress.submitted()
    for future in queued:  # 200 reviews queued, one finishing every 0.1 s: 20 s of backlog
        clock.now += 0.1
        future.set_result(None)
        progress.done(future)
        assert progress.stalled(5.0) is None
    clock.now += 60
    assert progress.stalled(5.0) is None, "idle is not a stall"


def test_reviews_that_time_out_behind_hung_threads_are_no_progress() -> None:
    clock = Clock()
    progress = _Progress(clock)
    hung = concurrent.futures.Future[None]()
    progress.submitted()
    for _ in range(70):  # new reviews keep coming and are cancelled at their deadline, unrun
        clock.now += 0.1
        late = concurrent.futures.Future[None]()
        progress.submitted()
        late.cancel()
        progress.done(late)
    assert progress.stalled(5.0) == (1, pytest.approx(7.0))
    hung.set_result(None)
    progress.done(hung)
    assert progress.stalled(5.0) is None
