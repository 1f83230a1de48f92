"""How each NCCL release reads ``NCCL_NVLS_ENABLE``, by its own parser, on CPU.

NCCL reads the variable through ``NCCL_PARAM(NvlsEnable, "NVLS_ENABLE", 2)``: a local function
``ncclParamNvlsEnable()`` that parses the environment once (``ncclLoadParam``, ``src/misc/param.cc``)
and returns the value NVLS setup then uses (``src/transport/nvls.cc``: 0 off, 2 auto by the device's
multicast attribute, 1 on). This script loads the ``libnccl.so.2`` of each ``nvidia-nccl-cu13`` wheel
(``pip download --no-deps`` into ``~/.cache/fiar/wheels``), finds that local function in the library's
symbol table (``nm``), places it by the exported ``ncclGetVersion`` anchor, and calls it in a fresh
process per value (the result is cached per process). No GPU call is made.

    .venv/bin/python bench/nccl_param_check.py [--versions 2.31.2,2.32.6] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

VERSIONS = ("2.31.2", "2.32.6")
WHEELS = Path(os.environ.get("FIAR_WHEEL_CACHE", Path.home() / ".cache" / "fiar" / "wheels"))
VALUES: tuple[str | None, ...] = (
    *(None, "", "0", " 0", "0 ", "00", "0x0", "1", "2", "3", "-1"),
    *("abc", "false", "true", "no", "off", " "),
)
SYMBOL = "_Z19ncclParamNvlsEnablev"
ANCHOR = "ncclGetVersion"

CALL = r"""
import ctypes, json, sys
lib_path, param_off, anchor_off = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lib = ctypes.CDLL(lib_path)
anchor = ctypes.cast(lib.ncclGetVersion, ctypes.c_void_p).value
param = ctypes.CFUNCTYPE(ctypes.c_int64)(anchor - anchor_off + param_off)
version = ctypes.c_int()
lib.ncclGetVersion(ctypes.byref(version))
print(json.dumps({"value": param(), "version": version.value}))
"""


def library(version: str, into: Path) -> Path:
    found = next(WHEELS.glob(f"nvidia_nccl_cu13-{version}-*.whl"), None)
    if found is None:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
        subprocess.run([*pip, f"nvidia-nccl-cu13=={version}", "-d", str(WHEELS)], check=True)
        found = next(WHEELS.glob(f"nvidia_nccl_cu13-{version}-*.whl"))
    with zipfile.ZipFile(found) as zf:
        name = next(n for n in zf.namelist() if n.endswith("/libnccl.so.2"))
        zf.extract(name, into)
    return into / name


def offsets(lib: Path) -> tuple[int, int]:
    """(``ncclParamNvlsEnable``, ``ncclGetVersion``) offsets from ``nm`` (the local symbol table)."""
    out = subprocess.run(["nm", str(lib)], capture_output=True, text=True, check=True).stdout
    found: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] in (SYMBOL, ANCHOR):
            found[parts[2]] = int(parts[0], 16)
    return found[SYMBOL], found[ANCHOR]


def read(lib: Path, value: str | None) -> dict[str, Any]:
    param_off, anchor_off = offsets(lib)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env["NCCL_DEBUG"] = "WARN"
    if value is not None:
        env["NCCL_NVLS_ENABLE"] = value
    proc = subprocess.run(
        [sys.executable, "-c", CALL, str(lib), str(param_off), str(anchor_off)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-300:]}
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    logged = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if "NVLS_ENABLE" in line]
    if logged:
        doc["log"] = logged[0][-160:]
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default=",".join(VERSIONS))
    parser.add_argument("--out", type=Path, default=None)
    opts = parser.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for version in opts.versions.split(","):
            lib = library(version, Path(tmp) / version)
            rows = {("unset" if v is None else repr(v)): read(lib, v) for v in VALUES}
            report[version] = rows
    versions = list(report)
    print(f"{'NCCL_NVLS_ENABLE':18}" + "".join(f"{v:>10}" for v in versions))
    for key in report[versions[0]]:
        print(f"{key:18}" + "".join(f"{report[v][key].get('value', 'error')!s:>10}" for v in versions))
    if opts.out:
        opts.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
