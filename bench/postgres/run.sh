#!/usr/bin/env bash
# PostgreSQL checkpoint benchmark: runner's PostgreSQL checkpointer vs LangGraph's PostgresSaver and
# AsyncPostgresSaver on the same graphs and the same server. Prints Markdown tables.
#
#   bash bench/postgres/run.sh                    # everything, 3 runs per configuration
#   REPS=5 bash bench/postgres/run.sh             # more runs (the median is reported)
#   bash bench/postgres/run.sh --cases loop       # one graph only (loop, chain)
#   bash bench/postgres/run.sh --skip-langgraph
#   RUNNER_BIN=path/to/runner bash bench/postgres/run.sh   # measure that binary (no build)
#   PG_BIN=/usr/lib/postgresql/15/bin bash bench/postgres/run.sh   # that PostgreSQL
#
# What it does: makes the venv bench/.venv and installs bench/postgres/requirements.txt (LangGraph,
# langgraph-checkpoint-postgres, psycopg) from PyPI; builds runner (cargo build --release); starts
# a throwaway PostgreSQL of its own: initdb into target/bench-postgres/data (as the `postgres`
# user when run as root, since initdb refuses root), on 127.0.0.1 and a free port, fsync on,
# synchronous_commit on (the server's default), autovacuum off (so no background writes land in
# the WAL measured around a run), checkpoints only when the harness asks (before each run), and
# pg_stat_statements loaded but off except in the statement-counting pass. The server is stopped
# when the script ends, however it ends. Then bench/postgres/harness.py measures (see its doc).
# Raw samples go to target/bench-postgres/results.json, the server's log to
# target/bench-postgres/postgres.log.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$ROOT/bench/.venv"
REPS="${REPS:-3}"
WORK="$ROOT/target/bench-postgres"
cd "$ROOT"

log() { printf '%s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# 1. LangGraph in its own venv.
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
fi
log "installing bench/postgres/requirements.txt into bench/.venv"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$HERE/requirements.txt"

# 2. runner, release build (packed relocations, as the engine benchmark's numbers).
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="$(realpath -m "${RUNNER_BIN:-$TARGET_DIR/release/runner}")"
if [[ -z "${RUNNER_BIN:-}" ]]; then
    log "cargo build --release"
    RUNNER_PACKED_RELOCS="${RUNNER_PACKED_RELOCS:-1}" cargo build --release --quiet
fi
[[ -x "$BIN" ]] || die "$BIN not found"

# 3. A throwaway PostgreSQL on loopback.
source "$ROOT/bench/lib/postgres.sh"
pg_find_bin initdb pg_ctl postgres pgbench
pg_init "$WORK"
cat >>"$DATA/postgresql.conf" <<EOF

# bench/postgres/run.sh
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = ''
fsync = on
synchronous_commit = on
full_page_writes = on
autovacuum = off
max_wal_size = '16GB'
checkpoint_timeout = '1h'
shared_preload_libraries = '$PRELOAD'
EOF
if [[ -n "$PRELOAD" ]]; then echo "pg_stat_statements.track = 'none'" >>"$DATA/postgresql.conf"; fi

pg_start "$WORK"

# 4. Measure and report (not exec: the trap stops the server afterwards).
"$VENV/bin/python" "$HERE/harness.py" --reps "$REPS" --runner "$BIN" --port "$PORT" \
    --pgbench "$PG_BIN/pgbench" --postgres "$PG_BIN/postgres" \
    --json "$WORK/results.json" "$@"
