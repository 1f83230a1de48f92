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

Stand-ins: none for Muse Spark's check (it reads the config and the environment only); ``_node_count``
for the multi-pod shape. The venvs are ``bench/vllm_parser_check.py``'s (``~/.cache/fiar/vllm-check``).

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
SHAPES = ("single", "multi-pod")
POLICY = {"metadata": {"name": "vllm"}, "spec": {"podSelector": {}, "imexChannel": "Provided"}}


def _decision_env(row: str, tokens: list[str], node: str, shape: str, release: str, table: bool) -> dict[str, str]:
    policy = parse_policy(
        {**POLICY, "spec": {**POLICY["spec"], **({"multiNode": "Always"} if shape == "multi-pod" else {})}}
    )
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
    for which in ("fiar", "control"):
        env = case[which]
        for key in ("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "VLLM_ALLREDUCE_USE_FLASHINFER"):
            os.environ[key] = env[key]
        got = {}
        if case["row"].startswith("muse") and flashinfer_ops is not None:
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
                for shape in SHAPES:
                    if row.startswith("muse") and shape == "multi-pod":
                        continue
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
    if "unsupported" in got:
        reason = got["unsupported"]
        return None if reason is None or str(reason).startswith("n/a") else f"ValueError: ... does not support {reason}"
    if str(got["workspace"]).startswith("raises"):
        return got["workspace"]
    return "mnnvl workspace (crashes with HiSparse, vLLM #64327)" if got["workspace"] == "mnnvl" else None


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
            ok = agrees and fiar_breaks is None
            failed += not ok
            what = result["fiar"].get("workspace", result["fiar"].get("unsupported"))
            print(
                f"  {'ok ' if ok else 'BAD'} {case['key']:70} fiar: {case['fiar'][contract.ENV_VAR]:6} "
                f"use={case['fiar'][contract.ENV_ALLREDUCE_USE_FLASHINFER]} -> {what!s:8} "
                f"| without the table: {control_breaks or 'runs'}{'' if agrees else ' | READ DIFFERS'}"
            )
            result.update(case=case, fiar_breaks=fiar_breaks, control_breaks=control_breaks, read_agrees=agrees)
        report[version] = doc
    if opts.out:
        opts.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\n{failed} case(s) where fiar's value breaks the option or fiar reads it differently")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
