"""Command line for the local control plane.

python -m devcluster build            # compile the pinned binaries into the cache (once)
python -m devcluster build --realnode # and the kubelet and images of tier D (a real node)
python -m devcluster build --images   # only the images: operator and agent-sim for amd64 and arm64, cached
python -m devcluster build --agent-image [--arch amd64,arm64]  # the real (CUDA) agent image, multi-GB, cached
python -m devcluster build kyverno    # only Kyverno (bench/kyverno_peer.py; never built otherwise)
python -m devcluster up [--tier C]    # start it, print the KUBECONFIG path, return
python -m devcluster demo             # up + agents on fake GPU nodes + operator + vLLM pods
python -m devcluster status
python -m devcluster stop NAME        # stop one component (e.g. fiar-operator, agent-<node>)
python -m devcluster start NAME       # start it again, with the same arguments and ports
python -m devcluster down             # stop every process it started
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from devcluster import build
from devcluster.cluster import MARKER, ControlPlane, ControlPlaneError, Tier


def default_workdir() -> Path:
    env = os.environ.get("FIAR_DEVCLUSTER_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / "fiar-devcluster"


def _fresh_plane(workdir: Path, tier: Tier) -> ControlPlane:
    if (workdir / "state.json").exists():
        ControlPlane.attach(workdir).stop()
    if workdir.is_dir() and any(workdir.iterdir()):
        if not (workdir / MARKER).exists():
            raise ControlPlaneError(f"{workdir} is not empty and was not made by devcluster: choose another --dir")
        shutil.rmtree(workdir)
    build.build_all(realnode=tier >= Tier.D)
    plane = ControlPlane(workdir, tier)
    plane.start()
    return plane


def _demo(args: argparse.Namespace) -> int:
    from devcluster import demo

    plane = _fresh_plane(args.dir, Tier.C)
    print(f"control plane is up at {plane.server} (logs: {plane.log_dir})")
    try:
        demo.run(plane)
    except BaseException:
        print(plane.logs(20), file=sys.stderr)
        plane.stop()
        raise
    return 0


def _up(args: argparse.Namespace) -> int:
    workdir: Path = args.dir
    if (workdir / "state.json").exists():
        plane = ControlPlane.attach(workdir)
        if all(ok for _, ok in plane.iter_status()):
            print(f"already running; export KUBECONFIG={plane.kubeconfig}")
            return 0
    plane = _fresh_plane(workdir, Tier[args.tier])
    print(f"control plane (tier {args.tier}) is up at {plane.server}")
    print(f"logs: {plane.log_dir}")
    print(f"export KUBECONFIG={plane.kubeconfig}")
    print(f"kubectl: {build.binary_path('kubectl')}")
    print("stop it with: make down   (or: PYTHONPATH=tools python -m devcluster down)")
    return 0


def _down(args: argparse.Namespace) -> int:
    if not (args.dir / "state.json").exists():
        print(f"no control plane recorded in {args.dir}")
        return 0
    ControlPlane.attach(args.dir).stop()
    print("stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    if not (args.dir / "state.json").exists():
        print("not running")
        return 1
    plane = ControlPlane.attach(args.dir)
    ok = True
    for name, healthy in plane.iter_status():
        ok &= healthy
        stopped = plane.components[name].pid is None
        print(f"{name:26s} {'ready' if healthy else 'stopped' if stopped else 'NOT READY'}")
    print(f"KUBECONFIG={plane.kubeconfig}")
    return 0 if ok else 1


def _component(args: argparse.Namespace) -> int:
    """Stop or start one component of a running plane (the operator or an agent, say)."""
    if not (args.dir / "state.json").exists():
        raise ControlPlaneError(f"no control plane recorded in {args.dir}: run `make demo` or `make up` first")
    plane = ControlPlane.attach(args.dir)
    comp = plane.components.get(args.name)
    if comp is None:
        raise ControlPlaneError(f"no component {args.name!r}; components: {', '.join(plane.components)}")
    if args.cmd == "stop":
        if not comp.alive():
            print(f"{args.name} is not running")
        plane.stop_component(args.name)
        print(f"{args.name} stopped; start it again with: python -m devcluster start {args.name}")
        return 0
    if comp.alive():
        print(f"{args.name} is already running")
        return 0
    plane.start_component(args.name)
    print(f"{args.name} started (log: {comp.log})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devcluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=default_workdir(), help="work directory (default: %(default)s)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the control-plane binaries")
    b.add_argument("--realnode", action="store_true", help="also the kubelet and the images of tier D")
    b.add_argument(
        "--images", action="store_true", help="only the images (operator, agent-sim: one index for amd64 and arm64)"
    )
    b.add_argument("--agent-image", action="store_true", help="only the real (CUDA) agent image, multi-GB")
    b.add_argument("--arch", default="", help="with --agent-image: architectures, comma-separated (default: this host)")
    b.add_argument("tools", nargs="*", help="only these: " + ", ".join(dict.fromkeys(t.name for t in build.TOOLS)))
    up = sub.add_parser("up", help="start the control plane and return")
    up.add_argument("--tier", choices=[t.name for t in Tier], default="C")
    sub.add_parser("demo", help="start it and run fiar end to end on fake GPU nodes")
    sub.add_parser("down", help="stop it")
    sub.add_parser("status", help="show component health")
    for verb in ("stop", "start"):
        one = sub.add_parser(verb, help=f"{verb} one component (see status for the names)")
        one.add_argument("name", help="component, e.g. fiar-operator or agent-<node>")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build" and args.agent_image:
            from devcluster import realnode

            return realnode.agent_image_cli(tuple(a for a in args.arch.split(",") if a) or None)
        if args.cmd == "build" and args.images:
            from devcluster import realnode

            return realnode.images_cli()
        if args.cmd == "build":
            build.build_all(args.tools or None, realnode=args.realnode)
            if args.realnode:
                from devcluster import realnode

                return realnode.build_cli()
            return 0
        commands = {"up": _up, "demo": _demo, "down": _down, "status": _status}
        return commands.get(args.cmd, _component)(args)
    except (build.BuildError, ControlPlaneError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
