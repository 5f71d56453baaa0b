#!/usr/bin/env bash
# The GPU run, repeatable by anyone with an H200 and the vLLM 0.26 kit (../shared/gpu/README.md).
#
# On a machine with PyPI, once:   cp -r ../shared/gpu .gpu && bash .gpu/build_kit.sh
#                                 mkdir -p .gpu/tok && cp <SmolLM2 folder>/tokenizer*.json .gpu/tok/
# On the GPU machine, repo root:  bash .gpu/device.sh recv .xfer/c00; bash .gpu/device.sh recv .xfer/c01
#                                 bash inferscale_core/bench/gpu_run.sh
# It installs the kit into /tmp/site (once), checks exactness on a tiny random Llama in bf16
# (CUDA graphs on), then runs the 8B-shaped suite (inferscale_core/bench/gpu_suite.py).
# Results: $OUT/exactness.json, $OUT/gpu_suite.json and the logs.
set -u
KIT=${KIT:-.gpu}
OUT=${OUT:-/tmp/out}
export OUT
mkdir -p "$OUT"
if [ ! -e /tmp/kitstate/install.ok ]; then
    bash "$KIT/device.sh" _run install > "$OUT/install.log" 2>&1 \
        || { tail -30 "$OUT/install.log"; exit 1; }
    mkdir -p /tmp/kitstate && touch /tmp/kitstate/install.ok
fi
export PYTHONPATH="/tmp/site:$(pwd)" PYTHONUNBUFFERED=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
if [ "${SKIP_EXACT:-0}" != 1 ]; then
    timeout "${EXACT_TIMEOUT:-240}" python3 tests/tiny_llama_check.py /tmp/tiny-exact "$KIT/tok" \
        bfloat16 > "$OUT/exactness.json" 2> "$OUT/exactness.log"
    echo "exactness rc=$?"; tail -1 "$OUT/exactness.json"; grep -i "error" "$OUT/exactness.log" | tail -5
fi
timeout "${SUITE_TIMEOUT:-420}" python3 -m inferscale_core.bench.gpu_suite "$OUT" > "$OUT/suite.log" 2>&1
echo "suite rc=$?"
grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/suite.log" | tail -40
