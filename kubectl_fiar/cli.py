"""``kubectl fiar``: the I/O edge. Reads Nodes, Pods and FiAllreducePolicies, hands them to the pure
core (``model``: facts to view; ``render``/``page``: view to text, JSON, HTML) and prints.

kubectl runs ``kubectl-fiar`` from PATH with the arguments after ``fiar``; the flags follow
kubectl's: ``--kubeconfig``, ``--context``, ``-n/--namespace``, ``-A/--all-namespaces``,
``-o json|wide`` (``--json`` is ``-o json``), ``--request-timeout``. Exit codes: 0 done, 1 an error
(the API refused or could not be reached, no such node or pod), 2 wrong usage. Colour only on a
terminal and never with ``NO_COLOR``.

It reads only what the chart's operator account may read (nodes, pods, fiallreducepolicies: list
and get), so an admin's read-only role does too. Lists are paged (``limit``) and each object is
reduced to its record as it arrives.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, Final, TextIO

import fiar_contract as contract
import fiar_kube as kube
from kubectl_fiar import __version__, indexes, model, render

PAGE: Final = 500
"""Objects per list request (kubectl's own chunk size)."""
POLICIES: Final = f"/apis/{contract.GROUP}/{contract.VERSION}/{contract.PLURAL}"
EXIT_ERROR: Final = 1
EXIT_USAGE: Final = 2


class CliError(Exception):
    """A failure to report in one line (exit 1)."""


def load_config(kubeconfig: str | None, context: str | None) -> Any:
    """kubectl's order: ``--kubeconfig``, else ``$KUBECONFIG`` (a list of files), else ``~/.kube/config``,
    else the in-cluster service account; ``--context`` picks a context of the kubeconfig. Read by the
    seam as client-go reads it (``fiar_kube.load_config``)."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if kubeconfig or os.environ.get("KUBECONFIG") or os.path.exists(path):
        try:
            return kube.load_config(path, context=context)
        except kube.ConfigError as exc:
            raise CliError(model.clean(str(exc), 300)) from exc
    try:
        return kube.load_config(None)
    except kube.ConfigError as exc:
        raise CliError(f"no kubeconfig ({path}) and not in a cluster: {exc}") from exc


class Reader:
    """Paged lists and single reads through ``fiar_kube.Client``."""

    def __init__(self, cfg: Any, timeout_s: float) -> None:
        self.client = kube.Client(cfg, user_agent=f"kubectl-fiar/{__version__}", maxsize=2)
        self.timeout = timeout_s

    def get(self, path: str) -> Any:
        return self.client.request("GET", path, timeout=self.timeout)

    def list(self, path: str, **query: str) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            page = self.client.request("GET", path, {"limit": PAGE, "continue": token, **query}, timeout=self.timeout)
            items = page.get("items") if isinstance(page, dict) else None
            yield from (i for i in (items or []) if isinstance(i, dict))
            token = ((page or {}).get("metadata") or {}).get("continue") if isinstance(page, dict) else None
            if not token:
                return


def _pods_path(namespace: str | None) -> str:
    return f"/api/v1/namespaces/{kube.segment(namespace)}/pods" if namespace else "/api/v1/pods"


def read_nodes(reader: Reader) -> tuple[list[model.NodeView], int]:
    shown, skipped = [], 0
    for node in reader.list("/api/v1/nodes"):
        view = model.node_record(node)
        if view is None:
            skipped += 1
        else:
            shown.append(view)
    return shown, skipped


def read_policies(reader: Reader) -> list[model.PolicyView]:
    try:
        return [model.policy_record(p) for p in reader.list(POLICIES)]
    except kube.NotFound:  # the CRD is not installed
        return []


def managed_pods(reader: Reader, namespace: str | None, **query: str) -> Iterator[model.PodView]:
    for pod in reader.list(_pods_path(namespace), labelSelector=contract.LABEL_POD_POLICY, **query):
        yield model.pod_record(pod)


def fleet(reader: Reader, namespace: str | None, max_age_s: float) -> model.Fleet:
    nodes, skipped = read_nodes(reader)
    pods = managed_pods(reader, namespace)
    return model.fleet(nodes, pods, read_policies(reader), now=time.time(), max_age_s=max_age_s, skipped_nodes=skipped)


def _scope(namespace: str | None) -> str:
    return f"namespace {namespace}" if namespace else "all namespaces"


# -- commands ------------------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace, reader: Reader, out: TextIO) -> int:
    f = fleet(reader, args.namespace, args.probe_max_age)
    held = indexes.read(reader.list, reader.get)
    if args.output == "json":
        doc = render.status_json(f, _scope(args.namespace))
        if held is not None:
            doc["operatorIndexes"] = {"service": held[0], **held[1]}
        _json(doc, out)
    else:
        out.write(render.status_text(f, _style(args, out), _scope(args.namespace)))
        if held is not None:
            out.write(indexes.line(*held))
    return 0


def cmd_report(args: argparse.Namespace, reader: Reader, out: TextIO) -> int:
    from kubectl_fiar import page

    if not args.html:
        raise CliError("report needs --html FILE (the page is written there; '-' for standard output)")
    f = fleet(reader, args.namespace, args.probe_max_age)
    html = page.html(f, _scope(args.namespace))
    if args.html == "-":
        out.write(html)
    else:
        try:
            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(html)
        except OSError as exc:
            raise CliError(f"cannot write {args.html}: {exc.strerror}") from exc
        print(f"wrote {args.html}: {len(f.nodes)} nodes, {len(f.policies)} policies", file=sys.stderr)
    return 0


def cmd_why(args: argparse.Namespace, reader: Reader, out: TextIO) -> int:
    target = list(args.target)
    if target and target[0] in ("node", "nodes", "no") and len(target) == 2:
        target = target[1:]
    if len(target) == 2 and target[0] in ("pod", "pods", "po"):
        return _why_pod(args, reader, out, target[1])
    if len(target) == 1 and target[0].startswith(("pod/", "pods/")):
        return _why_pod(args, reader, out, target[0].split("/", 1)[1])
    if len(target) != 1:
        raise UsageError("why NODE | why pod NAMESPACE/NAME (or: why pod NAME -n NAMESPACE)")
    name = target[0].removeprefix("node/")
    try:
        raw = reader.get(f"/api/v1/nodes/{kube.segment(name)}")
    except kube.NotFound as exc:
        raise CliError(f'Error from server (NotFound): nodes "{model.clean(name, 253)}" not found') from exc
    node = model.node_record(raw if isinstance(raw, dict) else {}, keep_report=True)
    if node is None:
        raise CliError(
            f"node {model.clean(name, 253)} is not a GPU node (no nvidia.com/gpu.present, no fiar.io/ labels)"
        )
    selector = f"spec.nodeName={name}"
    pods = sorted(managed_pods(reader, args.namespace, fieldSelector=selector), key=lambda p: p.key)
    now = time.time()
    if args.output == "json":
        _json(render.why_node_json(node, pods, now), out)
    else:
        out.write(render.why_node_text(node, pods, now, _style(args, out)))
    return 0


def _why_pod(args: argparse.Namespace, reader: Reader, out: TextIO, ref: str) -> int:
    namespace, _, name = ref.rpartition("/")
    namespace = namespace or args.namespace or _context_namespace(args)
    if not name or not namespace:
        raise UsageError("why pod NAMESPACE/NAME (or: why pod NAME -n NAMESPACE)")
    try:
        raw = reader.get(f"/api/v1/namespaces/{kube.segment(namespace)}/pods/{kube.segment(name)}")
    except kube.NotFound as exc:
        raise CliError(f'Error from server (NotFound): pods "{model.clean(name, 253)}" not found') from exc
    pod = model.pod_record(raw if isinstance(raw, dict) else {})
    node = None
    if pod.node:
        try:
            node = model.node_record(reader.get(f"/api/v1/nodes/{kube.segment(pod.node)}"))
        except kube.NotFound:
            node = None
    policy = None
    if pod.policy:
        try:
            policy = model.policy_record(reader.get(f"{POLICIES}/{kube.segment(pod.policy)}"))
        except kube.NotFound:
            policy = None
    now = time.time()
    if args.output == "json":
        _json(render.why_pod_json(pod, node, policy, now), out)
    else:
        out.write(render.why_pod_text(pod, node, policy, now, _style(args, out)))
    return 0


def _context_namespace(args: argparse.Namespace) -> str:
    """The namespace of the current (or ``--context``) context, else ``default`` (as kubectl)."""
    try:
        from kubernetes import config

        contexts, current = config.list_kube_config_contexts(args.kubeconfig or os.environ.get("KUBECONFIG"))
        chosen = next((c for c in contexts if c.get("name") == args.context), current) if args.context else current
        return str(((chosen or {}).get("context") or {}).get("namespace") or "default")
    except Exception:
        return "default"


def _json(doc: Any, out: TextIO) -> None:
    import json

    out.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def _style(args: argparse.Namespace, out: TextIO) -> render.Style:
    tty = hasattr(out, "isatty") and out.isatty()
    colour = {"always": True, "never": False}.get(args.color, tty and not os.environ.get("NO_COLOR"))
    return render.Style(colour=colour, wide=args.output == "wide")


# -- arguments -----------------------------------------------------------------------------------------
class UsageError(Exception):
    """Wrong arguments (exit 2)."""


def duration(text: str) -> float:
    """``90s``, ``30m``, ``7h``, ``2d`` or seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30m, 7h)") from None


