#!/usr/bin/env bash
# The checks that need a real GPU, in one run that fits a short lease on a GPU machine:
#
#   tools/gpu_check.sh OUT [PACKAGE]
#
# OUT receives one log per check, the JSON reports, and summary.txt (one line per check: its exit status and
# seconds).  PACKAGE is a GenAI package for the parity, profile and graph-probe checks (the README asks for a
# larger one, hidden 2048 or more, for the profile); without it only the facts, the GPU tests and the launch
# chain run.  Run from the repository root; nothing is installed (PYTHONPATH is the checkout).
#
# 1. facts:     the GPU, the driver and the Python packages that matter;
# 2. gpu_tests: the CUDA test files with ONNX_NUMBA_REQUIRE_CUDA=1, so a skip is a failure;
# 3. probe:     tools/cuda_graph_probe (eager against captured launches; what in a decode step needs the host);
# 4. parity:    python -m pipeline parity PACKAGE --native all --device cuda (native on the GPU against
#               onnxruntime, token by token);
# 5. profile:   tools/profile_native --ep cuda --backend both --steady (prefill, decode ms/token and tok/s
#               against onnxruntime and onnxruntime-genai when their CUDA builds are installed, launches per
#               step and GB/s against the measured copy bandwidth).
#
# Each check runs under its own time limit (seconds, from the environment: GPU_TESTS_S, PROBE_S, PARITY_S,
# PROFILE_S) so one that hangs cannot take the others' time.  Also from the environment: JOBS, the test workers
# (default 8); TESTS, the test files (default tests/test_cuda_*.py); TOKENS, WARMUPS and RUNS, the profile's
# decode length and runs (default 64, 1 and 3); PROBE_HIDDEN and PROBE_REPS, the launch chain's sizes (default
# 64,2048,8192) and repeats (default 200); PROMPT_IDS, the prompt of the probe, parity and profile (default: profile_native's 8 tokens).
# The exit status is 0 only when every check that ran passed.
set -uo pipefail
if [ $# -lt 1 ]; then
    echo "usage: tools/gpu_check.sh OUT [PACKAGE]" >&2
    exit 2
fi
out=$1
pkg=${2:-}
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ONNX_NUMBA_REQUIRE_CUDA=1
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/onnx_numba_gpu_cache}
if [ -z "${GPU_CHECK_SIMULATOR:-}" ]; then
    unset NUMBA_ENABLE_CUDASIM  # a real GPU or nothing (GPU_CHECK_SIMULATOR=1 keeps the simulator, to try the script)
fi
py=${PYTHON:-python3}
status=0
: >"$out/summary.txt"

check() {  # check NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    printf '== %s (limit %ss): %.240s\n' "$name" "$limit" "$*"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$out/summary.txt"
    tail -n 8 "$out/$name.log"
    [ $rc -eq 0 ] || status=1
}

check facts 60 "$py" -c '
import subprocess, sys
from importlib import metadata
print(sys.version)
try:
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip())
except OSError as e:
    print("nvidia-smi:", e)
for p in ("numba", "numba-cuda", "llvmlite", "numpy", "onnx", "onnxruntime", "onnxruntime-gpu",
          "onnxruntime-genai", "onnxruntime-genai-cuda", "cuda-core", "cuda-bindings"):
    try:
        print(p, metadata.version(p))
    except metadata.PackageNotFoundError:
        print(p, "-")
from runtime import cuda as rc
rc.require_cuda()
print("target:", "simulator" if rc.simulator() else "GPU", getattr(rc.cuda.get_current_device(), "name", ""))
import onnxruntime
print("onnxruntime providers:", onnxruntime.get_available_providers())
'
# shellcheck disable=SC2086
check gpu_tests "${GPU_TESTS_S:-300}" "$py" -m pytest -q -p no:cacheprovider -n "${JOBS:-8}" ${TESTS:-tests/test_cuda_*.py}
probe=("$py" -m tools.cuda_graph_probe --hidden "${PROBE_HIDDEN:-64,2048,8192}" --reps "${PROBE_REPS:-200}" --json "$out/probe.json")
if [ -n "$pkg" ]; then
    probe+=(--model "$pkg" --prompt-ids "${PROMPT_IDS:-4,11,18,25,32,39,46,53}")
fi
check probe "${PROBE_S:-120}" "${probe[@]}"
if [ -n "$pkg" ]; then
    check parity "${PARITY_S:-120}" "$py" -m pipeline parity "$pkg" --native all --device cuda --tokens 16 \
        --prompt-ids "${PROMPT_IDS:-4,11,18,25,32,39,46,53}"
    check profile "${PROFILE_S:-180}" "$py" -m tools.profile_native --model "$pkg" --ep cuda --backend both \
        --steady --prompt-ids "${PROMPT_IDS:-4,11,18,25,32,39,46,53}" --tokens "${TOKENS:-64}" --warmups "${WARMUPS:-1}" --runs "${RUNS:-3}" --json "$out/profile.json"
fi
echo "== summary"
cat "$out/summary.txt"
exit $status
