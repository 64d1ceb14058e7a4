#!/usr/bin/env bash
# Engine benchmark: runner vs LangGraph (Python) on the same graphs. Prints Markdown tables.
#
#   bash bench/engine/run.sh                 # everything, 3 runs per configuration
#   REPS=5 bash bench/engine/run.sh          # more runs (the median is reported)
#   bash bench/engine/run.sh --only 1,2,3    # some rows only (numbers as in the table)
#   bash bench/engine/run.sh --skip-langgraph
#   RUNNER_BIN=path/to/runner bash bench/engine/run.sh   # measure that binary (no build)
#
# What it does: makes a venv in bench/.venv and installs the pinned LangGraph packages of
# bench/engine/requirements.txt from PyPI; regenerates workflows/chain.yaml with gen_chain.py;
# builds runner (cargo build --release, into $CARGO_TARGET_DIR if set) and validates
# bench/engine/workflows/; then
# bench/engine/harness.py runs every case for both systems. Raw samples go to
# target/bench-engine/results.json, databases to target/bench-engine/ (same disk as the
# project, so fsyncs are real).
#
# If the runner binary has no `run` verb yet, the runner side is skipped (with a message) and the
# LangGraph side is still measured and reported.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$ROOT/bench/.venv"
REPS="${REPS:-3}"
cd "$ROOT"

log() { printf '%s\n' "$*" >&2; }

# 1. LangGraph in its own venv.
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
fi
log "installing $(grep -v '^#' "$HERE/requirements.txt" | xargs) into bench/.venv"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$HERE/requirements.txt"

# 2. The generated 1,000-node chain (deterministic; committed too).
python3 "$HERE/gen_chain.py" 1000 "$HERE/workflows/chain.yaml"

# 3. runner, release build. A build failure does not stop the LangGraph side.
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="${RUNNER_BIN:-$TARGET_DIR/release/runner}"
args=(--reps "$REPS" --runner "$BIN" --python "$VENV/bin/python"
      --json "$ROOT/target/bench-engine/results.json")
mkdir -p "$ROOT/target/bench-engine"
# The numbers in the README were measured on a binary with packed relative relocations.
if [[ -n "${RUNNER_BIN:-}" ]] || { log "cargo build --release"; RUNNER_PACKED_RELOCS="${RUNNER_PACKED_RELOCS:-1}" cargo build --release --quiet; }; then
    if ! "$BIN" validate "$HERE/workflows/" >&2; then
        log "bench/engine/workflows/ do not validate"
        exit 1
    fi
else
    log "cargo build --release failed"
    args+=(--skip-runner "runner side skipped: cargo build --release failed")
fi

# 4. Measure and report.
exec "$VENV/bin/python" "$HERE/harness.py" "${args[@]}" "$@"
