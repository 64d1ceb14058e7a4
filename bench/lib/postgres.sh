# A throwaway PostgreSQL on loopback, for the benchmarks' run.sh scripts (sourced, not run).
# The caller defines `log` and `die`, then:
#
#   pg_find_bin initdb pg_ctl postgres ...   # sets PG_BIN (PG_BIN from the environment wins)
#   pg_init "$WORK"                          # initdb into $WORK/data; sets DATA, PORT, PRELOAD
#   cat >>"$DATA/postgresql.conf" <<CONF ... # its own settings (listen_addresses, port, ...)
#   pg_start "$WORK"                         # starts it, logging to $WORK/postgres.log;
#                                            # stopped when the script ends, however it ends
#
# initdb and the server refuse to run as root: as root, they run as the `postgres` user.

as_pg() {
    if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_find_bin() {
    if [[ -z "${PG_BIN:-}" ]]; then
        if command -v pg_config >/dev/null && [[ -x "$(pg_config --bindir)/initdb" ]]; then
            PG_BIN="$(pg_config --bindir)"
        else
            PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
        fi
    fi
    local tool
    for tool in "$@"; do
        [[ -x "$PG_BIN/$tool" ]] || die "PostgreSQL's $tool not found in '${PG_BIN}': install PostgreSQL (Debian: apt-get install postgresql) or set PG_BIN"
    done
}

pg_init() {
    local work="$1"
    DATA="$work/data"
    mkdir -p "$work"
    rm -rf "$DATA"
    mkdir -m 700 "$DATA"
    if [[ "$(id -u)" == 0 ]]; then chown postgres:postgres "$DATA"; fi
    as_pg test -w "$DATA" || die "the postgres user cannot write $DATA (is a parent folder closed to it?)"
    PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    log "initdb into $DATA, port $PORT"
    as_pg "$PG_BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C --no-instructions >"$work/initdb.log"
    PRELOAD=""
    if [[ -f "$("$PG_BIN/pg_config" --pkglibdir 2>/dev/null)/pg_stat_statements.so" ]]; then
        PRELOAD="pg_stat_statements"
    fi
}

stop_pg() {
    as_pg "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
}

pg_start() {
    local work="$1"
    trap stop_pg EXIT
    trap 'exit 130' INT TERM
    : >"$work/postgres.log"
    if [[ "$(id -u)" == 0 ]]; then chown postgres "$work/postgres.log"; fi
    as_pg "$PG_BIN/pg_ctl" -D "$DATA" -l "$work/postgres.log" -w start >/dev/null \
        || die "PostgreSQL did not start: see $work/postgres.log"
}
