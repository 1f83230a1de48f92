"""The option-breaks table (``operator/fiar_operator/core/options.py``) checked against each release's
own code on CPU, with fiar's values.

For each row of ``options.BREAKS``, each spelling of its option, each node case and each group shape,
this script

1. reads the option with vLLM's own parser (``FlexibleArgumentParser`` + the ``serve`` subcommand,
   ``AsyncEngineArgs.from_cli_args``): ``additional_config``, ``attention_config.hisparse_config``,
   ``kv_transfer_config.has_connector("HiSparseConnector")`` and the TP size, and compares them with
   fiar's reading (``commands.vllm_options``);
2. takes fiar's decision for the pod (``decide`` with the pod's options, as the webhook does) and runs,
   in the release's venv, the release's own check with the variables that decision writes:

   - Muse Spark ``latency_specialized``: ``vllm.models.muse_spark.nvidia.specialized_decode.runtime.
     flashinfer_ops.unsupported`` on a config with the parsed TP and attention config (the lines that
     read ``VLLM_ALLREDUCE_USE_FLASHINFER`` and ``VLLM_FLASHINFER_ALLREDUCE_BACKEND``); a reason is the
     ``ValueError`` vLLM raises at start;
   - HiSparse: ``flashinfer_all_reduce._resolve_fi_ar_backend`` under the parsed ``VllmConfig`` (one-rank
     gloo group; a multi-pod group is stood in by ``_node_count`` returning 2): the resolved backend must
     not be ``mnnvl``, and under fiar's ``auto`` it is what vLLM's own guard gives.

   As a control, fiar's decision *without* the option table (``options.NO_OPTIONS``) is run the same way:
   the rows where it breaks are the ones the table exists for.

3. for DeepSeek V4.1's ``latency_specialized`` decode, which is *not* a row (no value fiar writes breaks
   it where the node could run it: docs/vllm-flashinfer-paths.md), the release's own
   ``vllm.models.deepseek_v41.nvidia.specialized_decode.specialized_decode_config`` (the collective check
   whose ``ValueError`` refuses the option at model construction) on a deployment that meets every other
   requirement, with the parsed TP and ``additional_config``, under fiar's decision's variables (backend,
   ``VLLM_ALLREDUCE_USE_FLASHINFER`` and the multicast guard) and under the container's own (none of
   them set): fiar's values break it where they refuse it and the container's own do not.

Stand-ins: none for Muse Spark's check (it reads the config and the environment only); ``_node_count``
for the multi-pod shape; for DeepSeek V4.1 a GB300 platform (SM103, DeepGEMM), the model's shape
(hidden size 5120, ``hc_mult`` 4), and the custom allreduce's ``mnnvl_lamport_ag_multicast_ptr`` as
torch 2.14's rendezvous leaves it (``custom_all_reduce.py`` ``_init_mnnvl_buffer``): 0 under
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` or on a node whose mnnvl workspace was not created (no multicast,
a failed bind), an address elsewhere. The venvs are ``bench/vllm_parser_check.py``'s (``~/.cache/fiar/vllm-check``).

    .venv/bin/python bench/vllm_option_check.py [--versions 0.33.0,0.34.0] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import fiar_contract as contract
from fiar_operator.core import commands, options
from fiar_operator.core.decide import GroupPlan, decide
from fiar_operator.core.policy import parse_policy
from fiar_operator.core.selectors import node_constraint

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_parser_check as parser_check

VERSIONS = ("0.33.0", "0.34.0")
MUSE = '{"decode_backend":"latency_specialized"}'
SPELLINGS: dict[str, dict[str, list[str]]] = {
    "muse-spark-latency-specialized": {
        "json tp8": ["--additional-config", MUSE, "-tp", "8"],
        "equals tp16": [f"--additional-config={MUSE}", "--tensor-parallel-size=16"],
        "dotted tp8": ["--additional-config.decode_backend=latency_specialized", "-tp", "8"],
        "json tp4": ["--additional-config", MUSE, "-tp", "4"],
    },
    "deepseek-v41-latency-specialized": {
        "json tp4": ["--additional-config", MUSE, "-tp", "4"],
        "equals tp4": [f"--additional-config={MUSE}", "--tensor-parallel-size=4"],
        "dotted tp4": ["--additional_config.decode_backend", "latency_specialized", "-tp=4"],
        "json tp8": ["--additional-config", MUSE, "-tp", "8"],
    },
    "hisparse-mnnvl": {
        "-ac json": ["-ac", '{"hisparse_config":{}}'],
        "-ac dotted": ["-ac.hisparse_config.device_buffer_size=4096"],
        "connector": ["--kv-transfer-config", '{"kv_connector":"HiSparseConnector","kv_role":"kv_both"}'],
        "multi-connector": [
            "--kv-transfer-config",
            json.dumps(
                {
                    "kv_connector": "MultiConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {"connectors": [{"kv_connector": "HiSparseConnector"}]},
                }
            ),
        ],
    },
}
B, MN, T, W, C = (
    contract.LABEL_BACKEND,
    contract.LABEL_MNNVL,
    contract.LABEL_TRTLLM,
    contract.LABEL_MNNVL_WORKSPACE,
    contract.LABEL_CLIQUE,
)
MNNVL_ANSWER = {
    "mnnvl": "created",
    "mnnvl, trtllm failed": "created",
    "trtllm": "attribute-0",
    "none, no-multicast": "attribute-0",
    "none": "bind-error",
}
"""How the stand-in for ``flashinfer.comm.create_allreduce_fusion_workspace`` answers an ``mnnvl`` request
on each node (its agent's mnnvl test: worked, no multicast, a failed bind), as bench/vllm_fi_ar_check.py
cases (e), (a), (c). A ``trtllm`` request is answered with a working trtllm workspace everywhere."""
NODES: dict[str, dict[str, str]] = {
    "mnnvl": {B: "mnnvl", MN: "pass", T: "pass", W: "created", C: "c.1"},
    "mnnvl, trtllm failed": {B: "mnnvl", MN: "pass", T: "fail", W: "created", C: "c.1"},
    "trtllm": {B: "trtllm", MN: "skipped", T: "pass"},
    "none, no-multicast": {B: "none", MN: "fail", T: "pass", W: "no-multicast"},
    "none": {B: "none", MN: "fail", T: "fail"},
}
GUARD_TORCH = "TORCH_SYMM_MEM_DISABLE_MULTICAST"
NOT_A_ROW = "deepseek-v41-latency-specialized"
"""The option checked here that is no row of ``options.BREAKS``: its decision is fiar's whole one."""
TRTLLM_ONLY = "single, backends [trtllm]"
"""A policy that allows only trtllm: on a node that verifies mnnvl alone the fusion is off
(``VLLM_ALLREDUCE_USE_FLASHINFER=0``) while the node's multicast is verified (the guard off)."""
SHAPES_OF = {"hisparse-mnnvl": ("single", "multi-pod"), NOT_A_ROW: ("single", TRTLLM_ONLY)}
"""The shapes each row is checked in (others: single)."""
POLICY: dict[str, Any] = {"metadata": {"name": "vllm"}, "spec": {"podSelector": {}, "imexChannel": "Provided"}}


def _decision_env(row: str, tokens: list[str], node: str, shape: str, release: str, table: bool) -> dict[str, str]:
    extras: dict[str, dict[str, Any]] = {"multi-pod": {"multiNode": "Always"}, TRTLLM_ONLY: {"backends": ["trtllm"]}}
    extra = extras.get(shape, {})
    policy = parse_policy({**POLICY, "spec": {**POLICY["spec"], **extra}})
    group = GroupPlan(multi=True, key="g", pinned=True, constraint=node_constraint({}), imex=True)
    read = options.read_vllm(tokens) if table else options.NO_OPTIONS
    d = decide(
        policy,
        node,
        NODES[node],
        group if shape == "multi-pod" else GroupPlan(),
        {node: NODES[node]},
        release=release,
        options=read,
    )
    a = d.annotations()
    return {
        contract.ENV_VAR: a[contract.ANNOTATION_POD_BACKEND],
        contract.ENV_ALLREDUCE_USE_FLASHINFER: a[contract.ANNOTATION_POD_ALLREDUCE_USE_FLASHINFER],
        **{g.env: a[g.annotation] for g in contract.MULTICAST_GUARD},
        "not_applied": json.dumps(list(d.not_applied)),
    }


CHECKER = r"""
import json, os, sys, warnings, logging, socket
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
cases = json.load(sys.stdin)
import vllm, vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()
from types import SimpleNamespace
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.config.attention import AttentionConfig
from vllm.distributed import parallel_state as ps
from vllm.distributed.device_communicators import flashinfer_all_reduce as far
try:
    from vllm.models.muse_spark.nvidia.specialized_decode.runtime import flashinfer_ops
except ImportError as exc:
    flashinfer_ops = None
try:
    from vllm.models.deepseek_v41.nvidia import specialized_decode as dsv41
    from vllm.models.deepseek_v41.nvidia.ops import mhc as dsv41_mhc
except ImportError:
    dsv41 = dsv41_mhc = None
from vllm.config import CompilationMode, CUDAGraphMode
from vllm.v1.attention.backends.registry import AttentionBackendEnum
import vllm.envs as envs
import torch


class Workspace:
    def __init__(self, backend, mc_ptr=None):
        self.backend, self.mc_ptr = backend, mc_ptr

    def destroy(self):
        pass

    def is_buffer_size_sufficient(self, **_):
        return True


def stand_in(answer):
    def create_allreduce_fusion_workspace(*, backend, **_):
        if backend == "trtllm":
            return Workspace("trtllm")
        if answer == "created":
            return Workspace("mnnvl", 0x7F0000000000)
        if answer == "attribute-0":
            raise RuntimeError("[SymmDeviceMemory] Device does not support multicasting.")
        raise RuntimeError("CUDA error code=802(b'CUDA_ERROR_SYSTEM_NOT_READY')")
    return create_allreduce_fusion_workspace


class GB300:
    # The platform the DeepSeek V4.1 specialized decode needs: SM103, in the SM10x family.

    def is_device_capability(self, capability):
        return capability == 103

    def is_device_capability_family(self, family):
        return family == 100


def gb300_tp_group(node_answer):
    # The TP group as supports_mhc_all_reduce reads it: the custom allreduce's multicast pointer is
    # what torch's rendezvous gave _init_mnnvl_buffer (0 under the guard: torch 2.14 reads
    # TORCH_SYMM_MEM_DISABLE_MULTICAST at every rendezvous; 0 where the node's multicast does not work).
    guarded = os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") == "1"
    ptr = 0 if guarded or node_answer != "created" else 0x7F0000000000
    ca_comm = SimpleNamespace(mnnvl_lamport_ag_multicast_ptr=ptr, disabled=False)
    return SimpleNamespace(device_communicator=SimpleNamespace(ca_comm=ca_comm))


def dsv41_config(engine):
    # A DeepSeek V4.1 deployment that meets every requirement of the specialized decode but the ones
    # the parsed command (TP, additional_config) and the environment decide.
    return SimpleNamespace(
        additional_config=engine.additional_config,
        parallel_config=SimpleNamespace(
            tensor_parallel_size=engine.tensor_parallel_size, pipeline_parallel_size=1, data_parallel_size=1,
            enable_expert_parallel=False, decode_context_parallel_size=1, prefill_context_parallel_size=1,
            use_ubatching=False,
        ),
        attention_config=SimpleNamespace(
            backend=AttentionBackendEnum.FLASHINFER_MLA_SPARSE_DSV41, indexer_kv_dtype="mxfp4",
            indexer_sparse_logits=True,
        ),
        speculative_config=SimpleNamespace(method="dspark", enable_adaptive_verification=False),
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE, mode=CompilationMode.NONE),
        cache_config=SimpleNamespace(cache_dtype="fp8"),
        model_config=SimpleNamespace(enable_sleep_mode=False, hf_config=SimpleNamespace(hidden_size=5120, hc_mult=4)),
        use_v2_model_runner=True,
        weight_transfer_config=None,
        lora_config=None,
        kv_transfer_config=None,
        kernel_config=SimpleNamespace(enable_flashinfer_autotune=None, enable_jit_warmup=False),
    )


if dsv41 is not None:
    dsv41.current_platform = dsv41_mhc.current_platform = GB300()
    dsv41_mhc.is_deep_gemm_supported = lambda: True
ENV_KEYS = ("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "VLLM_ALLREDUCE_USE_FLASHINFER",
            "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def reset():
    for name in ("_fi_ar_workspace", "_fi_ar_quant_workspace"):
        setattr(far, name, None)
    for name in ("_fi_ar_workspace_failed", "_fi_ar_quant_workspace_failed"):
        if hasattr(far, name):
            setattr(far, name, False)

with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
ps.init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                local_rank=0, backend="gloo")
with set_current_vllm_config(VllmConfig()):
    ps.initialize_model_parallel(1, 1)
group = ps.get_tp_group().cpu_group
real_count = far._node_count
out = []
for case in cases:
    r = {"key": case["key"]}
    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", "m", *case["tokens"]])
    engine = AsyncEngineArgs.from_cli_args(args)
    attention = engine.attention_config
    if isinstance(attention, dict):
        attention = AttentionConfig(**attention)
    kv = engine.kv_transfer_config
    r["parsed"] = {
        "decode_backend": (engine.additional_config or {}).get("decode_backend"),
        "tp": engine.tensor_parallel_size,
        "hisparse": attention.hisparse_config is not None or (kv is not None and kv.has_connector("HiSparseConnector")),
    }
    for which in ("fiar", "control", "own"):
        if which not in case:
            continue
        env = case[which]
        for key in ENV_KEYS:
            if key in env:
                os.environ[key] = env[key]
            else:
                os.environ.pop(key, None)
        got = {}
        if case["row"].startswith("deepseek") and dsv41 is None:
            got = {"refuses": None, "decode": "n/a: no DeepSeek V4.1 specialized decode in this release"}
        elif case["row"].startswith("deepseek"):
            dsv41_mhc.get_tp_group = lambda: gb300_tp_group(case["mnnvl"])
            try:
                decoded = dsv41.specialized_decode_config(dsv41_config(engine))
                got["refuses"] = None
                got["decode"] = "specialized" if decoded is not None else "stock"
            except ValueError as exc:
                got["refuses"] = f"ValueError: {exc}"
        elif case["row"].startswith("muse") and flashinfer_ops is not None:
            cfg = SimpleNamespace(attention_config=attention,
                                  parallel_config=SimpleNamespace(tensor_parallel_size=engine.tensor_parallel_size))
            got["unsupported"] = flashinfer_ops.unsupported(cfg)
        elif case["row"].startswith("muse"):
            got["unsupported"] = "n/a: no Muse Spark specialized decode in this release"
        else:
            config = VllmConfig()
            config.attention_config = attention
            if attention.hisparse_config is None and kv is not None and kv.has_connector("HiSparseConnector"):
                from vllm.config.attention import HiSparseConfig
                attention.hisparse_config = HiSparseConfig()
            far._node_count = (lambda g: 2) if case["shape"] == "multi-pod" else real_count
            real_create = far.flashinfer_comm.create_allreduce_fusion_workspace
            far.flashinfer_comm.create_allreduce_fusion_workspace = stand_in(case["mnnvl"])
            reset()
            try:
                with set_current_vllm_config(config):
                    got["resolved"] = far._resolve_fi_ar_backend(group)[0]
                    workspace = far.get_fi_ar_workspace(
                        world_size=8, rank=0, max_token_num=2048, hidden_dim=7168, dtype=torch.bfloat16, group=group
                    )
                got["workspace"] = None if workspace is None else workspace.backend
            except Exception as exc:
                got["workspace"] = f"raises {type(exc).__name__}: {exc}"
            far.flashinfer_comm.create_allreduce_fusion_workspace = real_create
            far._node_count = real_count
        r[which] = got
    out.append(r)
print(json.dumps({"version": vllm.__version__, "results": out}))
"""


def cases(release: str) -> list[dict[str, Any]]:
    found = []
    for row, spellings in SPELLINGS.items():
        for spelling, tokens in spellings.items():
            for node in NODES:
                for shape in SHAPES_OF.get(row, ("single",)):
                    fiar = _decision_env(row, tokens, node, shape, release, True)
                    control = _decision_env(row, tokens, node, shape, release, False)
                    found.append(
                        {
                            "key": f"{row} | {spelling} | {node} | {shape}",
                            "row": row,
                            "shape": shape,
                            "mnnvl": MNNVL_ANSWER[node],
                            "tokens": tokens,
                            "fiar": fiar,
                            "control": control,
                            **({"own": {}} if row == NOT_A_ROW else {}),
                            "fiar_read": _read(tokens),
                        }
                    )
    return found


def _read(tokens: list[str]) -> dict[str, Any]:
    read = commands.vllm_options({"name": "v", "command": ["vllm", "serve", "m", *tokens]})
    assert read is not None
    return {
        "decode_backend": next(iter(read.decode_backends), None),
        "tp": next(iter(read.tps), 1),
        "hisparse": read.hisparse,
    }


def breaks(result: dict[str, Any], which: str) -> str | None:
    got = result[which]
    if "refuses" in got:
        # fiar's values break the option where they refuse it and the container's own do not.
        return str(got["refuses"]) if got["refuses"] and not result["own"]["refuses"] else None
    if "unsupported" in got:
        reason = got["unsupported"]
        return None if reason is None or str(reason).startswith("n/a") else f"ValueError: ... does not support {reason}"
    if str(got["workspace"]).startswith("raises"):
        return str(got["workspace"])
    return "mnnvl workspace (crashes with HiSparse, vLLM #64327)" if got["workspace"] == "mnnvl" else None


def _outcome(got: dict[str, Any]) -> Any:
    """What the release's check gave: the workspace, Muse Spark's reason, or DeepSeek V4.1's refusal or decode."""
    if "refuses" in got:
        return got["refuses"] or got["decode"]
    return got.get("workspace", got.get("unsupported"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(VERSIONS))
    parser.add_argument("--out", type=Path, default=None)
    opts = parser.parse_args()
    report: dict[str, Any] = {}
    failed = 0
    for version in opts.versions.split(","):
        venv = parser_check.prepare(version)
        found = cases(version)
        doc = parser_check.run_in_venv(
            venv, ["-c", CHECKER], found, ("VLLM_",), 900, VLLM_TARGET_DEVICE="cpu", VLLM_CONFIGURE_LOGGING="0"
        )
        print(f"\nvLLM {doc['version']}")
        for case, result in zip(found, doc["results"], strict=True):
            agrees = case["fiar_read"] == result["parsed"]
            fiar_breaks, control_breaks = breaks(result, "fiar"), breaks(result, "control")
            ok = agrees and fiar_breaks is None and result["fiar"].get("decode") != "stock"
            failed += not ok
            what = _outcome(result["fiar"])
            own = f" | container's own: {_outcome(result['own'])}" if "own" in result else ""
            print(
                f"  {'ok ' if ok else 'BAD'} {case['key']:70} fiar: {case['fiar'][contract.ENV_VAR]:6} "
                f"use={case['fiar'][contract.ENV_ALLREDUCE_USE_FLASHINFER]} "
                f"guard={1 if case['fiar'][GUARD_TORCH] == '1' else 0} -> {what!s:8} "
                f"| without the table: {control_breaks or 'runs'}{'' if agrees else ' | READ DIFFERS'}{own}"
            )
            result.update(case=case, fiar_breaks=fiar_breaks, control_breaks=control_breaks, read_agrees=agrees)
        report[version] = doc
    if opts.out:
        opts.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\n{failed} case(s) where fiar's value breaks the option or fiar reads it differently")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
