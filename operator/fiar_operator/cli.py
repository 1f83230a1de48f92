"""``fiar-operator`` entry point.

fiar-operator run [--kubeconfig F] [--webhook-port P --tls-cert C --tls-key K] [--standalone] ...
fiar-operator crd                       print the FiAllreducePolicy CRD
fiar-operator webhook-config --url U --ca-file F    print the MutatingWebhookConfiguration
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import faulthandler
import logging
import os
import random
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml

from fiar_operator import __version__, crd
from fiar_operator.core import liveness
from fiar_operator.core.errors import ApiError, OperatorError
from fiar_operator.core.settings import Settings, excluded_namespaces
from fiar_operator.reconcile import webhookconfig
from fiar_operator.state import kube


def _default(name: str) -> Any:
    """The default of a Settings field: the one source of the option's default."""
    return next(f.default for f in dataclasses.fields(Settings) if f.name == name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fiar-operator",
        description="Give every selected vLLM container the FlashInfer allreduce backend verified "
        "on the node it is bound to.",
    )
    parser.add_argument("--version", action="version", version=f"fiar-operator {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = commands.add_parser("run", help="run the operator (webhooks on every replica, reconciler on one)")
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster credentials, then ~/.kube/config)")
    run.add_argument("--webhook-host", default=_default("webhook_host"))
    run.add_argument("--webhook-port", type=int, default=_default("webhook_port"))
    run.add_argument("--tls-cert", type=Path, help="PEM serving certificate of the webhooks")
    run.add_argument("--tls-key", type=Path, help="PEM key of the serving certificate")
    run.add_argument("--metrics-host", default=_default("metrics_host"))
    run.add_argument(
        "--metrics-port", type=int, default=_default("metrics_port"), help="/metrics, /healthz, /readyz (-1: off)"
    )
    run.add_argument(
        "--read-timeout",
        type=float,
        default=_default("read_timeout"),
        help="seconds for the binding webhook's last-resort read of an unseen pod",
    )
    run.add_argument("--status-interval", type=float, default=_default("status_interval"))
    run.add_argument(
        "--exclude-namespace",
        action="append",
        default=[],
        help="namespace the webhooks never see, beside kube-system and $POD_NAMESPACE (repeatable)",
    )
    run.add_argument(
        "--node-selector",
        default=_default("node_selector"),
        help='label selector of the nodes watched: the agent\'s node selector ("": every node)',
    )
    run.add_argument(
        "--unconfigured-interval",
        type=float,
        default=_default("unconfigured_interval"),
        help="seconds between scans for pods a policy selects that the pod webhook never configured",
    )
    run.add_argument(
        "--recreate-unconfigured",
        action="store_true",
        help="evict controller-owned pods the pod webhook never configured, so that they are recreated through it",
    )
    run.add_argument("--standalone", action="store_true", help="no peering: this replica always reconciles")
    run.add_argument(
        "--peering", default=_default("peering"), help="kopf peering name (replicas of one deployment share it)"
    )
    run.add_argument(
        "--priority",
        type=int,
        default=None,
        help="kopf peering priority of this replica (default: random, so that replicas differ)",
    )
    run.add_argument("--liveness", help="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz")
    run.add_argument(
        "--install-crd",
        action="store_true",
        help="at start, create the FiAllreducePolicy CRD or bring it to this version (server-side apply)",
    )
    run.add_argument(
        "--register-webhooks",
        metavar="URL",
        help="local runs: register a webhook configuration pointing at URL (https://host:port)",
    )
    run.add_argument(
        "--webhook-config",
        metavar="NAME",
        help="MutatingWebhookConfiguration whose matchConditions the leader keeps in step with the policies "
        "(the chart passes its own; default: the one --register-webhooks registers, else none)",
    )
    run.add_argument("--webhook-ca", type=Path, help="CA bundle for --register-webhooks (default: --tls-cert)")
    run.add_argument("--verbose", action="store_true")

    commands.add_parser("crd", help="print the FiAllreducePolicy CustomResourceDefinition")

    config = commands.add_parser(
        "webhook-config",
        help="print the MutatingWebhookConfiguration and the policy webhook's ValidatingWebhookConfiguration",
    )
    target = config.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="https://host:port of the webhook server")
    target.add_argument("--service", help="NAMESPACE/NAME:PORT of the webhook Service")
    config.add_argument("--ca-file", type=Path, required=True, help="PEM CA bundle that signed the serving cert")
    config.add_argument(
        "--exclude-namespace",
        action="append",
        default=[],
        help="namespace the webhooks never see, beside kube-system and the --service namespace (repeatable)",
    )
    config.add_argument(
        "--timeout-seconds",
        type=int,
        default=webhookconfig.TIMEOUT_SECONDS,
        help=f"API-server timeout of each webhook call, 1 to {webhookconfig.MAX_TIMEOUT_SECONDS} s "
        "(default: %(default)s)",
    )
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(
        kubeconfig=args.kubeconfig,
        webhook_host=args.webhook_host,
        webhook_port=args.webhook_port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        metrics_host=args.metrics_host,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        read_timeout=args.read_timeout,
        status_interval=args.status_interval,
        standalone=args.standalone,
        peering=args.peering,
        priority=args.priority if args.priority is not None else random.randint(1, 1_000_000),
        liveness=args.liveness,
        excluded_namespaces=excluded_namespaces(extra=args.exclude_namespace),
        webhook_config=args.webhook_config,
        node_selector=args.node_selector,
        unconfigured_interval=args.unconfigured_interval,
        recreate_unconfigured=args.recreate_unconfigured,
    )


