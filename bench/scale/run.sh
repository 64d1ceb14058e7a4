#!/usr/bin/env bash
# Scale-out benchmark: runner's API servers and workers on one PostgreSQL. Prints Markdown tables.
#
#   bash bench/scale/run.sh                       # everything
#   bash bench/scale/run.sh --only latency        # one part: latency, throughput, failover
#   bash bench/scale/run.sh --only latency --rtt-ms 1   # PostgreSQL 1 ms of round trip away (a relay)
#   WORKERS=1,2,4 CLIENTS=32 SECONDS_EACH=10 SAMPLES=200 bash bench/scale/run.sh
#   RUNNER_BIN=path/to/runner LOAD_BIN=path/to/load bash bench/scale/run.sh   # no build
#   PG_LOG_STATEMENTS=1 bash bench/scale/run.sh --only latency   # every statement logged, with
#                       # its process and time, to target/bench-scale/postgres.log (a profile)
#   PG_BIN=/usr/lib/postgresql/15/bin bash bench/scale/run.sh
#
# What it does: builds runner (cargo build --release) and the load generator (bench/scale/load/, a
# package of its own on runner's tokio and reqwest: a native client, not what runs out of CPU
# first, as the Python SDK does on 2 cores); starts a throwaway
# PostgreSQL of its own as bench/postgres/run.sh does (initdb into target/bench-scale/data, as the
# `postgres` user when run as root; 127.0.0.1 on a free port; fsync and synchronous_commit on, the
# server's defaults; pg_stat_statements loaded when the server has it), stopped when the script
# ends, however it ends. Then bench/scale/harness.py starts `runner serve --workers 0` and
# `runner worker` processes on it (bench/scale/graphs/ on the scripted mock, bench/scale/mock.yaml)
# and measures: enqueue to first event on another process, runs/s with 1, 2 and 4 workers and
# where the time goes, and the time from a worker's kill -9 to its runs resuming elsewhere.
# Raw results go to target/bench-scale/results.json, the processes' logs beside it.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="$ROOT/target/bench-scale"
cd "$ROOT"

log() { printf '%s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# 1. runner and the load generator, release builds.
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="$(realpath -m "${RUNNER_BIN:-$TARGET_DIR/release/runner}")"
if [[ -z "${RUNNER_BIN:-}" ]]; then
    log "cargo build --release"
    RUNNER_PACKED_RELOCS="${RUNNER_PACKED_RELOCS:-1}" cargo build --release --quiet --bin runner
fi
[[ -x "$BIN" ]] || die "$BIN not found"
if [[ -z "${LOAD_BIN:-}" ]]; then
    log "cargo build --release --manifest-path bench/scale/load/Cargo.toml"
    cargo build --release --quiet --manifest-path "$HERE/load/Cargo.toml" --target-dir "$TARGET_DIR"
    LOAD_BIN="$TARGET_DIR/release/runner-scale-load"
fi
[[ -x "$LOAD_BIN" ]] || die "the load generator was not built"
"$BIN" validate "$HERE/graphs/" >&2

# 2. A throwaway PostgreSQL on loopback.
source "$ROOT/bench/lib/postgres.sh"
pg_find_bin initdb pg_ctl postgres psql
pg_init "$WORK"
cat >>"$DATA/postgresql.conf" <<CONF

# bench/scale/run.sh
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = ''
fsync = on
synchronous_commit = on
max_connections = 300
shared_preload_libraries = '$PRELOAD'
CONF

if [[ -n "${PG_LOG_STATEMENTS:-}" ]]; then
    cat >>"$DATA/postgresql.conf" <<CONF
log_min_duration_statement = 0
log_line_prefix = '%m [%p] %a '
CONF
fi

pg_start "$WORK"

# 3. Measure and report (not exec: the trap stops the server afterwards).
python3 "$HERE/harness.py" --runner "$BIN" --load "$LOAD_BIN" --port "$PORT" --psql "$PG_BIN/psql" \
    --out "$WORK" --workers "${WORKERS:-1,2,4}" --clients "${CLIENTS:-32}" \
    --seconds "${SECONDS_EACH:-10}" --samples "${SAMPLES:-200}" "$@"
