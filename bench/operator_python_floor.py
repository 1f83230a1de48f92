"""What one Python process pays per unit of the operator's work, measured on a real API server (one run).

watch event     CPU of the watching thread per pod event read from the API server's watch
                stream (TLS, HTTP chunks, ``fiar_kube.WatchLines``, ``json.loads``), beside
                ``json.loads`` of the same events alone; pods made, labelled and deleted by
                another process, so that nothing else in this one holds the GIL
request         CPU per request through ``fiar_kube.Client`` on a kept connection: an Event
                POST (the reconciler's Warnings) and a GET (a webhook's bounded read), on the
                client's own lane (``fiar_kube.Lane``) beside urllib3's pool
thread hop      CPU of the whole process per call handed from an asyncio loop to a thread pool
                and awaited (``asyncio.wrap_future``, as the webhook server hands each review
                to a review thread), beside the call made on the loop
TLS connection  resident memory per open TLS connection of the webhook port (100 connections,
                each having sent a 9 KB review), asyncio's 256 KiB read buffer beside
                ``transport.TLS_READ_BUFFER``
imports         resident memory after the operator's imports, with the kubernetes client (as
                kopf imports it when installed) and without (``cli.leave_out_generated_client``)

PYTHONPATH=tools .venv/bin/python bench/operator_python_floor.py
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import fiar_kube
from devcluster import pki
from devcluster.cluster import ControlPlane, Tier
from fiar_operator.reconcile import events
from fiar_operator.state import kube

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

LOAD = r"""
import concurrent.futures, sys
sys.path.insert(0, sys.argv[3])
from operator_fleet import pod_body
from fiar_operator.state import kube
k = kube.Kube(kube.configuration(sys.argv[1]))
tag = sys.argv[2]
def life(i):
    name = f"p{tag}-{i}"
    body = pod_body(i, f"node-{i}", "floor")
    body["metadata"]["name"] = name
    k.call("POST", "/api/v1/namespaces/floor/pods", body=body)
    k.call("PATCH", f"/api/v1/namespaces/floor/pods/{name}", body={"metadata": {"labels": {"x": "y"}}},
           content_type="application/merge-patch+json")
    k.call("DELETE", f"/api/v1/namespaces/floor/pods/{name}", query={"gracePeriodSeconds": 0})
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    list(pool.map(life, range(int(sys.argv[4]))))
"""


def watch_event(plane: ControlPlane, client: kube.Kube, pods: int) -> dict[str, float]:
    """CPU per watch event of the watching thread, and of json.loads alone on the same lines."""
    listing = client.list("/api/v1/pods")
    for _ in listing:
        pass
    wanted = 3 * pods
    lines: list[bytes] = []
    seen = {"cpu": 0.0}

    def watch() -> None:
        mark = time.thread_time()
        for n, event in enumerate(client.watch("/api/v1/pods", listing.resource_version, timeout_seconds=120), 1):
            seen["cpu"] += time.thread_time() - mark
            lines.append(json.dumps(event).encode())  # not counted: the clock is read again below
            if n >= wanted:
                return
            mark = time.thread_time()

    thread = threading.Thread(target=watch)
    thread.start()
    time.sleep(0.5)
    argv = [sys.executable, "-c", LOAD, str(plane.kubeconfig), str(time.monotonic_ns()), str(HERE), str(pods)]
    subprocess.run(argv, check=True, timeout=300)
    thread.join(120)
    started = time.thread_time()
    for line in lines:
        json.loads(line)
    decode = time.thread_time() - started
    return {
        "events": len(lines),
        "bytes_per_event": sum(map(len, lines)) / max(len(lines), 1),
        "watch_us_per_event": 1e6 * seen["cpu"] / max(len(lines), 1),
        "json_loads_us_per_event": 1e6 * decode / max(len(lines), 1),
    }


def requests(client: kube.Kube, n: int) -> dict[str, float]:
    """CPU per Event POST and per GET on a kept connection: on ``fiar_kube.Lane`` (how the operator
    and the agent send requests) and through urllib3 (``lane=False``), alternated in rounds."""
    target = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "floor", "uid": "u"}}
    event = events.Event(target, "Warning", "FlashInferNotTurnedOff", "m" * 300)
    pooled = kube.Kube(client.configuration)
    pooled.client = fiar_kube.Client(client.configuration, user_agent="fiar-operator", lane=False)
    spent: dict[str, float] = {}
    for _ in range(3):
        for name, k in (("lane", client), ("urllib3", pooled)):
            for _ in range(20):
                events.post(k, event, "bench")
            started = time.thread_time()
            for _ in range(n):
                events.post(k, event, "bench")
            spent[f"event_post_us_{name}"] = spent.get(f"event_post_us_{name}", 0.0) + time.thread_time() - started
            started = time.thread_time()
            for _ in range(n):
                k.call("GET", "/api/v1/namespaces/floor")
            spent[f"get_us_{name}"] = spent.get(f"get_us_{name}", 0.0) + time.thread_time() - started
    return {key: 1e6 * value / (3 * n) for key, value in spent.items()}


def thread_hop(n: int) -> dict[str, float]:
    pool = concurrent.futures.ThreadPoolExecutor(4)

    def review() -> bytes:
        return b"{}"

    async def run() -> dict[str, float]:
        results: dict[str, float] = {}
        for mode in ("hop", "on_loop"):
            started = time.process_time()
            for _ in range(n):
                if mode == "hop":
                    await asyncio.wait_for(asyncio.wrap_future(pool.submit(review)), 1.0)
                else:
                    review()
            results[f"{mode}_process_us"] = 1e6 * (time.process_time() - started) / n
        return results

    try:
        return asyncio.run(run())
    finally:
        pool.shutdown()


SERVER = r"""
import asyncio, sys
from aiohttp import web
from fiar_operator.admission import transport
async def review(request):
    await request.read()
    return web.Response(body=b"{}", content_type="application/json")
