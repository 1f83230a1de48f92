# syntax=docker/dockerfile:1.7
# Images for fiar: one target per component, each for linux/amd64 and linux/arm64 (Grace: GB200, GH200).
#   docker buildx build --platform linux/amd64,linux/arm64 --target operator  -t fiar-operator .
#   docker buildx build --platform linux/amd64,linux/arm64 --target agent     -t fiar-agent .
#   docker buildx build --platform linux/amd64,linux/arm64 --target agent-sim -t fiar-agent-sim .
# agent-sim has no CUDA (simulated hosts, for tests and demos). agent has no nvidia/cuda base either:
# the same Debian-like base, CUDA's compiler and libraries from wheels, and FlashInfer's comm kernels
# prebuilt for sm_90a and sm_100a (build arg PREBUILD_ARCH; "" prebuilds none and each node compiles
# its own at its first probe). tools/devcluster/images.py builds these targets without Docker
# (`python -m devcluster build --images`, `--agent-image`), keying each on the stages it uses.
# Behind a TLS-intercepting proxy, hand pip the host's CA bundle as a build secret (never stored in
# a layer): --secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt
ARG PYTHON_VERSION=3.12
# Base of every image: any Debian-like image with python3 and venv on PATH.
# The default is the public image; tools/devcluster/images.py points it at a locally made one.
ARG PYTHON_BASE=python:${PYTHON_VERSION}-slim

# ---------------------------------------------------------------------------------------------
# operator: slim, non-root, nothing but the virtualenv
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS operator-build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md fiar_contract.py ./
COPY fiar_kube ./fiar_kube
COPY operator ./operator
COPY node_agent ./node_agent
COPY kubectl_fiar ./kubectl_fiar
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && python3 -m venv /opt/fiar \
 && /opt/fiar/bin/pip install --no-compile .

FROM ${PYTHON_BASE} AS operator
LABEL org.opencontainers.image.title="fiar-operator" \
      org.opencontainers.image.description="FiAllreducePolicy operator and admission webhooks"
COPY --from=operator-build /opt/fiar /opt/fiar
ENV PATH=/opt/fiar/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
EXPOSE 9443 8080
ENTRYPOINT ["fiar-operator"]
CMD ["run"]

# ---------------------------------------------------------------------------------------------
# agent-sim: the node agent without CUDA, torch or FlashInfer. It can only probe a simulated host
# (`fiar-agent run --simulate FIXTURE`, chart value agent.simulate): for test clusters and demos.
# Same entry point as the agent image (tini as PID 1), so the chart runs it unchanged.
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS agent-sim
LABEL org.opencontainers.image.title="fiar-agent-sim" \
      org.opencontainers.image.description="fiar node agent on simulated hosts only (no CUDA)"
# /opt/fiar-kernels, the seed of the agent's kernel cache, is empty: a simulated host compiles none.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /opt/fiar-kernels
COPY --from=operator-build /opt/fiar /opt/fiar
ENV PATH=/opt/fiar/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
EXPOSE 9400
ENTRYPOINT ["tini", "--", "fiar-agent"]
CMD ["run"]

# ---------------------------------------------------------------------------------------------
# agent: the node agent on real GPUs. No nvidia/cuda base: the same Debian-like base, and CUDA
# (compiler, runtime, libraries) from wheels, as torch and FlashInfer are (pyproject's `gpu` and
# `jit` extras: the one place that names the agent's Python environment). The host's driver
# (libcuda, libnvidia-ml) comes from the NVIDIA container toolkit at run time.
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_BASE} AS agent-base
# g++: nvcc's host compiler, for a kernel that is compiled on the node (an architecture not
# prebuilt below); tini as PID 1 reaps whatever a killed smoke test leaves behind.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini g++ \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /opt/fiar-kernels
ENV PATH=/opt/fiar/bin:/opt/cuda/bin:$PATH CUDA_HOME=/opt/cuda \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    FLASHINFER_WORKSPACE_BASE=/opt/fiar-kernels FLASHINFER_CUDA_ARCH_LIST="9.0a 10.0a"

FROM agent-base AS agent-build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md fiar_contract.py ./
COPY fiar_kube ./fiar_kube
COPY operator ./operator
COPY node_agent ./node_agent
COPY kubectl_fiar ./kubectl_fiar
# FlashInfer comes pinned by pyproject's `gpu` extra: the version the agent has run on a GPU
# (BENCHMARKS.md, Node agent) and the one vLLM 0.33.0 pins, so the agent verifies the kernels the
# fleet's pods load. A fleet on another vLLM release changes that pin to its release's
# flashinfer-python and runs bench/agent_gpu_verify.sh on a GPU before shipping the image.
# torch from PyPI brings CUDA's libraries as wheels (cuda-toolkit); the `jit` extra adds nvcc of
# the same cuda-toolkit release. /opt/cuda is the CUDA_HOME nvcc and FlashInfer read.
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && python3 -m venv /opt/fiar \
 && /opt/fiar/bin/pip install --no-compile ".[gpu,jit]" \
 && ln -s "$(echo /opt/fiar/lib/python3*/site-packages/nvidia/cu13)" /opt/cuda \
 && if [ ! -e /opt/cuda/lib64 ]; then ln -s lib /opt/cuda/lib64; fi \
 && nvcc --version
# Compile the trtllm and mnnvl comm modules now, for Hopper and Blackwell, so that a node never
# JIT-compiles on its critical path (no GPU is needed to compile). PREBUILD_ARCH="" builds none:
# each node then compiles its own architecture's modules at its first probe, into the chart's
# kernel cache (/var/cache/fiar), and loads them from there afterwards.
ARG PREBUILD_ARCH="9.0a 10.0a"
RUN if [ -n "${PREBUILD_ARCH}" ]; then fiar-agent prebuild --arch "${PREBUILD_ARCH}"; fi

FROM agent-base AS agent
LABEL org.opencontainers.image.title="fiar-agent" \
      org.opencontainers.image.description="fiar node agent: NVLink multicast probe and FlashInfer allreduce smoke tests"
COPY --from=agent-build /opt/fiar /opt/fiar
COPY --from=agent-build /opt/fiar-kernels /opt/fiar-kernels
RUN ln -s "$(echo /opt/fiar/lib/python3*/site-packages/nvidia/cu13)" /opt/cuda
# The chart mounts a writable kernel cache at /var/cache/fiar; `fiar-agent run --kernel-cache`
# seeds a subfolder keyed by the kernels below (an upgraded image gets a fresh one).
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
EXPOSE 9400
ENTRYPOINT ["tini", "--", "fiar-agent"]
CMD ["run"]
