#!/usr/bin/env bash
# Lint, format check, import-direction contracts and the default (fast, CPU) test run.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-cache
# two test processes (pytest-xdist): most tests run on one core, and the machines this is sized for have two;
# loadscope: a module's tests run in one process, so the vLLM tests share one engine (xdist_group does not group
# them under pytest 9 with xdist 3.8)
.venv/bin/python -m pytest -q -n 2 --dist loadscope "$@"
