"""A tiny TLS admission-webhook server on 127.0.0.1 and the configuration that points the API server at it.

The harness tests use it to prove the admission mechanisms the operator depends on (pod CREATE and
pods/binding mutation) on the pinned Kubernetes version, independently of the operator's own code.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from devcluster import pki

Review = dict[str, Any]
Mutator = Callable[[Review], list[dict[str, Any]]]
"""Takes the AdmissionReview request, returns a JSONPatch (possibly empty)."""


class WebhookServer:
    """Serve ``/<name>`` paths with mutators; each answers an AdmissionReview with a JSONPatch."""

    def __init__(self, ca: pki.CertificateAuthority, workdir: Path, mutators: dict[str, Mutator]) -> None:
        self.mutators = mutators
        self.requests: list[Review] = []
        pair = ca.issue("fiar-test-webhook", hosts=("127.0.0.1", "localhost"))
        crt, key = pair.write(workdir, "test-webhook")
        self.ca_bundle = ca.cert_pem
        server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.port}/{name}"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                review = json.loads(self.rfile.read(length))
                outer.requests.append(review)
                # The API server appends "?timeout=Ns" to the configured URL.
                mutator = outer.mutators.get(urllib.parse.urlsplit(self.path).path.strip("/"))
                request = review["request"]
                response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
                patch = mutator(request) if mutator else []
                if patch:
                    response["patchType"] = "JSONPatch"
                    response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
                body = json.dumps(
                    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return

        return Handler


def mutating_configuration(
    name: str,
    webhooks: list[tuple[str, str, str, str]],
    ca_bundle: bytes,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A MutatingWebhookConfiguration; each webhook is ``(name, url, resource, operation)``.

    ``namespace`` limits every webhook to that namespace (by its kubernetes.io/metadata.name label).
    """
    entries = []
    for hook_name, url, resource, operation in webhooks:
        entry: dict[str, Any] = {
            "name": hook_name,
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": [operation],
                    "resources": [resource],
                    "scope": "Namespaced",
                }
            ],
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 5,
        }
        if namespace:
            entry["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        entries.append(entry)
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": entries,
    }