def _common(p: argparse.ArgumentParser, defaults: bool) -> None:
    d = (lambda v: v) if defaults else (lambda v: argparse.SUPPRESS)
    p.add_argument(
        "--kubeconfig", default=d(None), help="path to the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    p.add_argument("--context", default=d(None), help="the kubeconfig context to use")
    p.add_argument("-n", "--namespace", default=d(None), help="only pods of this namespace (default: all)")
    p.add_argument(
        "-A", "--all-namespaces", action="store_true", default=d(False), help="pods of all namespaces (the default)"
    )
    p.add_argument(
        "-o", "--output", choices=("json", "wide"), default=d(None), help="json, or wide (more columns, whole reasons)"
    )
    p.add_argument("--json", dest="output", action="store_const", const="json", default=d(None), help="same as -o json")
    p.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default=d("auto"),
        help="colour (auto: on a terminal, without NO_COLOR)",
    )
    p.add_argument("--request-timeout", type=duration, default=d(30.0), help="per request (default 30s)")
    p.add_argument(
        "--probe-max-age",
        type=duration,
        default=d(model.DEFAULT_PROBE_MAX_AGE_S),
        help="a probe older than this needs attention (default 7h)",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl fiar",
        description="Which GPU nodes verified a FlashInfer allreduce backend, why not, and what vLLM pods got.",
        epilog="exit codes: 0 done, 1 error (API, not found), 2 usage",
    )
    _common(p, True)
    p.add_argument("--version", action="version", version=f"kubectl-fiar {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in (
        ("status", "nodes by verdict, policies with their pods, what needs attention first"),
        ("why", "why NODE: the node's probe report in words; why pod NS/NAME: what the pod got and why"),
        ("report", "report --html FILE: one self-contained HTML page of the fleet"),
    ):
        s = sub.add_parser(name, help=help_text, description=help_text)
        _common(s, False)
        if name == "why":
            s.add_argument("target", nargs="+", metavar="NODE | pod NS/NAME")
        if name == "report":
            s.add_argument("--html", metavar="FILE", help="write the page here ('-': standard output)")
    return p


COMMANDS: Final = {"status": cmd_status, "why": cmd_why, "report": cmd_report}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    p = parser()
    args = p.parse_args(argv)
    if args.namespace and args.all_namespaces:
        p.error("-n and -A exclude each other")
    command = COMMANDS.get(args.command or "status")
    assert command is not None
    try:
        reader = Reader(load_config(args.kubeconfig, args.context), args.request_timeout)
        return command(args, reader, out)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as exc:
        print(exc, file=sys.stderr)
        return EXIT_ERROR
    except kube.Forbidden as exc:
        print(f"Error from server (Forbidden): {model.clean(str(exc), 400)}", file=sys.stderr)
        return EXIT_ERROR
    except kube.ApiError as exc:
        print(f"error: {model.clean(str(exc), 400)}", file=sys.stderr)
        return EXIT_ERROR
    except kube.ConfigError as exc:
        print(f"error: {model.clean(str(exc), 400)}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return 0
