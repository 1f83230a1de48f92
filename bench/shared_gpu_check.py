"""Two processes on one GPU: do cross-process spin-waits make progress, and does FlashInfer's trtllm allreduce?

Run on a GPU host (one GPU is enough), under a hard ``timeout``; results as JSON lines on stdout:

    timeout -k 5 120 python3 bench/shared_gpu_check.py spin        # (a) no FlashInfer
    timeout -k 5 300 python3 bench/shared_gpu_check.py trtllm      # (b) FlashInfer's trtllm workspace

(a) ``spin``: each of two processes allocates one flag word on ``cuda:0`` and opens the other's through
CUDA IPC. A one-thread kernel in each plays ping-pong: rank 0 writes round ``i`` into rank 1's word and
spins on its own until rank 1 answers ``i``; rank 1 spins, then answers. Each kernel gives up after
``--spin-timeout`` seconds (``%globaltimer``) and reports how many rounds it completed, so no outcome
hangs the GPU. The same kernels on two streams of one process are the baseline (one context: no
time-slicing between them). CuPy compiles the kernel (NVRTC); no FlashInfer.

(b) ``trtllm``: two ranks, both on ``cuda:0``, a gloo group; FlashInfer's
``create_allreduce_fusion_workspace(backend="trtllm")`` (``SymmDeviceMemory(enable_multicast=False)``),
then ``allreduce_fusion`` with ``kAllReduce`` and ``kARResidualRMSNorm`` at 8..64 tokens, hidden 4096,
bf16, each checked against torch on the same inputs (both ranks draw both ranks' inputs from one
seed), timed eagerly (CUDA events, both ranks launching together after a gloo barrier), then captured
in a CUDA graph, replayed on fresh inputs, checked and timed.

NVLink multicast stays off: the script refuses to start unless ``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and ``NVSHMEM_DISABLE_NVLS=1`` are set, before importing torch.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def guard() -> None:
    wrong = {k: os.environ.get(k) for k, v in REQUIRED_ENV.items() if os.environ.get(k) != v}
    if wrong:
        sys.exit(f"shared_gpu_check: NVLink multicast must be off, refusing to start: {wrong}")


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


# -- (a) cross-process spin-wait ---------------------------------------------------------------------
SPIN_SRC = r"""
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
extern "C" __global__ void pingpong(int* own, int* peer, int rank, int rounds,
                                    unsigned long long timeout_ns, unsigned long long* out) {
  volatile int* vown = own;
  volatile int* vpeer = peer;
  unsigned long long t0 = now_ns();
  int done = 0;
  int timed_out = 0;
  for (int i = 1; i <= rounds && !timed_out; ++i) {
    if (rank == 0) { *vpeer = i; __threadfence_system(); }
    while (*vown < i) {
      if (now_ns() - t0 > timeout_ns) { timed_out = 1; break; }
    }
    if (timed_out) break;
    if (rank == 1) { *vpeer = i; __threadfence_system(); }
    done = i;
  }
  out[0] = done; out[1] = now_ns() - t0; out[2] = timed_out;
}
"""


def _kernel() -> Any:
    import cupy as cp

    return cp.RawKernel(SPIN_SRC, "pingpong")


def spin_rank(rank: int, tmp: Path, rounds: list[int], timeout_s: float) -> None:
    import cupy as cp

    cp.cuda.Device(0).use()
    kern = _kernel()
    mem = cp.cuda.Memory(64)  # its own cudaMalloc: an IPC handle maps a whole allocation, not a pool slice
    own = cp.ndarray((16,), cp.int32, cp.cuda.MemoryPointer(mem, 0))
    out = cp.zeros(3, dtype=cp.uint64)
    (tmp / f"h{rank}.tmp").write_bytes(cp.cuda.runtime.ipcGetMemHandle(own.data.ptr))
    (tmp / f"h{rank}.tmp").rename(tmp / f"h{rank}")
    peer_file = tmp / f"h{1 - rank}"
    while not peer_file.exists():
        time.sleep(0.01)
    peer_ptr = cp.cuda.runtime.ipcOpenMemHandle(peer_file.read_bytes())
    for n in rounds:
        own.fill(0)
        cp.cuda.Device(0).synchronize()
        _barrier(tmp, rank, f"r{n}")
        t0 = time.perf_counter()
        kern((1,), (1,), (own, cp.uint64(peer_ptr), cp.int32(rank), cp.int32(n), cp.uint64(int(timeout_s * 1e9)), out))
        cp.cuda.Device(0).synchronize()
        wall = time.perf_counter() - t0
        done, ns, timed_out = (int(v) for v in out.get())
        emit(
            part="spin", mode="two processes, CUDA IPC", rank=rank, rounds=n, completed=done,
            timed_out=bool(timed_out), kernel_ms=round(ns / 1e6, 3), wall_ms=round(wall * 1e3, 3),
            us_per_round=round(ns / 1e3 / done, 3) if done else None,
        )  # fmt: skip
        _barrier(tmp, rank, f"e{n}")
    cp.cuda.runtime.ipcCloseMemHandle(peer_ptr)


def _barrier(tmp: Path, rank: int, name: str) -> None:
    (tmp / f"{name}.{rank}").touch()
    while not (tmp / f"{name}.{1 - rank}").exists():
        time.sleep(0.001)


def spin_one_process(rounds: list[int], timeout_s: float) -> None:
    import cupy as cp

    kern = _kernel()
    flags = [cp.zeros(16, dtype=cp.int32) for _ in range(2)]
    outs = [cp.zeros(3, dtype=cp.uint64) for _ in range(2)]
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    for n in rounds:
        for f in flags:
            f.fill(0)
        cp.cuda.Device(0).synchronize()
        for r in (1, 0):
            with streams[r]:
                args = (flags[r], flags[1 - r], cp.int32(r), cp.int32(n), cp.uint64(int(timeout_s * 1e9)), outs[r])
                kern((1,), (1,), args)
        cp.cuda.Device(0).synchronize()
        for r in range(2):
            done, ns, timed_out = (int(v) for v in outs[r].get())
            emit(
                part="spin", mode="one process, two streams", rank=r, rounds=n, completed=done,
                timed_out=bool(timed_out), kernel_ms=round(ns / 1e6, 3),
                us_per_round=round(ns / 1e3 / done, 3) if done else None,
            )  # fmt: skip


# -- (b) FlashInfer trtllm over gloo, both ranks on cuda:0 -------------------------------------------------
def inputs(torch: Any, tokens: int, hidden: int, seed: int) -> tuple[list[Any], Any, Any]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    xs = [torch.randn(tokens, hidden, generator=g).to(torch.bfloat16) for _ in range(2)]
    residual = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    gamma = (torch.rand(hidden, generator=g) + 0.5).to(torch.bfloat16)
    return xs, residual, gamma


def rel_err(torch: Any, got: Any, ref: Any) -> float:
    got64, ref64 = got.double().cpu(), ref.double().cpu()
    if not bool(torch.isfinite(got64).all()):
        return float("nan")
    return float((got64 - ref64).norm() / ref64.norm())


def trtllm_rank(rank: int, port: int, tokens_list: list[int], hidden: int, iters: int) -> None:
    from datetime import timedelta

    import flashinfer
    import flashinfer.comm as fc
    import torch
    import torch.distributed as dist
    from flashinfer.comm.mnnvl import TorchDistBackend

    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    t0 = time.perf_counter()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    pg = dist.group.WORLD
    emit(part="trtllm", rank=rank, step="init", ok=True, s=round(time.perf_counter() - t0, 3),
         flashinfer=flashinfer.__version__, torch=torch.__version__, device=torch.cuda.get_device_name(0))  # fmt: skip
    t0 = time.perf_counter()
    ws = fc.create_allreduce_fusion_workspace(
        backend="trtllm", world_size=2, rank=rank, max_token_num=max(tokens_list), hidden_dim=hidden,
        dtype=torch.bfloat16, gpus_per_node=2, comm_backend=TorchDistBackend(group=pg), group=pg,
    )  # fmt: skip
    torch.cuda.synchronize()
    dist.barrier()
    emit(part="trtllm", rank=rank, step="workspace", ok=True, s=round(time.perf_counter() - t0, 3),
         kind=type(ws).__name__)  # fmt: skip
    P = fc.AllReduceFusionPattern
    eps = 1e-6

    def call(pattern: int, x: Any, out: Any, res_in: Any, res_out: Any, norm: Any, gamma: Any) -> None:
        if pattern == P.kAllReduce:
            fc.allreduce_fusion(input=x, workspace=ws, pattern=pattern, launch_with_pdl=False, output=out)
        else:
            fc.allreduce_fusion(
                input=x, workspace=ws, pattern=pattern, launch_with_pdl=False, residual_in=res_in,
                residual_out=res_out, norm_out=norm, rms_gamma=gamma, rms_eps=eps,
            )  # fmt: skip

    def timed(fn: Any, n: int) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        return float(a.elapsed_time(b)) * 1000.0 / n

    def one_case(tokens: int, pname: str, pattern: int) -> None:
        x = torch.empty(tokens, hidden, dtype=torch.bfloat16, device=dev)
        out, res_in, res_out, norm = (torch.empty_like(x) for _ in range(4))
        gamma = torch.empty(hidden, dtype=torch.bfloat16, device=dev)

        def load(seed: int) -> tuple[Any, Any]:
            xs, residual, g = inputs(torch, tokens, hidden, seed)
            x.copy_(xs[rank])
            res_in.copy_(residual)
            gamma.copy_(g)
            for t in (out, res_out, norm):
                t.fill_(float("nan"))
            s = xs[0].float() + xs[1].float()
            if pattern == P.kAllReduce:
                return s, None
            r = s + residual.float()
            n = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * g.float()
            return r, n

        def errors(ref: Any, ref_norm: Any) -> dict[str, float]:
            if pattern == P.kAllReduce:
                return {"out": rel_err(torch, out, ref)}
            return {"residual_out": rel_err(torch, res_out, ref), "norm_out": rel_err(torch, norm, ref_norm)}

        def once() -> None:
            call(pattern, x, out, res_in, res_out, norm, gamma)

        step = "eager"
        try:
            worst: dict[str, float] = {}
            for it in range(3):
                ref, ref_norm = load(1000 * tokens + it + (0 if pattern == P.kAllReduce else 500))
                dist.barrier()
                t0 = time.perf_counter()
                once()
                torch.cuda.synchronize()
                first_ms = (time.perf_counter() - t0) * 1e3
                for k, v in errors(ref, ref_norm).items():
                    worst[k] = max(worst.get(k, 0.0), v)
            eager_us = timed(once, iters)
            emit(part="trtllm", rank=rank, step="eager", pattern=pname, tokens=tokens, hidden=hidden,
                 rel_err=worst, last_call_wall_ms=round(first_ms, 3), eager_us=round(eager_us, 2))  # fmt: skip
            step = "graph"
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                once()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            dist.barrier()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                once()
            torch.cuda.synchronize()
            dist.barrier()
            worst = {}
            for it in range(3):
                ref, ref_norm = load(7000 * tokens + it + (0 if pattern == P.kAllReduce else 500))
                dist.barrier()
                graph.replay()
                torch.cuda.synchronize()
                for k, v in errors(ref, ref_norm).items():
                    worst[k] = max(worst.get(k, 0.0), v)
            graph_us = timed(graph.replay, iters)
            emit(part="trtllm", rank=rank, step="graph", pattern=pname, tokens=tokens, hidden=hidden,
                 rel_err=worst, replay_us=round(graph_us, 2))  # fmt: skip
            del graph
        except Exception as exc:  # record the exact error, then stop this rank
            emit(part="trtllm", rank=rank, step=step, pattern=pname, tokens=tokens, ok=False,
                 error=f"{type(exc).__name__}: {exc}"[:2000])  # fmt: skip
            sys.stdout.flush()
            os._exit(1)

    for tokens in tokens_list:
        for pname, pattern in (("allreduce", P.kAllReduce), ("allreduce+rmsnorm", P.kARResidualRMSNorm)):
            one_case(tokens, pname, pattern)
    dist.barrier()
    emit(part="trtllm", rank=rank, step="done", ok=True)
    sys.stdout.flush()
    os._exit(0)  # workspace teardown is not part of the check


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_pair(extra: list[str]) -> int:
    """Start ranks 0 and 1 of this script; return the worst exit code (the caller's timeout bounds them)."""
    procs = [subprocess.Popen([sys.executable, __file__, *extra, "--rank", str(r)]) for r in range(2)]
    codes = [p.wait() for p in procs]
    return max(abs(c) for c in codes)


def main() -> int:
    guard()
    p = argparse.ArgumentParser()
    p.add_argument("part", choices=("spin", "trtllm"))
    p.add_argument("--rank", type=int)
    p.add_argument("--tmp")
    p.add_argument("--port", type=int)
    p.add_argument("--rounds", default="10,100,1000,10000")
    p.add_argument("--spin-timeout", type=float, default=20.0)
    p.add_argument("--tokens", default="8,16,32,64")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    rounds = [int(x) for x in a.rounds.split(",")]
    if a.part == "spin":
        if a.rank is None:
            import tempfile

            spin_one_process(rounds, a.spin_timeout)
            with tempfile.TemporaryDirectory() as tmp:
                base = ["spin", "--tmp", tmp, "--rounds", a.rounds, "--spin-timeout", str(a.spin_timeout)]
                return launch_pair(base)
        spin_rank(a.rank, Path(a.tmp), rounds, a.spin_timeout)
        return 0
    tokens = [int(x) for x in a.tokens.split(",")]
    if a.rank is None:
        extra = ["trtllm", "--port", str(free_port()), "--tokens", a.tokens, "--hidden", str(a.hidden)]
        return launch_pair([*extra, "--iters", str(a.iters)])
    trtllm_rank(a.rank, a.port, tokens, a.hidden, a.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
