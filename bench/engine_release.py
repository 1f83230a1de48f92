"""Qualify an engine release for fiar in one command: ``bench/engine_release.py vllm 0.34.0`` (SGLang:
``bench/engine_release.py sglang 0.5.23``).

1. Downloads the release's wheel (``pip download --no-deps`` into ``~/.cache/fiar/wheels``, override
   ``FIAR_WHEEL_CACHE``; a cached wheel is read without the network).
2. Lists every file of the wheel that reaches a FlashInfer allreduce workspace or a multicast primitive
   (``CALLER_WORDS``, per engine: the workspace getters and the modules that build the workspaces, the
   fused ops that call them, FlashInfer's workspace and multicast buffers, PyTorch symmetric memory,
   NVSHMEM and NCCL NVLS (SGLang), multicast pointers, ``multimem``, the multicast capability probes), and diffs the
   list with the reviewed list of the newest qualified release (``bench/engine_releases/``, committed).
   A file that is in the release but in no reviewed list fails the command, by name: someone reads it,
   decides which fiar switch reaches it, and commits the release's reviewed list.
3. Reads the FlashInfer the release pins and diffs ``flashinfer/comm`` with the FlashInfer of the newest
   qualified release before it (for an engine's oldest reviewed release: the agent's FlashInfer, the
   ``gpu`` extra of ``pyproject.toml``; a pin the registry does not serve is read as its stand-in,
   ``vllm_fi_ar_check.FLASHINFER_STAND_INS``): the files that differ, and whether the functions fiar's
   verdicts rest on (the workspace creation, the multicast setup, the no-multicast error) are the same
   source.
4. Unless ``--scan-only``: runs the workspace check (``vllm_fi_ar_check.py``), the parser check
   (``vllm_parser_check.py``) and the option-breaks check (``vllm_option_check.py``) on the release
   (SGLang: ``sglang_check.py``), and prints the table rows to add (``releases.OFF_BY_FAILING_MNNVL``,
   ``releases.FLASHINFER_PINS``).

Exit 0: qualified (no caller outside the reviewed lists, every check passed); 1: not (what, by name);
2: wrong usage or a release that cannot be fetched.

    .venv/bin/python bench/engine_release.py vllm 0.34.0 [--scan-only] [--against 0.33.0] [--out DIR]
    .venv/bin/python bench/engine_release.py sglang 0.5.23 [--scan-only] [--against 0.5.20]
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import vllm_fi_ar_check

HERE = Path(__file__).resolve().parent
REVIEWED = HERE / "engine_releases"
WHEELS = Path(os.environ.get("FIAR_WHEEL_CACHE", Path.home() / ".cache" / "fiar" / "wheels"))
MULTICAST_WORDS = (
    "multicast_ptr",
    "multimem",
    "cuMulticast",
    "has_multicast_support",
    "is_multicast_supported",
    "allreduce_fusion(",
)
"""Multicast pointers, ``multimem`` PTX, the CUDA multicast driver calls, the capability probes, and
FlashInfer's fused allreduce call."""
CALLER_WORDS: dict[str, tuple[str, ...]] = {
    # The workspace check's callers (the getters, the fused ops, FlashInfer's multicast buffers), and multicast.
    "vllm": vllm_fi_ar_check.CALLER_WORDS + MULTICAST_WORDS,
    "sglang": (
        # FlashInfer's allreduce fusion workspaces (trtllm, mnnvl, cutedsl) and the modules that build them
        "create_allreduce_fusion_workspace",
        "trtllm_create_ipc_workspace",
        "flashinfer_comm_fusion",
        "flashinfer_mnnvl_cutedsl",
        "flashinfer.comm.mnnvl",
        "McastGPUBuffer",
        "SymmDeviceMemory",
        # PyTorch symmetric memory (multicast unless TORCH_SYMM_MEM_DISABLE_MULTICAST), NVSHMEM, NCCL NVLS
        "torch.distributed._symmetric_memory",
        "TORCH_SYMM_MEM_DISABLE",
        "NVSHMEM",
        "nvshmem",
        "NCCL_NVLS",
        "ncclCommWindowRegister",
        # multicast pointers handed to SGLang's own kernels, and the capability attribute
        "mc_ptr",
        "MULTICAST_SUPPORTED",
        *MULTICAST_WORDS,
    ),
}
"""Words whose presence in a file of the engine means it reaches a FlashInfer allreduce workspace or a
multicast primitive (ROCm-only ``/amd/`` files are left out)."""
FLASHINFER_FUNCTIONS = (
    ("allreduce.py", "create_allreduce_fusion_workspace"),
    ("mnnvl.py", "_setup_multicast"),
)
"""The FlashInfer functions fiar's verdicts rest on: the call the checks stand in, and the multicast
setup (create, broadcast, bind) the agent's smoke test runs."""
FLASHINFER_TEXTS = (
    ("mnnvl.py", "[SymmDeviceMemory] Device does not support multicasting."),
    ("trtllm_mnnvl_ar.py", "[MNNVLAllReduceFusionWorkspace] Multicast pointer is null after rendezvous."),
)
"""The errors the checks' stand-in raises and the agent reads (no multicast; a null multicast pointer)."""
VERSION = re.compile(r"^\d{1,4}\.\d{1,4}(\.\d{1,4})?(\.post\d{1,3})?$")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def wheel(package: str, version: str, offline: bool = False) -> Path:
    """The cached wheel of ``package`` ``version``, downloaded when missing (not when ``offline``)."""
    stem = package.replace("-", "_")
    found = next(WHEELS.glob(f"{stem}-{version}-*.whl"), None)
    if found is None and not offline:
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{package}=={version}", "-d", str(WHEELS)],
            check=False,
            timeout=1800,
        )
        found = next(WHEELS.glob(f"{stem}-{version}-*.whl"), None)
    if found is None:
        raise FileNotFoundError(f"no {package} {version} wheel in {WHEELS}" + (" (offline)" if offline else ""))
    return found


