"""One rank of a FlashInfer allreduce smoke test. Imports torch and FlashInfer: child process only.

Started by ``node_agent.smoke.supervisor`` with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR/PORT`` and
``FIAR_EVENTS_FILE`` set. Steps (each reported as events, see ``node_agent.smoke.events``):

1. ``import``   torch and ``flashinfer.comm`` (missing: the test is skipped, not failed);
2. ``init``     a NCCL ``torch.distributed`` group, one rank per GPU (rank ``LOCAL_RANK % device_count``
                uses that GPU); with ``--shared-gpu`` (test hosts only) a gloo group, since NCCL
                refuses two ranks on one GPU, and the ranks share the visible GPUs;
3. ``jit``      build or load the backend's comm module, timed apart from the test (rank 0 first,
                then the others load what it built); ``--require-prebuilt`` refuses to compile;
                an error here (kind ``jit``) or CUDA's "no kernel image is available" in any step
                (kind ``no_kernel_image``) leaves the backend untested, not failed;
4. ``workspace`` ``create_allreduce_fusion_workspace(backend, comm_backend=TorchDistBackend(pg),
                group=pg)``; for mnnvl the multicast pointer must be non-null on every rank before
                any kernel runs (FlashInfer 0.6.13 builds the workspace with ``mc_ptr == 0`` on hosts
                without multicast, and the first kernel then faults);
5. ``eager``    ``allreduce_fusion(pattern=kAllReduce)`` three times, each checked against a
                reference sum;
6. ``graph``    the same call captured in a CUDA graph, replayed three times on new inputs, each
                replay checked;
7. ``timing``   mean latency of the eager call and of one graph replay;
8. ``benchmark`` (optional) the backend against plain NCCL ``all_reduce`` over hidden sizes and
                token counts, eager both, plus the backend replayed from a CUDA graph.

With ``--shared-gpu`` steps 7 and 8 do not run: ranks that take turns on one GPU time the turns, not
the backend (``SHARED_GPU_MARK``). Backends that need multicast refuse it.

Inputs are multiples of 0.25 between 0.25 and 1.75 times (rank + 1): no -0.0 (the Lamport
sentinel) and no subnormals; the reference is their sum in fp32.

The mnnvl path refuses to run when the host policy forbids multicast, before importing anything.
After its last step a rank leaves with ``os._exit``: workspace teardown is not part of the test
and must not turn a pass into a hang.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from node_agent import backends, policy
from node_agent.smoke.events import EventLog
from node_agent.smoke.outcome import SHARED_GPU_MARK, OutcomeKind, SmokeRequest
from node_agent.smoke.rules import failure_kind

EXIT_FAIL = 1
EXIT_MISSING = 3
EXIT_REFUSED = 4


class StepFailed(Exception):
    def __init__(self, step: str, kind: OutcomeKind, message: str) -> None:
        super().__init__(message)
        self.step = step
        self.kind = kind


class NotPrebuilt(Exception):
    pass


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    default = {f.name: f.default for f in dataclasses.fields(SmokeRequest)}  # the launcher's request
    p = argparse.ArgumentParser(prog="python -m node_agent.smoke.worker")
    p.add_argument("--backend", choices=backends.NAMES, required=True)
    p.add_argument("--hidden", type=int, default=default["hidden"])
    p.add_argument("--tokens", type=int, default=default["tokens"])
    p.add_argument("--iters", type=int, default=default["iters"])
    p.add_argument("--benchmark", action="store_true")
    p.add_argument("--bench-hidden", type=_ints, default=default["bench_hidden"])
    p.add_argument("--bench-tokens", type=_ints, default=default["bench_tokens"])
    p.add_argument("--require-prebuilt", action="store_true")
    p.add_argument("--collective-timeout", type=float, default=300.0)
    p.add_argument("--shared-gpu", action="store_true", help=f"ranks share GPUs: a gloo group; {SHARED_GPU_MARK}")
    args = p.parse_args(argv)
    if args.shared_gpu and backends.spec(args.backend).needs_multicast:
        p.error(f"--shared-gpu: {args.backend} needs multicast, which ranks sharing a GPU cannot test")
    return args


class Rank:
    """The state of one rank through the steps (torch objects are typed ``Any``: no stubs needed)."""

    def __init__(self, args: argparse.Namespace, log: EventLog, torch: Any, dist: Any, fc: Any, backend_cls: Any):
        self.args = args
        self.log = log
        self.torch = torch
        self.dist = dist
        self.fc = fc
        self.backend_cls = backend_cls
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.local = self.local_rank
        self.step = "init"
        self.device: Any = None
        self.pg: Any = None
        self.ws: Any = None

    # -- numerics ------------------------------------------------------------------------------
    def fill(self, x: Any, it: int) -> None:
        t = self.torch
        n = x.numel()
        base = (t.arange(n, device=x.device, dtype=t.int64) + it) % 7 + 1
        x.copy_((base.to(t.float32) * 0.25 * (self.rank + 1)).view_as(x))

    def reference(self, shape: tuple[int, int], it: int) -> Any:
        t = self.torch
        n = shape[0] * shape[1]
        base = (t.arange(n, device=self.device, dtype=t.int64) + it) % 7 + 1
        total = self.world * (self.world + 1) / 2
        return (base.to(t.float32) * 0.25 * total).view(shape)

    def check(self, out: Any, it: int, what: str) -> float:
        t = self.torch
        ref = self.reference(tuple(out.shape), it)
        got = out.float()
        if not bool(t.isfinite(got).all()):
            raise StepFailed(self.step, "numerics", f"{what}: output has NaN/Inf (the kernel did not write it)")
        err = (got - ref).abs()
        tol = ref.abs() * (self.world * 2.0**-8)
        if not bool((err <= tol).all()):
            bad = int((err > tol).sum())
            raise StepFailed(
                self.step, "numerics", f"{what}: {bad} of {err.numel()} values differ from the reference sum "
                f"(max abs error {float(err.max()):.4g})"
            )  # fmt: skip
        return float(err.max())

    # -- steps ---------------------------------------------------------------------------------
    def allreduce(self, x: Any, out: Any, ws: Any = None) -> Any:
        return self.fc.allreduce_fusion(
            input=x,
            workspace=ws if ws is not None else self.ws,
            pattern=self.fc.AllReduceFusionPattern.kAllReduce,
            launch_with_pdl=False,
            output=out,
        )

    def init(self) -> None:
        t, dist = self.torch, self.dist
        self.step = "init"
        self.log.start("init")
        self.local = self.local_rank % t.cuda.device_count()
        t.cuda.set_device(self.local)
        self.device = t.device("cuda", self.local)
        timeout = timedelta(seconds=self.args.collective_timeout)
        if self.args.shared_gpu:  # NCCL refuses two ranks on one GPU; gloo carries the handle exchange
            dist.init_process_group("gloo", rank=self.rank, world_size=self.world, timeout=timeout)
        else:
            dist.init_process_group(
                "nccl", rank=self.rank, world_size=self.world, device_id=self.device, timeout=timeout
            )
        self.pg = dist.group.WORLD
        dist.barrier()
        fields: dict[str, Any] = {"shared_gpu": SHARED_GPU_MARK} if self.args.shared_gpu else {}
        self.log.ok("init", device=t.cuda.get_device_name(self.local), world_size=self.world, **fields)

    def jit(self) -> None:
        self.step = "jit"
        self.log.start("jit")
        spec = backends.spec(self.args.backend)
        mod = importlib.import_module(spec.module)
        gen = getattr(mod, spec.generator, None)
        load = getattr(mod, spec.loader, None)
        if gen is None or load is None:
            self.dist.barrier()
            self.log.ok("jit", cached=False, source="implicit (built during workspace creation)")
            return
        jit_spec = gen()
        aot = bool(jit_spec.is_aot)
        cached = aot or jit_spec.jit_library_path.exists()
        if self.args.require_prebuilt and not cached:
            raise NotPrebuilt(f"{jit_spec.name} is neither in the AOT cache nor in {jit_spec.jit_library_path.parent}")
        if self.rank == 0:
            load()
        self.dist.barrier()
        if self.rank != 0:
            load()
        self.dist.barrier()
        source = "aot" if aot else ("jit-cache" if cached else "compiled")
        self.log.ok("jit", cached=cached, source=source, module=jit_spec.name)

    def workspace(self) -> None:
        t, args = self.torch, self.args
        self.step = "workspace"
        self.log.start("workspace")
        tokens = max([args.tokens, *(args.bench_tokens if args.benchmark else ())])
        hidden = max([args.hidden, *(args.bench_hidden if args.benchmark else ())])
        try:
            self.ws = self.fc.create_allreduce_fusion_workspace(
                backend=args.backend,
                world_size=self.world,
                rank=self.rank,
                max_token_num=tokens,
                hidden_dim=hidden,
                dtype=t.bfloat16,
                gpus_per_node=self.world,
                comm_backend=self.backend_cls(group=self.pg),
                group=self.pg,
            )
        except Exception as exc:
            kind = failure_kind("workspace", str(exc), "null_mc_ptr" if "multicast" in str(exc).lower() else "error")
            raise StepFailed("workspace", kind, f"workspace creation failed: {type(exc).__name__}: {exc}") from exc
        fields: dict[str, Any] = {"max_token_num": tokens, "hidden_dim": hidden}
        if backends.spec(args.backend).needs_multicast:
            mc_ptr = int(getattr(self.ws, "mc_ptr", 0) or 0)
            flag = t.tensor([1 if mc_ptr else 0], dtype=t.int32, device=self.device)
            self.dist.all_reduce(flag, op=self.dist.ReduceOp.MIN)
            fields["mc_ptr_nonnull_all_ranks"] = bool(flag.item())
            if not flag.item():
                raise StepFailed(
                    "workspace", "null_mc_ptr",
                    f"the {args.backend} workspace was created with a null multicast pointer "
                    f"(mc_ptr == 0 on {'this' if not mc_ptr else 'a peer'} rank); no kernel was run",
                )  # fmt: skip
        self.dist.barrier()
        self.log.ok("workspace", **fields)

    def eager(self) -> tuple[Any, Any]:
        t, args = self.torch, self.args
        self.step = "eager"
        self.log.start("eager")
        x = t.empty((args.tokens, args.hidden), dtype=t.bfloat16, device=self.device)
        out = t.empty_like(x)
        worst = 0.0
        for it in range(3):
            self.fill(x, it)
            out.fill_(float("nan"))
            self.allreduce(x, out)
            t.cuda.synchronize()
            worst = max(worst, self.check(out, it, f"eager call {it + 1}"))
        self.dist.barrier()
        self.log.ok("eager", checks=3, max_abs_err=worst)
        return x, out

    def graph(self, x: Any, out: Any) -> Any:
        t = self.torch
        self.step = "graph"
        self.log.start("graph")
        side = t.cuda.Stream()
        side.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(side):
            self.fill(x, 3)
            self.allreduce(x, out)  # warm-up outside capture, as every rank does
        t.cuda.current_stream().wait_stream(side)
        t.cuda.synchronize()
        self.check(out, 3, "warm-up before capture")
        graph = t.cuda.CUDAGraph()
        with t.cuda.graph(graph):
            self.allreduce(x, out)
        t.cuda.synchronize()
        self.dist.barrier()
        worst = 0.0
        for it in range(4, 7):
            self.fill(x, it)
            out.fill_(float("nan"))
            graph.replay()
            t.cuda.synchronize()
            worst = max(worst, self.check(out, it, f"graph replay {it - 3}"))
        self.dist.barrier()
        self.log.ok("graph", checks=3, max_abs_err=worst)
        return graph

    def time_us(self, fn: Callable[[], Any], iters: int, warmup: int = 5) -> float:
        t = self.torch
        for _ in range(warmup):
            fn()
        t.cuda.synchronize()
        self.dist.barrier()
        t.cuda.synchronize()
        start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) * 1000.0 / iters

    def timing(self, x: Any, out: Any, graph: Any) -> None:
        self.step = "timing"
        self.log.start("timing")
        eager_us = self.time_us(lambda: self.allreduce(x, out), self.args.iters)
        graph_us = self.time_us(graph.replay, self.args.iters)
        self.dist.barrier()
        self.log.ok("timing", eager_us=round(eager_us, 2), graph_us=round(graph_us, 2), iters=self.args.iters)

    def benchmark(self) -> None:
        t, args = self.torch, self.args
        self.step = "benchmark"
        self.log.start("benchmark")
        points = []
        per_graph = 10
        for hidden in args.bench_hidden:
            for tokens in args.bench_tokens:
                if not self.ws.is_buffer_size_sufficient(self.world, tokens, hidden, t.bfloat16):
                    continue
                x = t.empty((tokens, hidden), dtype=t.bfloat16, device=self.device)
                out = t.empty_like(x)
                self.fill(x, 0)
                backend_us = self.time_us(functools.partial(self.allreduce, x, out), args.iters)
                t.cuda.synchronize()
                self.check(out, 0, f"benchmark {tokens}x{hidden}")
                side = t.cuda.Stream()
                side.wait_stream(t.cuda.current_stream())
                with t.cuda.stream(side):
                    self.allreduce(x, out)
                t.cuda.current_stream().wait_stream(side)
                t.cuda.synchronize()
                g = t.cuda.CUDAGraph()
                with t.cuda.graph(g):
                    for _ in range(per_graph):
                        self.allreduce(x, out)
                t.cuda.synchronize()
                self.dist.barrier()
                graph_us = self.time_us(g.replay, max(5, args.iters // per_graph), warmup=2) / per_graph
                del g
                zeros = t.zeros_like(x)  # NCCL works in place; zeros keep values bounded
                nccl_us = self.time_us(functools.partial(self.dist.all_reduce, zeros), args.iters)
                points.append(
                    {
                        "hidden": hidden,
                        "tokens": tokens,
                        "nccl_us": round(nccl_us, 2),
                        "backend_us": round(backend_us, 2),
                        "backend_graph_us": round(graph_us, 2),
                    }
                )
        self.dist.barrier()
        self.log.ok("benchmark", points=points, iters=args.iters, dtype="bfloat16")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log = EventLog.from_env()
    refused = policy.refusal(args.backend, os.environ)
    if refused is not None:
        log.emit("import", "refused", error=refused)
        return EXIT_REFUSED
    log.start("import")
    try:
        import flashinfer
        import flashinfer.comm as fc
        import torch
        import torch.distributed as dist
        from flashinfer.comm.mnnvl import TorchDistBackend
    except Exception as exc:
        log.emit("import", "missing", error=f"{type(exc).__name__}: {exc}")
        return EXIT_MISSING
    try:
        nccl = tuple(torch.cuda.nccl.version())
    except Exception:
        nccl = ()
    versions = {
        "torch": torch.__version__,
        "flashinfer": getattr(flashinfer, "__version__", "unknown"),
        "cuda_runtime": torch.version.cuda,
        "nccl": ".".join(str(v) for v in nccl) if nccl else None,
    }
    log.ok("import", versions=versions)
    rank = Rank(args, log, torch, dist, fc, TorchDistBackend)
    try:
        rank.init()
        rank.jit()
        rank.workspace()
        x, out = rank.eager()
        graph = rank.graph(x, out)
        if not args.shared_gpu:
            rank.timing(x, out, graph)
            if args.benchmark:
                rank.benchmark()
        dist.barrier()
        torch.cuda.synchronize()
    except NotPrebuilt as exc:
        log.emit("jit", "not_prebuilt", error=str(exc))
        sys.stdout.flush()
        os._exit(EXIT_FAIL)
    except StepFailed as exc:
        log.emit(exc.step, "fail", kind=exc.kind, error=str(exc))
        sys.stdout.flush()
        os._exit(EXIT_FAIL)
    except Exception as exc:
        tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
        error = f"{type(exc).__name__}: {exc} [{tb}]"
        log.emit(rank.step, "fail", kind=failure_kind(rank.step, error), error=error)
        sys.stdout.flush()
        os._exit(EXIT_FAIL)
    log.emit("done", "done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
