"""Every FlashInfer allreduce path in vLLM, run per release on CPU with one GPU call stood in.

vLLM reaches FlashInfer's fused allreduce from three places: the compile pass
(``pass_config.fuse_allreduce_rms``), the standalone allreduce in ``cuda_communicator``
(``VLLM_ALLREDUCE_USE_FLASHINFER``) and model-level fused ops (DeepSeek-V3.2, Kimi-K3, MiniMax-M3
NVIDIA model files), which neither switch reaches. All of them take their workspace from
``flashinfer_all_reduce.get_fi_ar_workspace``. This script runs, in a venv per vLLM release, that
release's own ``_resolve_fi_ar_backend``, ``get_fi_ar_workspace``, ``get_fi_ar_quant_workspace`` and
``_create_workspace`` on a one-rank gloo process group (vLLM's ``init_distributed_environment`` and
``initialize_model_parallel``, world size 1, CPU platform), for each value of
``VLLM_FLASHINFER_ALLREDUCE_BACKEND`` (unset, auto, trtllm, mnnvl) and each node case below, and
records the backend resolved, the workspace returned (None: every caller runs NCCL) and any
exception that escapes (a crash at engine start).

**Stand-in.** Exactly one GPU call is replaced: ``flashinfer.comm.create_allreduce_fusion_workspace``
(the function every release's ``_create_workspace`` calls). The stand-in answers as a node's
recorded FlashInfer test did. A ``trtllm`` request is always answered with a working trtllm
workspace; an ``mnnvl`` request is answered by the case:

* (a) raises ``RuntimeError("[SymmDeviceMemory] Device does not support multicasting.")``, the text
  FlashInfer >= 0.6.13 raises where ``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` reads 0;
* (b) returns an mnnvl workspace whose ``mc_ptr`` is 0 (FlashInfer 0.6.10-0.6.15 build mnnvl on
  PyTorch symmetric memory, which hands back a null multicast pointer on such a GPU);
* (c) raises ``RuntimeError("CUDA error code=802(b'CUDA_ERROR_SYSTEM_NOT_READY')")``, the words
  FlashInfer's ``checkCudaErrors`` gives a failed ``cuMulticastBindMem`` (fabric manager down);
* (d) the node's trtllm workspace works; an mnnvl request is not what case (d) describes, so those
  rows read ``n/a`` (the stand-in raises a ``BaseException`` that vLLM's ``except Exception`` does
  not catch, and the row is dropped from the verdict);
* (e) returns a working mnnvl workspace (non-zero ``mc_ptr``): the node's test failed later (the
  graph-capture crash of vLLM #48071), so vLLM runs mnnvl there.

The stand-in workspaces carry only what vLLM reads of one (``backend``, ``mc_ptr``, ``destroy``,
``is_buffer_size_sufficient``). Everything else is the release's own code.

Per release the script also reads the release's files and records each caller of a FlashInfer
allreduce workspace, whether it goes through ``get_fi_ar_workspace`` (and so falls back to NCCL
when that returns None), whether ``VLLM_ALLREDUCE_USE_FLASHINFER`` exists and its default, and the
FlashInfer version the release pins (installed in its venv, ``--no-deps``).

The venvs are those of ``bench/vllm_parser_check.py`` (``~/.cache/fiar/vllm-check``, override with
``FIAR_VLLM_CHECK_DIR``), plus one small overlay per release with its pinned flashinfer-python.

    .venv/bin/python bench/vllm_fi_ar_check.py [--versions 0.25.1,0.27.1,0.32.0,0.33.0] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

VERSIONS = ("0.25.1", "0.27.1", "0.32.0", "0.33.0", "0.34.0")
FLASHINFER_STAND_INS = {"0.7.3": "0.7.4"}
"""Pinned FlashInfer releases the registry does not serve -> the release run instead. vLLM 0.34.0 pins
0.7.3 (not on PyPI); 0.7.2.post1 and 0.7.4 bracket it, and the one call the check stands in
(``flashinfer.comm.create_allreduce_fusion_workspace``) is the same source in both
(``bench/engine_release.py`` diffs ``flashinfer/comm`` between them)."""
ENV_VALUES = ("unset", "auto", "trtllm", "mnnvl")
CASES = {
    "a": "mnnvl creation raises the attribute-0 error",
    "b": "mnnvl workspace with a null mc_ptr",
    "c": "mnnvl creation raises a CUDA multicast-bind error",
    "d": "trtllm workspace works",
    "e": "mnnvl workspace works (the node failed later)",
}
ATTRIBUTE_0_TEXT = "[SymmDeviceMemory] Device does not support multicasting."
BIND_ERROR_TEXT = "CUDA error code=802(b'CUDA_ERROR_SYSTEM_NOT_READY')"
WORKING_MC_PTR = 0x7F0000000000

# Files that reach FlashInfer's fused allreduce or its multicast buffers, found by these words.
CALLER_WORDS = (
    "get_fi_ar_workspace(",
    "get_fi_ar_quant_workspace(",
    "_can_use_flashinfer(",
    "fused_allreduce_rms_norm(",
    "fused_allreduce_gemma_rms_norm(",
    "FlashInferAllReduce(",
    "McastGPUBuffer",
    "create_allreduce_fusion_workspace",
    "mnnvl_cutedsl",
)


# ----------------------------------------------------------------------------------------------
# Worker: runs inside a release's venv (``python vllm_fi_ar_check.py --worker``). Standard library,
# torch and that release's vLLM and FlashInfer only.
# ----------------------------------------------------------------------------------------------


class NotThisCase(BaseException):
    """An mnnvl request in case (d): not what the case describes (vLLM's ``except Exception`` lets it by)."""


class StandInWorkspace:
    """What the stand-in hands back: the attributes vLLM reads of a FlashInfer workspace."""

    def __init__(self, backend: str, mc_ptr: int | None = None) -> None:
        self.backend = backend
        if mc_ptr is not None:
            self.mc_ptr = mc_ptr
        self.destroyed = False

    def destroy(self) -> None:
        self.destroyed = True

    def is_buffer_size_sufficient(self, **_: Any) -> bool:
        return True


def stand_in(case: str, asked: list[str]) -> Any:
    """The stand-in for ``flashinfer.comm.create_allreduce_fusion_workspace`` in ``case``."""

    def create_allreduce_fusion_workspace(*, backend: str, **_: Any) -> StandInWorkspace:
        asked.append(backend)
        if backend == "trtllm":
            return StandInWorkspace("trtllm")
        if case == "a":
            raise RuntimeError(ATTRIBUTE_0_TEXT)
        if case == "b":
            return StandInWorkspace("mnnvl", mc_ptr=0)
        if case == "c":
            raise RuntimeError(BIND_ERROR_TEXT)
        if case == "d":
            raise NotThisCase(backend)
        return StandInWorkspace("mnnvl", mc_ptr=WORKING_MC_PTR)

    return create_allreduce_fusion_workspace


def _describe(workspace: Any) -> dict[str, Any] | None:
    if workspace is None:
        return None
    return {"backend": workspace.backend, "mc_ptr": getattr(workspace, "mc_ptr", None)}


def outcome(row: dict[str, Any]) -> str:
    """What the pod runs: off (NCCL everywhere), on:<backend>, crash, or null-mc-ptr (a crash later)."""
    if row.get("not_this_case"):
        return "n/a"
    if row["escaped"]:
        return "crash"
    workspace = row["workspace"]
    if workspace is None:
        return "off"
    if workspace["backend"] == "mnnvl" and not workspace["mc_ptr"]:
        return "null-mc-ptr"  # kernels dereference a null multicast pointer (vLLM #48071, #49041)
    return f"on:{workspace['backend']}"


def _reset(far: Any) -> None:
    for name in ("_fi_ar_workspace", "_fi_ar_quant_workspace"):
        setattr(far, name, None)
    for name in ("_fi_ar_workspace_failed", "_fi_ar_quant_workspace_failed"):
        if hasattr(far, name):
            setattr(far, name, False)
    if hasattr(far, "_fi_ar_workspace_groups"):
        far._fi_ar_workspace_groups.clear()


def _callers(root: Path) -> list[dict[str, Any]]:
    """Each file of the release that reaches a FlashInfer allreduce workspace, and how."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if "/amd/" in rel or rel.endswith("device_communicators/flashinfer_all_reduce.py"):
            continue
        text = path.read_text(errors="replace")
        words = [w for w in CALLER_WORDS if w in text]
        if not words:
            continue
        if {"McastGPUBuffer", "mnnvl_cutedsl"} & set(words) and "get_fi_ar_workspace(" not in words:
            route = "own multicast buffer (names McastGPUBuffer or mnnvl_cutedsl), not through get_fi_ar_workspace"
        elif "get_fi_ar_workspace(" in words:
            route = "get_fi_ar_workspace"
        elif "get_fi_ar_quant_workspace(" in words:
            route = "get_fi_ar_quant_workspace"  # vLLM 0.34 Qwen3.5: the quant workspace asked for directly
        elif "_can_use_flashinfer(" in words:
            route = "_can_use_flashinfer -> get_fi_ar_workspace"
        elif "FlashInferAllReduce(" in words:
            route = "FlashInferAllReduce -> get_fi_ar_workspace"
        elif {"fused_allreduce_rms_norm(", "fused_allreduce_gemma_rms_norm("} & set(words):
            route = "fused_allreduce_*_norm -> _can_use_flashinfer -> get_fi_ar_workspace"
        else:
            continue  # a capability probe (hasattr create_allreduce_fusion_workspace)
        found.append({"file": rel, "route": route})
    return found


def _function_source(path: Path, name: str) -> str:
    import ast

    text = path.read_text()
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(text, node) or ""


def _source_facts(far: Any) -> dict[str, Any]:
    import inspect

    import vllm.envs as envs

    create_src = inspect.getsource(far._create_workspace)
    get_src = inspect.getsource(far.get_fi_ar_workspace)
    facts: dict[str, Any] = {
        "resolve_signature": str(inspect.signature(far._resolve_fi_ar_backend)),
        "create_checks_mc_ptr": "mc_ptr" in create_src,
        "create_catches": re.findall(r"except ([\w. ()|,]+?)(?: as \w+)?:", create_src),
        "failure_cached": hasattr(far, "_fi_ar_workspace_failed"),
        "explicit_backend_no_fallback": bool(
            re.search(
                r'if backend != "auto":\s*\n(?:\s*#.*\n|\s*logger\..*\n)*\s*return backend, False',
                inspect.getsource(far._resolve_fi_ar_backend),
            )
        ),
        "standalone_disables_on_none": bool(
            re.search(r"if workspace is None:\s*\n\s*self\.disabled = True", inspect.getsource(far.FlashInferAllReduce))
        ),
        "get_returns_none_without_raising": "raise" not in get_src.split("_get_or_create")[-1],
    }
    environment = getattr(envs, "environment_variables", {})
    facts["VLLM_ALLREDUCE_USE_FLASHINFER"] = (
        {"exists": True, "default": bool(envs.VLLM_ALLREDUCE_USE_FLASHINFER)}
        if "VLLM_ALLREDUCE_USE_FLASHINFER" in environment
        else {"exists": False}
    )
    # Read, not imported: the helper imports the compile pass, whose custom ops need the release's own
    # compiled extension, built for the torch it pins.
    root = Path(far.__file__).parents[2]
    helper_src = _function_source(
        root / "model_executor/layers/fused_allreduce_gemma_rms_norm.py", "_can_use_flashinfer"
    )
    facts["model_helper_falls_back_on_none"] = bool(
        re.search(r"if workspace is None:\s*\n\s*return False, 0", helper_src)
    )
    pass_src = (root / "compilation/passes/fusion/allreduce_rms_fusion.py").read_text()
    facts["compile_pass_disables_on_none"] = "if get_fi_ar_workspace(**workspace_kwargs) is None:" in pass_src
    return facts


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    import inspect
    import socket

    import vllm
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    # No GPU here: vLLM's CPU platform, as vllm_parser_check.py does (VLLM_TARGET_DEVICE=cpu).
    vllm.platforms._current_platform = CpuPlatform()
    import flashinfer
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps
    from vllm.distributed.device_communicators import flashinfer_all_reduce as far

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ps.init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", local_rank=0, backend="gloo"
    )
    with set_current_vllm_config(VllmConfig()):
        ps.initialize_model_parallel(1, 1)
    group = ps.get_tp_group().cpu_group
    takes_group = "group" in inspect.signature(far._resolve_fi_ar_backend).parameters
    kwargs = {"world_size": 8, "rank": 0, "max_token_num": 2048, "hidden_dim": 7168, "dtype": torch.bfloat16}
    real_create = far.flashinfer_comm.create_allreduce_fusion_workspace

    rows = []
    for env_value in spec["envs"]:
        for case in spec["cases"]:
            os.environ.pop("VLLM_FLASHINFER_ALLREDUCE_BACKEND", None)
            if env_value != "unset":
                os.environ["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] = env_value
            _reset(far)
            asked: list[str] = []
            far.flashinfer_comm.create_allreduce_fusion_workspace = stand_in(case, asked)
            row: dict[str, Any] = {"env": env_value, "case": case, "escaped": None, "workspace": None}
            try:
                resolved = far._resolve_fi_ar_backend(group) if takes_group else far._resolve_fi_ar_backend()
                row["resolved"] = {"backend": resolved[0], "trtllm_fallback": resolved[1]}
                try:
                    row["create_mnnvl"] = _describe(far._create_workspace("mnnvl", group=group, **kwargs))
                except NotThisCase:
                    row["create_mnnvl"] = "n/a"
                asked.clear()
                _reset(far)
                workspace = far.get_fi_ar_workspace(group=group, **kwargs)
                row["workspace"] = _describe(workspace)
                row["asked"] = list(asked)
                before = len(asked)
                far.get_fi_ar_workspace(group=group, **kwargs)  # the next caller (a model layer, a step)
                row["asked_again"] = asked[before:]
                if workspace is not None:  # the compile pass asks for the quant workspace only then
                    row["quant_workspace"] = _describe(far.get_fi_ar_quant_workspace(group=group, **kwargs))
                # A caller that asks for the quant workspace first (vLLM 0.34 Qwen3.5's fused norm + quant).
                _reset(far)
                before = len(asked)
                try:
                    row["quant_direct"] = _describe(far.get_fi_ar_quant_workspace(group=group, **kwargs))
                except NotThisCase:
                    row["quant_direct"] = "n/a"
                row["quant_direct_asked"] = asked[before:]
            except NotThisCase:
                row["not_this_case"] = True
            except Exception as exc:
                row["escaped"] = f"{type(exc).__name__}: {exc}"
                row["asked"] = list(asked)
            finally:
                far.flashinfer_comm.create_allreduce_fusion_workspace = real_create
            row["outcome"] = outcome(row)
            rows.append(row)
    os.environ.pop("VLLM_FLASHINFER_ALLREDUCE_BACKEND", None)
    return {
        "vllm": vllm.__version__,
        "flashinfer": flashinfer.__version__,
        "torch": torch.__version__,
        "fi_ar_available": far.fi_ar_available,
        "facts": _source_facts(far),
        "callers": _callers(Path(vllm.__file__).parent),
        "rows": rows,
    }


# ----------------------------------------------------------------------------------------------
# Driver: runs in the project's venv.
# ----------------------------------------------------------------------------------------------


def flashinfer_pin(wheel: Path) -> str:
    """The flashinfer-python version a vLLM wheel requires (``Requires-Dist: flashinfer-python==X``)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    match = re.search(r"^Requires-Dist: flashinfer-python==([\w.]+)", text, re.M)
    if match is None:
        raise RuntimeError(f"{wheel.name} pins no flashinfer-python")
    return match.group(1)


def prepare(version: str) -> tuple[Path, str, str | None]:
    """(venv, pinned FlashInfer, why the pin is not used) for a release.

    The venv is vllm_parser_check's for the release under an overlay holding the release's pinned
    flashinfer-python. A pin that does not import on this Python is reported, and the release's
    code then runs over the base venv's FlashInfer: the stand-in replaces the only FlashInfer call
    the checked functions make, so they read nothing else of it but its names.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vllm_parser_check as parser_check

    plain = parser_check.prepare(version)
    wheel = parser_check._wheel(version)
    pin = flashinfer_pin(wheel)
    overlay = parser_check.CACHE / f"fi-ar-{version}"
    if not (overlay / ".ready").exists():
        parser_check._run([sys.executable, "-m", "venv", str(overlay)])
        pip = str(overlay / "bin" / "pip")
        installed = FLASHINFER_STAND_INS.get(pin, pin)
        parser_check._run([pip, "install", "-q", "--no-deps", f"flashinfer-python=={installed}"])
        below = [parser_check._site_packages(plain), parser_check._site_packages(parser_check.CACHE / "base")]
        (parser_check._site_packages(overlay) / "fiar-below.pth").write_text("".join(f"{p}\n" for p in below))
        (overlay / ".ready").write_text(pin)
    probe = subprocess.run(
        [str(overlay / "bin" / "python"), "-c", "import flashinfer.comm"],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
        check=False,
    )
    if probe.returncode == 0:
        if pin in FLASHINFER_STAND_INS:
            return overlay, pin, (
                f"flashinfer-python {pin} is not on the registry: ran {FLASHINFER_STAND_INS[pin]}, whose "
                "create_allreduce_fusion_workspace (the stood-in call) is the same source"
            )
        return overlay, pin, None
    last = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else f"exit {probe.returncode}"
    return plain, pin, f"flashinfer-python {pin} does not import on Python {sys.version.split()[0]}: {last}"


def check(venv: Path) -> dict[str, Any]:
    import vllm_parser_check as parser_check

    return parser_check.run_in_venv(
        venv,
        [str(Path(__file__).resolve()), "--worker"],
        {"envs": ENV_VALUES, "cases": list(CASES)},
        ("VLLM_",),
        900,
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CONFIGURE_LOGGING="0",
        PYTHONWARNINGS="ignore",
    )


def print_table(version: str, doc: dict[str, Any]) -> None:
    facts = doc["facts"]
    print(
        f"\nvLLM {doc['vllm']} (FlashInfer {doc['flashinfer']}, pinned {doc['flashinfer_pin']}; torch {doc['torch']})"
    )
    if doc["flashinfer_pin_unused"]:
        print(f"  {doc['flashinfer_pin_unused']}")
    print(
        f"  _resolve_fi_ar_backend{facts['resolve_signature']}; explicit backend without fallback: "
        f"{facts['explicit_backend_no_fallback']}; _create_workspace checks mc_ptr: {facts['create_checks_mc_ptr']}, "
        f"catches {facts['create_catches']}; failure cached: {facts['failure_cached']}"
    )
    print(f"  VLLM_ALLREDUCE_USE_FLASHINFER: {facts['VLLM_ALLREDUCE_USE_FLASHINFER']}")
    print(
        f"  on None: compile pass off {facts['compile_pass_disables_on_none']}, standalone off "
        f"{facts['standalone_disables_on_none']}, model helper falls back {facts['model_helper_falls_back_on_none']}"
    )
    head = "  env      " + "".join(f"({c}) {'':12}" for c in CASES)
    print(head)
    for env_value in ENV_VALUES:
        cells = []
        for case in CASES:
            row = next(r for r in doc["rows"] if r["env"] == env_value and r["case"] == case)
            again = "" if not row.get("asked_again") else "+retry"
            cells.append(f"{row['outcome'] + again:16}")
        print(f"  {env_value:8} " + "".join(cells))
    for caller in doc["callers"]:
        print(f"    {caller['file']}: {caller['route']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(VERSIONS))
    parser.add_argument("--out", type=Path, default=None, help="write the matrix as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        print(json.dumps(worker(json.load(sys.stdin))))
        return 0
    report: dict[str, Any] = {
        "stand_in": "flashinfer.comm.create_allreduce_fusion_workspace",
        "cases": CASES,
        "env_values": ENV_VALUES,
        "versions": {},
    }
    for version in opts.versions.split(","):
        venv, pin, unused = prepare(version)
        doc = check(venv)
        doc["flashinfer_pin"] = pin
        doc["flashinfer_pin_unused"] = unused
        report["versions"][version] = doc
        print_table(version, doc)
    if opts.out:
        opts.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
