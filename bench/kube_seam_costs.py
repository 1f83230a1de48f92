"""What the hand-written parts of ``fiar_kube`` cost per call, beside what they replaced (one run).

    authorization header  the in-cluster token: the kubernetes package's refresh hook (re-reads the
                          file once a minute) beside ``fiar_kube.TokenFile`` (one stat per request,
                          re-read when the file changed)
    watch lines           one 1 MiB watch event arriving in 4 KiB chunks: the agent's former
                          ``buffer += chunk; split`` beside ``fiar_kube.WatchLines`` (one bytearray)

    .venv/bin/python bench/kube_seam_costs.py
"""

from __future__ import annotations

import json
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path

from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader

import fiar_kube


def _best(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number


def authorization() -> tuple[float, float]:
    folder = Path(tempfile.mkdtemp())
    (folder / "token").write_text("t" * 900)  # a bound service-account token is about 900 bytes
    (folder / "ca.crt").write_text("-")
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}
    stock = client.Configuration()
    InClusterConfigLoader(str(folder / "token"), str(folder / "ca.crt"), environ=environ).load_and_set(stock)
    ours = fiar_kube.load_config(None, environ=environ, service_account=str(folder))
    return (
        _best(lambda: fiar_kube.authorization(stock), 20_000),
        _best(lambda: fiar_kube.authorization(ours), 20_000),
    )


def _split_before(chunks: list[bytes]) -> int:
    events, buffer = 0, b""
    for chunk in chunks:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                json.loads(line)
                events += 1
    return events


def _split_now(chunks: list[bytes]) -> int:
    lines = fiar_kube.WatchLines()
    return sum(len(lines.feed(chunk)) for chunk in chunks)


def watch_lines() -> tuple[float, float]:
    event = json.dumps({"type": "MODIFIED", "object": {"metadata": {"annotations": {"a": "x" * (1 << 20)}}}})
    stream = event.encode() + b"\n"
    chunks = [stream[i : i + 4096] for i in range(0, len(stream), 4096)]
    assert _split_before(chunks) == _split_now(chunks) == 1
    return _best(lambda: _split_before(chunks), 5), _best(lambda: _split_now(chunks), 5)


def main() -> None:
    stock, ours = authorization()
    print("| what | before | fiar_kube | ratio |")
    print("|---|---|---|---|")
    row = "| {} | {:.1f} {unit} | {:.1f} {unit} | {:.2f} |"
    print(row.format("authorization header, in-cluster token", stock * 1e6, ours * 1e6, ours / stock, unit="us"))
    before, now = watch_lines()
    print(row.format("one 1 MiB watch event in 4 KiB chunks", before * 1e3, now * 1e3, now / before, unit="ms"))


if __name__ == "__main__":
    main()