def peer_identity(environ: Mapping[str, str], hostname: str, pid: int) -> str:
    """This replica's kopf peering identity: its pod name under the chart, else ``host/pid``.

    kopf's own default asks ``getpass`` for the user name, which raises for a uid without a passwd
    entry: the operator image runs as 65532, which has none.
    """
    return environ.get("POD_NAME") or f"{hostname}/{pid}"


def leave_out_generated_client(modules: dict[str, Any] = sys.modules) -> bool:
    """Keep kopf from importing the kubernetes client, unless the credentials needed it; whether it is
    kept out. kopf imports it, when installed, only to recognise its model objects among what handlers
    return, and fiar's handlers return none: the import alone is 17.7 MiB of the operator's resident
    memory (BENCHMARKS.md, "Memory"). The operator's credentials come from ``fiar_kube``, which loads
    the package only for a kubeconfig user of a kind it does not read itself (``exec`` and the like)."""
    if "kubernetes" in modules:
        return False
    modules["kubernetes"] = None  # an import of it now raises ImportError
    return True


def _run(args: argparse.Namespace) -> int:
    faulthandler.enable()  # a fatal signal prints every thread's Python stack to the log
    settings = _settings(args)
    settings.check()
    client = kube.Kube(kube.configuration(settings.kubeconfig))
    leave_out_generated_client()
    import kopf

    from fiar_operator import handlers  # noqa: F401  (registers the kopf handlers)
    from fiar_operator.runtime import Runtime

    kopf.configure(verbose=args.verbose)
    # kopf's peering identity, which the reconciler needs to know its own entry (the Pod name in a cluster).
    identity = os.environ.get("POD_ID") or peer_identity(os.environ, socket.gethostname(), os.getpid())
    runtime = Runtime(settings, kube=client, identity=identity)
    registered: str | None = None
    if args.install_crd:
        crd.apply(runtime.kube)
    if args.register_webhooks:
        ca = args.webhook_ca or args.tls_cert
        if ca is None:
            raise OperatorError("--register-webhooks needs --webhook-ca or --tls-cert")
        bundle = Path(ca).read_bytes()
        config = webhookconfig.configuration(
            bundle,
            url=args.register_webhooks,
            selector=webhookconfig.namespace_selector(settings.excluded_namespaces),
        )
        registered = runtime.kube.apply(kube.MUTATING_CONFIGS, config)["metadata"]["name"]
        runtime.kube.apply(
            kube.VALIDATING_CONFIGS, webhookconfig.policy_configuration(bundle, url=args.register_webhooks)
        )
        runtime.reconciler.webhooks.name = runtime.reconciler.webhooks.name or registered
    runtime.start()

    async def operate() -> None:
        # kopf's event loop beats into /healthz: a loop that stops turning fails the liveness probe.
        pulse = asyncio.create_task(runtime.heartbeats.pulse(liveness.KOPF_LOOP))
        try:
            await kopf.operator(
                clusterwide=True,
                standalone=True if settings.standalone else None,
                identity=cast("Any", identity),
                liveness_endpoint=settings.liveness,
                memo=kopf.Memo(runtime=runtime),
            )
        finally:
            pulse.cancel()

    try:
        asyncio.run(operate())
    finally:
        runtime.stop()
        if registered:
            with contextlib.suppress(OperatorError, ApiError):
                runtime.kube.delete(kube.MUTATING_CONFIGS, registered)
            with contextlib.suppress(OperatorError, ApiError):
                runtime.kube.delete(kube.VALIDATING_CONFIGS, registered)
    return 0


def _webhook_config(args: argparse.Namespace) -> int:
    service = None
    if args.service:
        try:
            ref, port = args.service.rsplit(":", 1)
            namespace, name = ref.split("/", 1)
            service = (namespace, name, int(port))
        except ValueError:
            raise OperatorError(f"--service {args.service!r}: expected NAMESPACE/NAME:PORT") from None
    # The operator's own namespace is never sent to its webhooks, as `run` never handles it.
    own = {"POD_NAMESPACE": service[0]} if service else {}
    exclude = excluded_namespaces(environ=own, extra=args.exclude_namespace)
    try:
        config = webhookconfig.configuration(
            args.ca_file.read_bytes(),
            url=args.url,
            service=service,
            selector=webhookconfig.namespace_selector(exclude),
            timeout=args.timeout_seconds,
        )
        policies = webhookconfig.policy_configuration(
            args.ca_file.read_bytes(), url=args.url, service=service, timeout=args.timeout_seconds
        )
    except ValueError as exc:
        raise OperatorError(str(exc)) from None
    sys.stdout.write(yaml.safe_dump_all([config, policies], sort_keys=False))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "crd":
            sys.stdout.write(crd.text())
            return 0
        if args.command == "webhook-config":
            return _webhook_config(args)
    except (OperatorError, ApiError) as exc:
        logging.getLogger("fiar_operator").error("%s", exc)
        sys.stderr.write(f"fiar-operator: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    build_parser().print_help()
    return 0
