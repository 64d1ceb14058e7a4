#!/usr/bin/env bash
# Regenerates scripts/symbol-order.txt, the order build.rs gives the release linker: the
# functions `runner` executes while it serves (bench/serve's graphs through the Python SDK, every
# stream mode, state, history, store, 20 concurrent streams), while `runner test` runs the
# shipped workflows' tests and while `runner validate` checks them, each function once, in the
# order first seen. Laid out together, a served run maps a fraction of `.text`.
#
#   bash scripts/symbol-order.sh             # builds the release binary, profiles it
#   RUNNER=target/release/runner bash scripts/symbol-order.sh
#
# Needs valgrind (callgrind records every function executed, where sampling would miss code
# that runs once) and python3; langgraph-sdk is installed into bench/.venv from
# bench/serve/requirements.txt. Rerun it after a dependency or toolchain update (symbol names
# carry a hash of their crate's build) or when a new code path becomes common: names the
# binary no longer has are skipped by the linker, so a stale file costs memory, never a build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/bench/.venv"
cd "$ROOT"
command -v valgrind >/dev/null || { echo "valgrind is needed" >&2; exit 2; }

if [[ ! -x "$VENV/bin/python" ]]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r bench/serve/requirements.txt

if [[ -z "${RUNNER:-}" ]]; then
    cargo build --release --quiet --bin runner
    RUNNER="${CARGO_TARGET_DIR:-$ROOT/target}/release/runner"
fi
RUNNER="$(realpath "$RUNNER")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
CG=(valgrind --quiet --tool=callgrind --demangle=no --compress-strings=no --compress-pos=no)

"$VENV/bin/python" scripts/symbol_order.py serve "$RUNNER" "$WORK/serve.cg" "${CG[@]}"
# The workflow tests write nothing outside their in-memory checkpointers.
"${CG[@]}" --callgrind-out-file="$WORK/test.cg" "$RUNNER" test workflows/ >/dev/null
"${CG[@]}" --callgrind-out-file="$WORK/validate.cg" "$RUNNER" validate workflows/ >/dev/null
"$VENV/bin/python" scripts/symbol_order.py order "$RUNNER" \
    "$WORK/serve.cg" "$WORK/test.cg" "$WORK/validate.cg" > scripts/symbol-order.txt
echo "scripts/symbol-order.txt: $(wc -l < scripts/symbol-order.txt) functions" >&2