def callers(path: Path, engine: str) -> list[str]:
    """The files of an engine wheel that name a word of ``CALLER_WORDS``."""
    words = CALLER_WORDS[engine]
    found = []
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            if not name.startswith(f"{engine}/") or not name.endswith(".py") or "/amd/" in name:
                continue
            text = zf.read(name).decode(errors="replace")
            if any(w in text for w in words):
                found.append(name)
    return sorted(found)


def reviewed(engine: str) -> dict[str, list[str]]:
    """Version -> reviewed caller list, for every release of ``engine`` with a committed list."""
    lists = {}
    for path in REVIEWED.glob(f"{engine}-*.txt"):
        version = path.stem.split("-", 1)[1]
        lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
        lists[version] = [line for line in lines if line]
    return lists


def pin(path: Path, package: str = "flashinfer") -> str | None:
    """The FlashInfer version an engine wheel pins (``flashinfer-python==X`` or ``flashinfer_python[..]==X``)."""
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    found = re.search(rf"^Requires-Dist: {package}[-_]python(?:\[[\w,]+\])?\s*==\s*([\w.]+)\s*$", text, re.M)
    return found.group(1) if found else None


def _comm(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as zf:
        return {
            n.removeprefix("flashinfer/comm/"): zf.read(n).decode(errors="replace")
            for n in zf.namelist()
            if n.startswith("flashinfer/comm/") and n.endswith(".py")
        }


def _functions(text: str, name: str) -> list[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    return [ast.get_source_segment(text, n) or "" for n in nodes]


def comm_diff(old: Path, new: Path) -> dict[str, Any]:
    """How ``flashinfer/comm`` of two FlashInfer wheels differ, and whether fiar's functions are the same."""
    a, b = _comm(old), _comm(new)
    changed = sorted(f for f in a.keys() & b.keys() if a[f] != b[f])
    same = {
        f"{file}:{name}": _functions(a.get(file, ""), name) == _functions(b.get(file, ""), name)
        and bool(_functions(b.get(file, ""), name))
        for file, name in FLASHINFER_FUNCTIONS
    }
    for file, text in FLASHINFER_TEXTS:
        same[f"{file}: {text}"] = text in a.get(file, "") and text in b.get(file, "")
    sources = ["".join(_functions(b.get(file, ""), name)) for file, name in FLASHINFER_FUNCTIONS]
    digest = hashlib.sha256("".join(sources).encode())
    return {
        "changed": changed,
        "added": sorted(b.keys() - a.keys()),
        "removed": sorted(a.keys() - b.keys()),
        "same_functions": same,
        "functions_sha256": digest.hexdigest()[:16],
    }


def stand_in(version: str) -> str:
    return vllm_fi_ar_check.FLASHINFER_STAND_INS.get(version, version)


def agent_flashinfer() -> str | None:
    """The FlashInfer the agent's smoke tests run (``pyproject.toml``, the ``gpu`` extra): what the
    oldest reviewed release of an engine is compared with."""
    text = (HERE.parent / "pyproject.toml").read_text()
    found = re.search(r'"flashinfer-python==([\w.]+)"', text)
    return found.group(1) if found else None


def off_by_failing_mnnvl(doc: dict[str, Any]) -> list[str]:
    """The ``OFF_BY_FAILING_MNNVL`` row the workspace check's results give (the rule of
    tests/fiar_operator/pure/test_release_table_follows_the_vllm_check.py)."""
    outcome = {r["case"]: r["outcome"] for r in doc["rows"] if r["env"] == "mnnvl"}
    quant = {r["case"]: r.get("quant_direct") for r in doc["rows"] if r["env"] == "mnnvl"}
    row = []
    if outcome["a"] == "off" and outcome["b"] == "off" and quant.get("a") is None and quant.get("b") is None:
        row.append("no-multicast")
    if outcome["b"] == "off" and outcome["c"] == "off" and doc["facts"]["failure_cached"] and quant.get("c") is None:
        row.append("failed-on-every-rank")
    return row


def _run_check(script: str, version: str, out: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, str(HERE / script), "--versions", version, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=7200,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(str(HERE.parent / p) for p in ("", "operator", "tools"))},
    )
    return proc.returncode, proc.stdout + proc.stderr[-3000:]


def qualify(engine: str, version: str, against: str | None, scan_only: bool, offline: bool, out: Path) -> int:
    path = wheel(engine, version, offline)
    found = callers(path, engine)
    lists = reviewed(engine)
    older = sorted((v for v in lists if _key(v) < _key(version)), key=_key)
    base = against or (version if version in lists else (older[-1] if older else None))
    known = set(lists.get(base, [])) if base else set()
    new = [f for f in found if f not in known]
    gone = sorted(known - set(found))
    print(f"{engine} {version}: {len(found)} files reach a FlashInfer allreduce workspace or a multicast primitive")
    print(f"  reviewed list compared: {engine}-{base}.txt" if base else "  no reviewed list to compare with")
    for f in new:
        print(f"  NEW CALLER (not reviewed): {f}")
    for f in gone:
        print(f"  gone since {base}: {f}")
    failed = bool(new) or base is None
    report: dict[str, Any] = {"engine": engine, "version": version, "against": base, "callers": found, "new": new}
    fi = pin(path)
    report["flashinfer_pin"] = fi
    if fi is not None:
        if older:
            prior, whose = pin(wheel(engine, older[-1], offline)), f"{engine} {older[-1]}'s pin"
        else:
            prior, whose = agent_flashinfer(), "the agent's, pyproject.toml"
        if prior is not None:
            try:
                old = wheel("flashinfer-python", stand_in(prior), offline)
                diff = comm_diff(old, wheel("flashinfer-python", stand_in(fi), offline))
            except FileNotFoundError as exc:
                diff = {"error": str(exc)}
            report["flashinfer_comm"] = {"from": stand_in(prior), "whose": whose, "to": stand_in(fi), **diff}
            same = diff.get("same_functions", {})
            print(
                f"  FlashInfer pin {fi} (read as {stand_in(fi)}); flashinfer/comm against {stand_in(prior)} "
                f"({whose}): {len(diff.get('changed', []))} files changed, {len(diff.get('added', []))} added; "
                f"fiar's functions the same: {all(same.values()) if same else 'unknown'} "
                f"(digest {diff.get('functions_sha256', '-')}) {diff.get('error', '')}"
            )
            for what, equal in same.items():
                print(f"    {'same' if equal else 'DIFFERS'}: {what}")
    if not scan_only:
        scripts = (
            ("vllm_fi_ar_check.py", "vllm_parser_check.py", "vllm_option_check.py")
            if engine == "vllm"
            else ("sglang_check.py",)
        )
        out.mkdir(parents=True, exist_ok=True)
        for script in scripts:
            target = out / f"{script.removesuffix('.py')}-{version}.json"
            code, text = _run_check(script, version, target)
            report[script] = code
            print(f"  {script}: {'passed' if code == 0 else f'FAILED (exit {code})'}")
            if code != 0:
                print(text[-2000:])
                failed = True
        cases = out / f"sglang_check-{version}.json"
        if engine == "sglang" and cases.exists():
            rows = json.loads(cases.read_text())["versions"][version]["rows"]
            report["sglang_check_cases"] = {"expected": sum(bool(r["ok"]) for r in rows), "all": len(rows)}
            print(f"    {report['sglang_check_cases']['expected']}/{len(rows)} cases as expected")
        workspace = out / f"vllm_fi_ar_check-{version}.json"
        if engine == "vllm" and workspace.exists():
            doc = json.loads(workspace.read_text())["versions"][version]
            row = off_by_failing_mnnvl(doc)
            major, minor = (int(p) for p in version.split(".")[:2])
            print("\nRows to add (operator/fiar_operator/core/releases.py):")
            print(f"  OFF_BY_FAILING_MNNVL[({major}, {minor})] = frozenset({set(row) or ''})")
            print(f'  FLASHINFER_PINS[({major}, {minor})] = "{fi}"')
            report["off_by_failing_mnnvl"] = row
    if new:
        print(
            f"\nNot qualified: {len(new)} file(s) reach FlashInfer allreduce or multicast and are in no reviewed list."
            f" Review each, then commit bench/engine_releases/{engine}-{version}.txt."
        )
    (out / f"engine-release-{engine}-{version}.json").parent.mkdir(parents=True, exist_ok=True)
    (out / f"engine-release-{engine}-{version}.json").write_text(json.dumps(report, indent=1) + "\n")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=sorted(CALLER_WORDS))
    parser.add_argument("version")
    parser.add_argument("--against", default=None, help="diff with this release's reviewed list")
    parser.add_argument("--scan-only", action="store_true", help="list and diff the callers; run no check")
    parser.add_argument("--offline", action="store_true", help="read cached wheels only")
    parser.add_argument("--out", type=Path, default=Path.home() / ".cache" / "fiar" / "engine-release")
    opts = parser.parse_args(argv)
    if not VERSION.match(opts.version) or (opts.against and not VERSION.match(opts.against)):
        print(f"not a release: {opts.version!r}", file=sys.stderr)
        return 2
    try:
        return qualify(opts.engine, opts.version, opts.against, opts.scan_only, opts.offline, opts.out)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