async def main():
    app = web.Application()
    app.router.add_post("/mutate/pods", review)
    tls = transport.TlsFiles(sys.argv[1], sys.argv[2])
    runner = await transport.open_site(app, "127.0.0.1", 0, tls, transport.Connections(512), transport.DEFAULT_BOUNDS)
    print(transport.bound_port(runner), flush=True)
    await asyncio.sleep(3600)
loop = transport.ServerLoop() if sys.argv[3] == "small" else asyncio.new_event_loop()
loop.run_until_complete(main())
"""


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def tls_connections(workdir: Path, connections: int = 100) -> dict[str, float]:
    ca = pki.CertificateAuthority()
    crt, key = ca.issue("floor", hosts=("127.0.0.1",)).write(workdir, "serving")
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    body = b"x" * 9000
    head = b"POST /mutate/pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    results: dict[str, float] = {}
    for buffer in ("asyncio", "small"):
        server = subprocess.Popen([sys.executable, "-c", SERVER, str(crt), str(key), buffer], stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            time.sleep(0.3)
            before = _rss_mib(server.pid)
            held = []
            for _ in range(connections):
                sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1")
                sock.sendall(head % len(body) + body)
                sock.recv(65536)
                held.append(sock)
            time.sleep(0.3)
            results[f"{buffer}_kib_per_connection"] = (_rss_mib(server.pid) - before) * 1024 / connections
            for sock in held:
                sock.close()
        finally:
            server.kill()
            server.wait()
    return results


IMPORTS = r"""
import sys
if sys.argv[1] == "without":
    from fiar_operator import cli
    cli.leave_out_generated_client()
import fiar_operator.cli, fiar_operator.handlers, fiar_operator.runtime, kopf
for line in open("/proc/self/status"):
    if line.startswith("VmRSS:"):
        print(int(line.split()[1]) / 1024, "kubernetes.client" in sys.modules)
"""


def imports() -> dict[str, Any]:
    results: dict[str, Any] = {}
    for mode in ("with", "without"):
        out = subprocess.run([sys.executable, "-c", IMPORTS, mode], capture_output=True, text=True, check=True)
        rss, loaded = out.stdout.split()
        results[f"{mode}_client_mib"] = float(rss)
        results[f"{mode}_client_loaded"] = loaded == "True"
    return results


def main() -> None:
    print(f"# {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    with tempfile.TemporaryDirectory() as tmp, ControlPlane(Path(tmp) / "plane", Tier.A) as plane:
        client = kube.Kube(kube.configuration(str(plane.kubeconfig)))
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "floor"}}
        client.call("POST", "/api/v1/namespaces", body=namespace)
        for _ in range(2):
            print(json.dumps({"watch_event": watch_event(plane, client, 1000)}))
        print(json.dumps({"request": requests(client, 500)}))
        print(json.dumps({"thread_hop": thread_hop(5000)}))
        print(json.dumps({"tls_connection": tls_connections(Path(tmp))}))
    print(json.dumps({"imports": imports()}))


if __name__ == "__main__":
    main()
