#!/usr/bin/env bash
# Real-GPU verification of the node agent, from the repository root of a GPU host.
#
#   OUT=/some/dir bench/agent_gpu_verify.sh [--shared-gpu]
#
# Steps, each under a hard `timeout` on top of the agent's own process-group kill:
#   1. fiar-agent inventory              -> inventory.json (the host in the fixture format)
#   2. probe on an empty JIT cache       -> probe-cold.json (kernel build timed apart from the test;
#      KEEP_JIT=1 keeps the cache in $FLASHINFER_WORKSPACE_BASE instead)
#   3. fiar-agent prebuild               -> prebuild.json (on the now warm cache: nothing to build)
#   4. probe with --require-prebuilt and the NCCL benchmark -> probe-warm.json
#   4s. with --shared-gpu (test hosts only; run it whenever node_agent/smoke/ changes): the two-rank
#      trtllm smoke test with both ranks on the first GPU, a gloo group, on the kernels of step 3
#      -> probe-shared.json ("shared GPU: correctness only, no timing"; it writes no label)
#   5. fiar-agent run against an unreachable API server (it backs off and keeps the verdict
#      pending): the resident process's RSS and whether torch/FlashInfer are mapped in it,
#      then SIGTERM and its exit code -> rss.txt (its log: daemon.log)
# Everything else goes to run.log and env.txt.
#
# NVLink multicast stays forbidden in every process of this script: the host policy the agent
# must detect (multicast disabled, mnnvl skipped, trtllm tested with multicast off).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -u
SHARED_GPU=0
case "${1:-}" in
  --shared-gpu) SHARED_GPU=1 ;;
  "") ;;
  *) echo "usage: $0 [--shared-gpu]" >&2; exit 2 ;;
esac

OUT=${OUT:-$PWD/.out}
BUDGET=${BUDGET:-560}          # seconds for the whole script
PY=${PY:-python3}
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - START))); }
log() { echo "[$(($(date +%s) - START))s] $*" | tee -a "$OUT/run.log"; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
if command -v nvcc >/dev/null; then export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}; fi

{
  nvidia-smi -L; nvidia-smi topo -m
  "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  command -v nvcc && nvcc --version | tail -2
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS|CUDA_HOME)='
  TIMEFORMAT='import flashinfer.comm: %Rs'
  time "$PY" -c "import flashinfer, flashinfer.comm; print('flashinfer', flashinfer.__version__)"
} >"$OUT/env.txt" 2>&1
log "env: $(tr '\n' ' ' <"$OUT/env.txt" | cut -c1-400)"

log "1. inventory"
timeout -k 10 120 "$PY" -m node_agent inventory --output "$OUT/inventory.json" 2>>"$OUT/run.log"
log "inventory rc=$?"

export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fiar-jit}
# KEEP_JIT=1: keep a cache that an earlier `fiar-agent prebuild` filled (one longer than a call's limit)
[ "${KEEP_JIT:-0}" = 1 ] || rm -rf "$FLASHINFER_WORKSPACE_BASE"
T=$(($(left) - 200)); [ "$T" -gt 420 ] && T=420
log "2. cold probe (empty JIT cache, smoke-test timeout ${T}s)"
timeout -k 10 $((T + 60)) "$PY" -m node_agent probe --json --no-benchmark --timeout "$T" \
  >"$OUT/probe-cold.json" 2>>"$OUT/run.log"
log "cold probe rc=$?"

T=$(($(left) - 150)); [ "$T" -gt 420 ] && T=420
T=${PREBUILD_TIMEOUT:-$T}      # a release whose cold build is longer: give it what it needs
log "3. prebuild (warm where step 2 built the kernels; a one-GPU host builds them here, cold; timeout ${T}s)"
timeout -k 10 "$T" "$PY" -m node_agent prebuild >"$OUT/prebuild.json" 2>>"$OUT/run.log"
log "prebuild rc=$?"

T=$(($(left) - 80)); [ "$T" -gt 240 ] && T=240
log "4. warm probe with --require-prebuilt and the benchmark (timeout ${T}s)"
timeout -k 10 $((T + 60)) "$PY" -m node_agent probe --json --require-prebuilt --timeout "$T" \
  >"$OUT/probe-warm.json" 2>>"$OUT/run.log"
log "warm probe rc=$?"

if [ "$SHARED_GPU" = 1 ]; then
  T=$(($(left) - 60)); [ "$T" -gt 240 ] && T=240
  log "4s. shared-GPU probe: two trtllm ranks on the first GPU, gloo, --require-prebuilt (timeout ${T}s)"
  timeout -k 10 $((T + 60)) "$PY" -m node_agent probe --json --shared-gpu --require-prebuilt --timeout "$T" \
    >"$OUT/probe-shared.json" 2>>"$OUT/run.log"
  log "shared-GPU probe rc=$?"
fi

log "5. daemon: resident memory, no torch in the resident process, SIGTERM"
cat >/tmp/unreachable-kubeconfig <<'EOF'
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
EOF
NODE_NAME=gpu-node "$PY" -m node_agent run --kubeconfig /tmp/unreachable-kubeconfig --metrics-addr 127.0.0.1:9400 \
  --no-benchmark --require-prebuilt --timeout 150 --api-backoff-max 5 >"$OUT/daemon.log" 2>&1 &
PID=$!
sleep 3
{ echo "=== resident process $PID, 3s after start (probe running in children)"; grep -E '^(VmRSS|VmHWM|Threads)' "/proc/$PID/status"; } >"$OUT/rss.txt"
for _ in $(seq 1 $(($(left) - 15))); do
  grep -q "verdict (" "$OUT/daemon.log" && break
  sleep 1
done
sleep 3
{
  echo "=== resident process $PID after its first probe"
  grep -E '^(VmRSS|VmHWM|Threads)' "/proc/$PID/status"
  echo "torch/flashinfer/NCCL libraries mapped in the resident process: $(grep -c -E 'libtorch|flashinfer|libnccl' "/proc/$PID/maps")"
  "$PY" -c "
import urllib.request
text = urllib.request.urlopen('http://127.0.0.1:9400/metrics', timeout=5).read().decode()
print('\n'.join(l for l in text.splitlines() if l.startswith(('process_resident_memory_bytes', 'fiar_agent_'))))
print('healthz:', urllib.request.urlopen('http://127.0.0.1:9400/healthz', timeout=5).read().decode().strip())
"
} >>"$OUT/rss.txt" 2>&1
kill -TERM "$PID"
timeout 30 tail --pid="$PID" -f /dev/null
wait "$PID"
echo "=== daemon exit code after SIGTERM: $?" >>"$OUT/rss.txt"
log "daemon done; total $(($(date +%s) - START))s"
