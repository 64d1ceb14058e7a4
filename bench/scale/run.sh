#!/usr/bin/env bash
# Scale-out benchmark: runner's API servers and workers on one PostgreSQL. Prints Markdown tables.
#
#   bash bench/scale/run.sh                       # everything
#   bash bench/scale/run.sh --only latency        # one part: latency, throughput, failover
#   WORKERS=1,2,4 CLIENTS=32 SECONDS_EACH=10 SAMPLES=200 bash bench/scale/run.sh
#   RUNNER_BIN=path/to/runner LOAD_BIN=path/to/load bash bench/scale/run.sh   # no build
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
DATA="$WORK/data"
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
if [[ -z "${PG_BIN:-}" ]]; then
    if command -v pg_config >/dev/null && [[ -x "$(pg_config --bindir)/initdb" ]]; then
        PG_BIN="$(pg_config --bindir)"
    else
        PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    fi
fi
for tool in initdb pg_ctl postgres psql; do
    [[ -x "$PG_BIN/$tool" ]] || die "PostgreSQL's $tool not found in '${PG_BIN}': install PostgreSQL (Debian: apt-get install postgresql) or set PG_BIN"
done

# initdb and the server refuse to run as root: as root, they run as `postgres`.
as_pg() {
    if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

mkdir -p "$WORK"
rm -rf "$DATA"
mkdir -m 700 "$DATA"
if [[ "$(id -u)" == 0 ]]; then chown postgres:postgres "$DATA"; fi
as_pg test -w "$DATA" || die "the postgres user cannot write $DATA (is a parent folder closed to it?)"

PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log "initdb into $DATA, port $PORT"
as_pg "$PG_BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C --no-instructions >"$WORK/initdb.log"
PRELOAD=""
if [[ -f "$("$PG_BIN/pg_config" --pkglibdir 2>/dev/null)/pg_stat_statements.so" ]]; then
    PRELOAD="pg_stat_statements"
fi
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

stop_pg() {
    as_pg "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
}
trap stop_pg EXIT
trap 'exit 130' INT TERM
: >"$WORK/postgres.log"
if [[ "$(id -u)" == 0 ]]; then chown postgres "$WORK/postgres.log"; fi
as_pg "$PG_BIN/pg_ctl" -D "$DATA" -l "$WORK/postgres.log" -w start >/dev/null \
    || die "PostgreSQL did not start: see $WORK/postgres.log"

# 3. Measure and report (not exec: the trap stops the server afterwards).
python3 "$HERE/harness.py" --runner "$BIN" --load "$LOAD_BIN" --port "$PORT" --psql "$PG_BIN/psql" \
    --out "$WORK" --workers "${WORKERS:-1,2,4}" --clients "${CLIENTS:-32}" \
    --seconds "${SECONDS_EACH:-10}" --samples "${SAMPLES:-200}" "$@"
