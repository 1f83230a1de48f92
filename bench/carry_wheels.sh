#!/usr/bin/env bash
# Carry FlashInfer and the agent's missing packages to a lent GPU machine that reaches no registry.
#
# The device tool sends the working tree plus at most 64 MiB of carried paths per call, and a call's
# files under /tmp stay on the machine until it is given back (it stays warm 30 s after a call). The
# set below is ~185 MB (FlashInfer 0.7.2.post1 alone is 62 MB, CUTLASS DSL's CUDA 13 library 92 MB),
# so it travels as one tar split into PARTS pieces of at most 62 MB, one piece per call in a row:
#
#   here:   bench/carry_wheels.sh pack            # pip download into .whl/set, split into .whl/c1..cN
#   call 1: carry [".whl/c1"], command: bench/carry_wheels.sh stash
#   ...     carry [".whl/cK"], command: bench/carry_wheels.sh stash
#   last:   carry [".whl/cN"], command: bench/carry_wheels.sh install && . /tmp/site.env && bench/agent_gpu_verify.sh
#
# `install` joins the pieces, checks the tar's sha256 against the one computed here, and installs
# every wheel with `pip install --no-index --no-deps --target /tmp/site`, and writes /tmp/site.env,
# which puts /tmp/site (and the folder CUTLASS DSL's .pth file would add) first on PYTHONPATH. The machine's own image supplies the rest (torch 2.11.0+cu130, cuda-bindings,
# nvidia-ml-py, prometheus-client, PyYAML, aiohttp, jinja2, filelock, ninja, numpy, protobuf ...).
# /.whl/ is git-ignored: the wheels are never committed.
set -euo pipefail

FLASHINFER=${FLASHINFER:-0.7.2.post1}
PARTS=${PARTS:-3}
SITE=${SITE:-/tmp/site}
STASH=${STASH:-/tmp/fiar-carry}
WHL=${WHL:-.whl}

# One line per package: what flashinfer-python's and kubernetes' metadata require and the device
# image lacks. `import flashinfer, flashinfer.comm` (0.7.2.post1, 0.7.4) and the agent's whole
# bench/agent_gpu_verify.sh ran without the CUTLASS DSL wheels on 1x H100 (2026-12-06), with
# apache-tvm-ffi, nvidia-cudnn-frontend and cuda-tile only, and FlashInfer's wheel repacked as
# tar.xz (62 MB -> 16 MB; 0.7.4: 101 MB -> 26 MB), in one call; bench/results/agent/2026-12-06-h100x1/
# README.md. The DSL stays in this list for FlashInfer's CuTe DSL kernels. Left out: nccl4py and
# nccl-extensions (FlashInfer's moe_ep only, never on the allreduce path), cuda-python (a meta
# package over the image's cuda-bindings), google-auth (kubernetes imports it only for GKE auth).
WHEELS=(
  "flashinfer-python==${FLASHINFER}"
  "apache-tvm-ffi==0.1.15.post2"
  "nvidia-cudnn-frontend==1.32.0"
  "nvidia-cutlass-dsl==4.8.1"
  "nvidia-cutlass-dsl-libs-base==4.8.1"
  "nvidia-cutlass-dsl-libs-core==4.8.1"
  "nvidia-cutlass-dsl-libs-cu13==4.8.1"
  "cuda-tile==1.7.0"
  "kubernetes==37.0.2"
  "pydantic==2.14.4"
  "pydantic-core==2.50.5"
  "annotated-types==0.8.0"
  "typing-inspection==0.4.5"
  "typing-extensions==4.16.0"
  "urllib3==2.8.0"
  "durationpy==0.11"
  "websocket-client==1.9.2"
  "oauthlib==4.0.1"
  "requests-oauthlib==2.0.0"
  "aiohttp-retry==2.9.1"
)

pack() {
  mkdir -p "$WHL/set"
  rm -rf "$WHL"/c[0-9]* "$WHL/set"/flashinfer_python-*
  local platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
    manylinux2014_x86_64 manylinux1_x86_64)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]/#/--platform=}" -d "$WHL/set" "${WHEELS[@]}"
  local tar=/tmp/fiar-carry.tar
  (cd "$WHL/set" && tar -cf "$tar" ./*.whl)
  local size chunk
  size=$(stat -c %s "$tar")
  chunk=$(((size + PARTS - 1) / PARTS))
  [ "$chunk" -le 62000000 ] || { echo "pack: $size bytes do not fit $PARTS parts of 62 MB; raise PARTS" >&2; exit 1; }
  split -b "$chunk" -d -a 1 "$tar" /tmp/fiar-carry.part.
  for i in $(seq 1 "$PARTS"); do
    mkdir -p "$WHL/c$i"
    mv "/tmp/fiar-carry.part.$((i - 1))" "$WHL/c$i/"
  done
  sha256sum "$tar" | cut -d' ' -f1 >"$WHL/c$PARTS/sha256"
  echo "$PARTS" >"$WHL/c$PARTS/parts"
  rm -f "$tar"
  du -b "$WHL"/c[0-9]*
}

stash() {
  mkdir -p "$STASH"
  cp "$WHL"/c[0-9]*/* "$STASH/"
  ls -l "$STASH"
}

install() {
  stash
  local parts
  parts=$(cat "$STASH/parts")
  for i in $(seq 0 $((parts - 1))); do
    [ -s "$STASH/fiar-carry.part.$i" ] || { echo "install: piece $i missing (machine given back between calls?)" >&2; exit 1; }
  done
  cat "$STASH"/fiar-carry.part.* >/tmp/fiar-carry.tar
  echo "$(cat "$STASH/sha256")  /tmp/fiar-carry.tar" | sha256sum -c -
  rm -rf /tmp/fiar-wheels && mkdir -p /tmp/fiar-wheels
  tar -xf /tmp/fiar-carry.tar -C /tmp/fiar-wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    /tmp/fiar-wheels/*.whl
  # PYTHONPATH skips .pth files; CUTLASS DSL's adds its dsl_packages folder (where `cutlass` lives).
  # The paths a site dir would add, with $SITE first so that its packages win over the image's.
  local added
  added=$(env -u PYTHONPATH python3 -c "import site, sys; b = list(sys.path); site.addsitedir('$SITE'); print(':'.join(['$SITE'] + [p for p in sys.path if p not in b and p != '$SITE']))")
  echo "export PYTHONPATH=$added" >"$SITE.env"
  cat "$SITE.env"
  ls /tmp/fiar-wheels
}

case "${1:-}" in
  pack) pack ;;
  stash) stash ;;
  install) install ;;
  *) echo "usage: $0 pack|stash|install" >&2; exit 2 ;;
esac
