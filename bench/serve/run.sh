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
# (langgraph-cli[inmem] for `langgraph dev`, and the langgraph-sdk the tests pin) and, with node,
# the JS SDK the tests pin into target/bench-serve/js; builds
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
    # Linked as the container image links it (packed relocations, glibc 2.36+), as the engine
    # benchmark does; RUNNER_PACKED_RELOCS=0 measures the portable build.
    log "cargo build --release"
    RUNNER_PACKED_RELOCS="${RUNNER_PACKED_RELOCS:-1}" cargo build --release --quiet --bin runner
    RUNNER="${CARGO_TARGET_DIR:-$ROOT/target}/release/runner"
fi
"$RUNNER" validate "$HERE/graphs/" >&2

# LangGraph's JS client, the version the tests pin (tests/sdk/js/package-lock.json), installed
# beside a copy of throughput.mjs; skipped without node and npm.
JS=()
if command -v node >/dev/null && command -v npm >/dev/null; then
    JSDIR="$ROOT/target/bench-serve/js"
    mkdir -p "$JSDIR"
    cp "$ROOT/tests/sdk/js/package.json" "$ROOT/tests/sdk/js/package-lock.json" "$HERE/throughput.mjs" "$JSDIR/"
    log "npm ci in target/bench-serve/js (@langchain/langgraph-sdk)"
    (cd "$JSDIR" && npm ci --silent --no-audit --no-fund >&2)
    JS=(--js "$JSDIR/throughput.mjs")
else
    log "node or npm not found: no runs/s through the JS SDK"
fi

exec "$VENV/bin/python" "$HERE/harness.py" --runner "$RUNNER" --python "$VENV/bin/python" \
    --out "$ROOT/target/bench-serve" --samples "${SAMPLES:-20}" --seconds "${SECONDS_EACH:-5}" "${JS[@]}" "$@"
