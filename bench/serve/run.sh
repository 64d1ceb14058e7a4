#!/usr/bin/env bash
# Serve benchmark: `runner serve` vs the reference server (`langgraph dev`) on the same graph,
# through the same client. Prints Markdown tables.
#
#   bash bench/serve/run.sh                    # the benchmark: both servers
#   bash bench/serve/run.sh --skip-langgraph   # runner only (its numbers as JSON)
#   bash bench/serve/run.sh --load             # the load test: 200 streams, then kill -9 under load
#   SAMPLES=50 SECONDS_EACH=10 bash bench/serve/run.sh
#
# What it does: makes a venv in bench/.venv and installs bench/serve/requirements.txt from PyPI
# (langgraph-cli[inmem] for `langgraph dev`, and the langgraph-sdk the tests pin); builds
# runner (cargo build --release) and validates bench/serve/graphs/; then bench/serve/harness.py
# starts each server on 127.0.0.1 (runner on the scripted mock, bench/serve/mock.yaml; LangGraph
# on bench/serve/reference/) and measures them one after the other. Raw samples go to
# target/bench-serve/ (results.json, load.json), with the servers' logs and databases.
# RUNNER=path/to/runner skips the build and measures that binary.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$ROOT/bench/.venv"
cd "$ROOT"

log() { printf '%s\n' "$*" >&2; }

if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
fi
log "installing $(grep -v '^#' "$HERE/requirements.txt" | xargs) into bench/.venv"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$HERE/requirements.txt"

if [[ -z "${RUNNER:-}" ]]; then
    log "cargo build --release"
    cargo build --release --quiet --bin runner
    RUNNER="${CARGO_TARGET_DIR:-$ROOT/target}/release/runner"
fi
"$RUNNER" validate "$HERE/graphs/" >&2

exec "$VENV/bin/python" "$HERE/harness.py" --runner "$RUNNER" --python "$VENV/bin/python" \
    --out "$ROOT/target/bench-serve" --samples "${SAMPLES:-20}" --seconds "${SECONDS_EACH:-5}" "$@"
