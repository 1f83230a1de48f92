"""An admission webhook that allows everything and changes nothing: the floor of any webhook.

The same serving stack as fiar's operator (aiohttp over TLS, one Python process), answering every
AdmissionReview with ``allowed: true`` and no patch, on the event loop. ``operator_create_latency.py``
registers it with fiar's webhook configuration (configuration ``noop``), so the cost of fiar's pod
webhook can be told from the cost of calling any webhook on this machine. With ``--patch`` it gives
every pod labelled app=vllm that fixed JSONPatch (configuration ``patch``: fiar's own patch for the
benchmark's managed pod, so the API server's cost of applying it is told from fiar's).

    python bench/noop_webhook.py --port P --cert serving.crt --key serving.key
"""

from __future__ import annotations

import argparse
import json
import ssl

from aiohttp import web

PATCH: str | None = None
"""With ``--patch``: the JSONPatch (base64) given to every pod labelled app=vllm, computed nowhere."""


async def review(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    uid = str((body.get("request") or {}).get("uid", ""))
    response: dict[str, object] = {"uid": uid, "allowed": True}
    labels = ((body.get("request") or {}).get("object") or {}).get("metadata", {}).get("labels") or {}
    if PATCH is not None and labels.get("app") == "vllm":
        response.update(patchType="JSONPatch", patch=PATCH)
    answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    return web.json_response(answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--patch", help="a fixed JSONPatch (base64) for pods labelled app=vllm")
    args = parser.parse_args()
    global PATCH
    PATCH = args.patch
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    app = web.Application(client_max_size=4 << 20)
    app.router.add_post("/{tail:.*}", review)
    web.run_app(app, host="127.0.0.1", port=args.port, ssl_context=context, print=None, access_log=None)


if __name__ == "__main__":
    main()
