#!/usr/bin/env python3
"""PostgreSQL checkpoint benchmark driver: runner vs LangGraph on one server, Markdown tables out.

Started by bench/postgres/run.sh, which makes the venv, builds runner and starts a throwaway
PostgreSQL (fsync on) on 127.0.0.1:--port. Runs in the venv (psycopg reads the server's counters).

The graphs: the engine benchmark's `loop` (a -> b -> c -> a ..., three supersteps per round, the
state two integers: the same checkpoint size at every step) and `chain` (N nodes in a row, each
adding 1 to `total`). runner runs bench/engine/workflows/loop.yaml and chains made by
bench/engine/gen_chain.py; LangGraph runs the same graphs from bench/engine/langgraph_cases.py.
No model anywhere: a step's work is a few additions, so what a step costs beyond the baseline is
the checkpoint.

Per-step checkpoint cost, the same formula on both sides: each graph runs at two sizes (S1 and
S2 supersteps), with the checkpointer and without one (runner `--db :memory:`, LangGraph
`checkpointer=None`), and

    cost/step = [(T_pg(S2) - T_pg(S1)) - (T_none(S2) - T_none(S1))] / (S2 - S1)

with T the median of --reps runs. The difference between sizes removes what a run pays once
(process start, compiling, connecting, creating tables, the thread, its lease, the last wait);
the difference with the baseline removes the engine's own per-step work. What a run pays once
is reported apart ("fixed"). T is LangGraph's graph.invoke() alone (measured in its process) and
runner's whole process (wall time from spawn to exit): either way the two subtractions leave only
what the checkpointer adds per step.

Server-side counts, per step by the same difference of sizes (no baseline needed):
  - transactions: pg_stat_database.xact_commit of the benchmark database (read once every
    backend of the run has exited, so its counters are flushed);
  - statements: pg_stat_statements calls, in a separate untimed pass with tracking on (a
    statement is a round trip unless the client pipelines; psycopg's pipeline mode, which
    LangGraph uses, sends several per round trip; tokio-postgres awaited one by one does not);
  - WAL bytes: pg_current_wal_insert_lsn() around the run (after a CHECKPOINT, so every run
    starts with the same full-page-write state);
  - stored bytes: pg_total_relation_size of every table of the run's schema (heap, TOAST,
    indexes).

The floor: pgbench (PostgreSQL's own C client over libpq, prepared statements, one connection)
running `INSERT INTO floor.t (v) VALUES (<256 bytes>)` in autocommit: one round trip, one
commit, latency average over --floor-tx transactions, with synchronous_commit on (the floor for
power-safe) and off (for crash-safe); also a bare `SELECT 1` (the loopback round trip) and
BEGIN; INSERT; COMMIT (three round trips). A native client, because the floor must not include
an interpreter's per-call overhead, and PostgreSQL's own, so nobody's driver is being measured.
All are measured once per repetition; the INSERT floors (256 bytes and 2 KiB, about what a step
stores) also right before each of runner's runs on the database, with that run's
synchronous_commit, since a flush's cost moves with the disk's other work: the targets are
judged against the median of those.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ENGINE = ROOT / "bench" / "engine"
WORK = ROOT / "target" / "bench-postgres"
DB = "bench"

# Sizes: loop rounds (3 supersteps each) and chain nodes (1 each).
SIZES = {"loop": (34, 334), "chain": (100, 1000)}
STEPS_PER = {"loop": 3, "chain": 1}


@dataclass(frozen=True)
class Cfg:
    side: str  # runner | langgraph
    case: str  # loop | chain
    store: str  # none | pg
    commit: str = "on"  # synchronous_commit: on (power-safe) | off (crash-safe)
    persist: str = "async"  # runner --persist / LangGraph durability=
    mode: str = "sync"  # LangGraph: sync (PostgresSaver, invoke) | async (AsyncPostgresSaver, ainvoke)

    def key(self) -> str:
        return f"{self.side}/{self.case}/{self.store}/{self.commit}/{self.persist}/{self.mode}"

    def baseline(self) -> "Cfg":
        if self.side == "runner":
            return Cfg("runner", self.case, "none")
        return Cfg("langgraph", self.case, "none", mode=self.mode)


@dataclass
class Sample:
    wall_s: float
    cpu_s: float | None = None  # the client process's user + system time (whole process)
    xact: int | None = None
    wal_bytes: int | None = None
    stored_bytes: int | None = None


@dataclass
class Runs:
    samples: dict[int, list[Sample]] = field(default_factory=dict)  # by size
    statements: dict[int, dict[str, dict[str, float]]] = field(default_factory=dict)  # by size
    error: str | None = None

    def med(self, size: int, attr: str) -> float | None:
        vals = [getattr(s, attr) for s in self.samples.get(size, []) if getattr(s, attr) is not None]
        return statistics.median(vals) if vals else None


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the server


class Server:
    def __init__(self, port: int) -> None:
        self.port = port
        self.admin = psycopg.connect(f"host=127.0.0.1 port={port} dbname=postgres user=postgres sslmode=disable",
                                     autocommit=True)
        self.admin.execute(f"DROP DATABASE IF EXISTS {DB}")
        self.admin.execute(f"CREATE DATABASE {DB}")
        self.pgss = bool(self.one("SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_stat_statements'")) \
            and "pg_stat_statements" in self.one("SHOW shared_preload_libraries")
        if self.pgss:
            self.admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.bench = psycopg.connect(self.conninfo(), autocommit=True)
        self.bench.execute("CREATE SCHEMA floor")
        self.bench.execute("CREATE TABLE floor.t (i bigserial PRIMARY KEY, v text NOT NULL)")
        self.bench.close()

    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={DB} user=postgres sslmode=disable"

    def url(self, schema: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DB}?schema={schema}&sslmode=disable"

    def one(self, sql: str, params: tuple = ()) -> Any:
        return self.admin.execute(sql, params).fetchone()[0]

    def version(self) -> str:
        return self.one("SHOW server_version")

    def settle(self) -> None:
        """Waits until no backend is connected to the benchmark database (their counters are
        flushed when they exit)."""
        for _ in range(500):
            if self.one("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (DB,)) == 0:
                return
            time.sleep(0.01)
        raise RuntimeError("backends of the benchmark database did not exit within 5 s")

    def before(self, schema: str) -> dict[str, Any]:
        with psycopg.connect(self.conninfo(), autocommit=True) as c:
            c.execute(f"CREATE SCHEMA {schema}")
        self.settle()
        self.admin.execute("CHECKPOINT")
        self.admin.execute("SELECT pg_stat_clear_snapshot()")
        return {
            "xact": self.one("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (DB,)),
            "lsn": self.one("SELECT pg_current_wal_insert_lsn()::text"),
        }

    def after(self, schema: str, before: dict[str, Any]) -> dict[str, int]:
        self.settle()
        self.admin.execute("SELECT pg_stat_clear_snapshot()")
        out = {
            "xact": self.one("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (DB,)) - before["xact"],
            "wal": int(self.one("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (before["lsn"],))),
        }
        with psycopg.connect(self.conninfo(), autocommit=True) as c:
            out["stored"] = int(c.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'm')",
                (schema,)).fetchone()[0])
            c.execute(f"DROP SCHEMA {schema} CASCADE")
        self.settle()
        return out

    def tracking(self, on: bool) -> None:
        if on:
            self.admin.execute("ALTER SYSTEM SET pg_stat_statements.track = 'top'")
        else:
            self.admin.execute("ALTER SYSTEM RESET pg_stat_statements.track")
        self.admin.execute("SELECT pg_reload_conf()")
        time.sleep(0.3)  # new backends read the reloaded file; no run's backend is alive now

    def statements(self) -> dict[str, dict[str, float]]:
        rows = self.admin.execute(
            "SELECT s.query, sum(s.calls)::bigint, sum(s.total_exec_time) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s GROUP BY s.query", (DB,)).fetchall()
        return {q: {"calls": int(c), "ms": float(t)} for q, c, t in rows}


# ---------------------------------------------------------------- floors


FLOOR_PAYLOAD = "x" * 256
BIG_PAYLOAD = "x" * 2048  # about what a step stores (tables and indexes, both systems)


def pgbench(binary: str, port: int, script: str, tx: int, commit: str) -> float:
    """Latency average in seconds of `script` run `tx` times on one connection."""
    path = WORK / "floor.sql"
    path.write_text(script)
    env = dict(os.environ, PGOPTIONS=f"-c synchronous_commit={commit}")
    p = subprocess.run(
        [binary, "-n", "-M", "prepared", "-c", "1", "-t", str(tx), "-f", str(path),
         "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", DB],
        capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"pgbench failed: {p.stderr.strip()[-400:]}")
    m = re.search(r"latency average = ([0-9.]+) ms", p.stdout)
    if not m:
        raise RuntimeError(f"pgbench printed no latency: {p.stdout[-400:]}")
    return float(m.group(1)) / 1e3


INSERT = "INSERT INTO floor.t (v) VALUES ('{p}');\n"
FLOORS = {
    "insert_on": (INSERT, FLOOR_PAYLOAD, "on"),
    "insert_off": (INSERT, FLOOR_PAYLOAD, "off"),
    "insert2k_on": (INSERT, BIG_PAYLOAD, "on"),
    "insert2k_off": (INSERT, BIG_PAYLOAD, "off"),
    "begin_insert_commit_on": ("BEGIN;\n" + INSERT + "COMMIT;\n", FLOOR_PAYLOAD, "on"),
    "select1": ("SELECT 1;\n", "", "on"),
}


def floors(srv: Server, binary: str, tx: int, names: tuple[str, ...] = tuple(FLOORS)) -> dict[str, float]:
    """The floors named, each after a CHECKPOINT (as every run starts)."""
    out = {}
    for name in names:
        script, payload, commit = FLOORS[name]
        srv.admin.execute("CHECKPOINT")
        out[name] = pgbench(binary, srv.port, script.format(p=payload), tx, commit)
    return out


# ---------------------------------------------------------------- runs


def workflow(case: str, size: int) -> tuple[Path, list[str]]:
    if case == "loop":
        return ENGINE / "workflows" / "loop.yaml", ["--set", f"iterations={size}"]
    path = WORK / f"chain-{size}.yaml"
    if not path.exists():
        subprocess.run([sys.executable, str(ENGINE / "gen_chain.py"), str(size), str(path)], check=True)
    return path, []


def runner_cmd(binary: str, cfg: Cfg, size: int, db: str) -> list[str]:
    wf, extra = workflow(cfg.case, size)
    cmd = [binary, "run", str(wf), "--db", db, "--stream", "none", "--persist", cfg.persist]
    if cfg.store == "pg":
        cmd += ["--durability", "power-safe" if cfg.commit == "on" else "crash-safe"]
    return cmd + extra


def langgraph_cmd(python: str, cfg: Cfg, size: int, conninfo: str, schema: str) -> list[str]:
    cmd = [python, str(HERE / "langgraph_pg.py"), cfg.case, "--n", str(size), "--mode", cfg.mode]
    if cfg.store == "pg":
        cmd += ["--saver", "pg", "--durability", cfg.persist, "--commit", cfg.commit,
                "--conninfo", conninfo, "--schema", schema]
    return cmd


def expected_total(case: str, size: int) -> int:
    return 3 * size if case == "loop" else size


class Runner:
    def __init__(self, args: argparse.Namespace, srv: Server) -> None:
        self.args, self.srv = args, srv
        self.seq = 0

    def once(self, cfg: Cfg, size: int) -> Sample:
        """One run; server counters around it when it uses the database."""
        self.seq += 1
        schema = f"s{self.seq}"
        d = WORK / "run"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        if cfg.side == "runner":
            db = self.srv.url(schema) if cfg.store == "pg" else ":memory:"
            cmd = runner_cmd(self.args.runner, cfg, size, db)
        else:
            cmd = langgraph_cmd(sys.executable, cfg, size, self.srv.conninfo(), schema)
        before = self.srv.before(schema) if cfg.store == "pg" else None
        with open(d / "stdout", "wb") as fo, open(d / "stderr", "wb") as fe:
            t0 = time.perf_counter()
            child = subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, cwd=d)
            _, status, usage = os.wait4(child.pid, 0)
            wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        stdout = (d / "stdout").read_text()
        if child.returncode != 0:
            stderr = (d / "stderr").read_text(errors="replace")
            raise RuntimeError(f"exit {child.returncode}: {' '.join(cmd)}\n{stderr.strip()[-800:]}")
        cpu = usage.ru_utime + usage.ru_stime
        if cfg.side == "runner":
            total = json.loads(stdout)["total"]
            if total != expected_total(cfg.case, size):
                raise RuntimeError(f"{' '.join(cmd)}: total {total}, expected {expected_total(cfg.case, size)}")
            s = Sample(wall_s=wall, cpu_s=cpu)
        else:
            s = Sample(wall_s=json.loads(stdout.strip().splitlines()[-1])["invoke_s"], cpu_s=cpu)
        if before is not None:
            got = self.srv.after(schema, before)
            s.xact, s.wal_bytes, s.stored_bytes = got["xact"], got["wal"], got["stored"]
        return s


# ---------------------------------------------------------------- report helpers


def us(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1e6:,.0f} µs" if abs(x) >= 1e-5 else f"{x * 1e6:.1f} µs"


def num(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def size_b(x: float | None) -> str:
    if x is None:
        return "—"
    if abs(x) >= 10 * 1024:
        return f"{x / 1024:,.1f} KiB"
    return f"{x:,.0f} B"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0 or a <= 0:
        return "—"
    return f"{a / b:.1f}x" if a / b >= 10 else f"{a / b:.2f}x"


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fs = subprocess.run(["df", "-T", str(WORK)], capture_output=True, text=True).stdout.splitlines()
    return {
        "cpu": model,
        "nproc": str(os.cpu_count()),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "fs": fs[-1].split()[1] if len(fs) > 1 else "?",
        "kernel": platform.release(),
    }


def short(query: str) -> str:
    q = " ".join(query.split())
    return q if len(q) <= 90 else q[:87] + "..."


# ---------------------------------------------------------------- main


ROWS = [
    # (label, synchronous_commit, persist / durability, target)
    ("crash-safe (`synchronous_commit=off`), persist async", "off", "async", ">= 10x lower"),
    ("crash-safe (`synchronous_commit=off`), persist sync", "off", "sync", ""),
    ("power-safe (`synchronous_commit=on`), persist async", "on", "async", ""),
    ("power-safe (`synchronous_commit=on`), persist sync", "on", "sync", "runner <= 1.2x the floor"),
]


def configs(cases: list[str], skip_lg: bool) -> list[Cfg]:
    out = []
    for case in cases:
        out.append(Cfg("runner", case, "none"))
        for _, commit, persist, _ in ROWS:
            out.append(Cfg("runner", case, "pg", commit, persist))
        if skip_lg:
            continue
        for mode in ("sync", "async"):
            out.append(Cfg("langgraph", case, "none", mode=mode))
            for _, commit, persist, _ in ROWS:
                out.append(Cfg("langgraph", case, "pg", commit, persist, mode))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True, help="the benchmark's PostgreSQL on 127.0.0.1")
    ap.add_argument("--runner", required=True, help="the runner binary")
    ap.add_argument("--pgbench", required=True)
    ap.add_argument("--postgres", help="the server binary (for its version line)")
    ap.add_argument("--reps", type=int, default=3, help="runs per configuration and size (>= 3; median)")
    ap.add_argument("--cases", default="loop,chain", help="comma-separated: loop, chain")
    ap.add_argument("--loop-rounds", default="34,334", help="the loop's two sizes, in rounds (3 supersteps each)")
    ap.add_argument("--chain-nodes", default="100,1000", help="the chain's two sizes, in nodes")
    ap.add_argument("--skip-langgraph", action="store_true")
    ap.add_argument("--no-count", action="store_true", help="skip the statement-counting pass")
    ap.add_argument("--floor-tx", type=int, default=2000, help="transactions per floor measurement")
    ap.add_argument("--near-tx", type=int, default=300,
                    help="transactions per floor measured right before a runner run")
    ap.add_argument("--json", help="also write every sample here")
    args = ap.parse_args()
    args.runner = str(Path(args.runner).resolve())
    reps = max(3, args.reps)
    for case, arg in (("loop", args.loop_rounds), ("chain", args.chain_nodes)):
        a, b = (int(x) for x in arg.split(","))
        if not 0 < a < b:
            ap.error(f"{case}: two sizes, the first smaller")
        SIZES[case] = (a, b)
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in SIZES:
            ap.error(f"unknown case {c!r}: loop, chain")
    WORK.mkdir(parents=True, exist_ok=True)

    mach = machine()
    srv = Server(args.port)
    runner = Runner(args, srv)
    cfgs = configs(cases, args.skip_langgraph)
    runs: dict[Cfg, Runs] = {c: Runs() for c in cfgs}
    floor_samples: list[dict[str, float]] = []
    # The power-safe floor moves with the disk's other work: it is also measured right before
    # every runner run on the database, with that run's synchronous_commit.
    near: dict[str, list[float]] = {}

    # Repetitions interleaved, so drift in the machine's load spreads over every configuration.
    for rep in range(reps):
        floor_samples.append(floors(srv, args.pgbench, args.floor_tx))
        log(f"rep {rep + 1}/{reps}: floor insert (sync commit on) {us(floor_samples[-1]['insert_on'])}, "
            f"round trip {us(floor_samples[-1]['select1'])}")
        for cfg in cfgs:
            r = runs[cfg]
            if r.error:
                continue
            for size in SIZES[cfg.case]:
                try:
                    if cfg.side == "runner" and cfg.store == "pg":
                        names = (f"insert_{cfg.commit}", f"insert2k_{cfg.commit}")
                        for k, v in floors(srv, args.pgbench, args.near_tx, names).items():
                            near.setdefault(k, []).append(v)
                    s = runner.once(cfg, size)
                except (RuntimeError, ValueError, KeyError) as e:
                    r.error = str(e)
                    log(f"  {cfg.key()} size {size}: {e}")
                    break
                r.samples.setdefault(size, []).append(s)
                log(f"  {cfg.key():45} size {size:5}: {s.wall_s * 1e3:9.1f} ms"
                    + (f", {s.xact} xact, WAL {s.wal_bytes:,} B" if s.xact is not None else ""))

    # Statement counts: one more run per configuration and size, untimed, tracking on.
    if srv.pgss and not args.no_count:
        srv.tracking(True)
        try:
            for cfg in cfgs:
                if cfg.store != "pg" or runs[cfg].error:
                    continue
                for size in SIZES[cfg.case]:
                    srv.admin.execute("SELECT pg_stat_statements_reset()")
                    runner.once(cfg, size)
                    runs[cfg].statements[size] = srv.statements()
        finally:
            srv.tracking(False)

    floor = {k: statistics.median(f[k] for f in floor_samples) for k in FLOORS}
    # The targets are judged against the floors measured next to runner's runs.
    floor.update({f"near_{k}": statistics.median(v) for k, v in near.items()})
    report(args, mach, srv, cases, runs, floor, reps)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": mach,
            "server": srv.version(),
            "floor_s": floor,
            "floor_samples": floor_samples,
            "near_floor_samples": near,
            "sizes": SIZES,
            "runs": {c.key(): {"error": r.error,
                               "samples": {str(k): [vars(s) for s in v] for k, v in r.samples.items()},
                               "statements": {str(k): v for k, v in r.statements.items()}}
                     for c, r in runs.items()},
        }, indent=1))


@dataclass
class Derived:
    cost: float | None = None  # per step
    fixed: float | None = None  # per run
    cpu: float | None = None  # the client's CPU per step, by the same formula as cost
    xact: float | None = None  # per step
    wal: float | None = None
    stored: float | None = None
    stmts: float | None = None
    by_stmt: list[tuple[str, float, float]] = field(default_factory=list)  # query, calls/step, ms/call


def derive(cfg: Cfg, runs: dict[Cfg, Runs]) -> Derived:
    d = Derived()
    r, b = runs.get(cfg), runs.get(cfg.baseline())
    if not r or r.error or not b or b.error:
        return d
    s1, s2 = SIZES[cfg.case]
    steps1, steps2 = s1 * STEPS_PER[cfg.case], s2 * STEPS_PER[cfg.case]
    dn = steps2 - steps1
    t1, t2, b1, b2 = r.med(s1, "wall_s"), r.med(s2, "wall_s"), b.med(s1, "wall_s"), b.med(s2, "wall_s")
    if None not in (t1, t2, b1, b2):
        d.cost = ((t2 - t1) - (b2 - b1)) / dn
        d.fixed = (t1 - b1) - steps1 * d.cost
    c1, c2, e1, e2 = r.med(s1, "cpu_s"), r.med(s2, "cpu_s"), b.med(s1, "cpu_s"), b.med(s2, "cpu_s")
    if None not in (c1, c2, e1, e2):
        d.cpu = ((c2 - c1) - (e2 - e1)) / dn
    for attr, name in (("xact", "xact"), ("wal_bytes", "wal"), ("stored_bytes", "stored")):
        a1, a2 = r.med(s1, attr), r.med(s2, attr)
        if a1 is not None and a2 is not None:
            setattr(d, name, (a2 - a1) / dn)
    if s1 in r.statements and s2 in r.statements:
        q1, q2 = r.statements[s1], r.statements[s2]
        total = 0.0
        for q, v in q2.items():
            calls = (v["calls"] - q1.get(q, {}).get("calls", 0)) / dn
            total += calls
            if calls >= 0.05:
                d.by_stmt.append((q, calls, v["ms"] / v["calls"] if v["calls"] else 0.0))
        d.stmts = total
        d.by_stmt.sort(key=lambda x: -x[1])
    return d


def report(args: argparse.Namespace, mach: dict[str, str], srv: Server, cases: list[str],
           runs: dict[Cfg, Runs], floor: dict[str, float], reps: int) -> None:
    out: list[str] = []
    p = out.append

    def fl(commit: str, big: bool = False) -> float:
        name = f"insert{'2k' if big else ''}_{commit}"
        return floor.get(f"near_{name}", floor[name])

    p("### PostgreSQL checkpoints: runner vs LangGraph\n")
    p(f"Machine: {mach['cpu']}, {mach['nproc']} CPUs, Linux {mach['kernel']}, PostgreSQL {srv.version()} "
      f"on 127.0.0.1 with its data on {mach['fs']} (fsync on); load average at start {mach['load']}.  ")
    try:
        from importlib.metadata import version
        p(f"LangGraph {version('langgraph')}, langgraph-checkpoint-postgres "
          f"{version('langgraph-checkpoint-postgres')}, psycopg {version('psycopg')}, Python {platform.python_version()}.  ")
    except Exception:  # noqa: BLE001 (report line only)
        pass
    v = subprocess.run([args.runner, "--version"], capture_output=True, text=True).stdout.strip()
    p(f"runner: `{v}` (release build). Median of {reps} runs per configuration and size, interleaved.\n")
    p("Floors (pgbench: PostgreSQL's C client, one connection, prepared statements; each after a "
      "`CHECKPOINT`, as every run starts). Next to runner's runs (median of the measures taken "
      "right before each): autocommit `INSERT` of 256 bytes, one round trip and one commit, "
      f"`synchronous_commit=on` **{us(fl('on'))}**, `off` **{us(fl('off'))}**; of 2 KiB (about what a "
      f"step stores) on {us(fl('on', True))}, off {us(fl('off', True))}. Once a repetition: 256 bytes on "
      f"{us(floor['insert_on'])}, off {us(floor['insert_off'])}; `BEGIN; INSERT; COMMIT` (on) "
      f"{us(floor['begin_insert_commit_on'])}; `SELECT 1`, one loopback round trip, {us(floor['select1'])}.\n")

    for case in cases:
        s1, s2 = SIZES[case]
        spp = STEPS_PER[case]
        what = (f"the loop a → b → c → a …, {s1} and {s2} rounds ({s1 * spp} and {s2 * spp} supersteps)"
                if case == "loop" else f"a chain of {s1} and {s2} nodes (as many supersteps)")
        p(f"**{case}**: {what}. Checkpoint cost per superstep, "
          "`[(T(S2) − T(S1)) − (T_none(S2) − T_none(S1))] / (S2 − S1)`.\n")
        p("| durability, persist | LangGraph PostgresSaver | LangGraph AsyncPostgresSaver | runner | "
          "PostgresSaver / runner | AsyncPostgresSaver / runner | runner / floor (256 B; 2 KiB) | target |")
        p("|---|---:|---:|---:|---:|---:|---:|---|")
        for label, commit, persist, target in ROWS:
            lg_s = derive(Cfg("langgraph", case, "pg", commit, persist, "sync"), runs)
            lg_a = derive(Cfg("langgraph", case, "pg", commit, persist, "async"), runs)
            rn = derive(Cfg("runner", case, "pg", commit, persist), runs)
            p(f"| {label} | {us(lg_s.cost)} | {us(lg_a.cost)} | {us(rn.cost)} | {ratio(lg_s.cost, rn.cost)} "
              f"| {ratio(lg_a.cost, rn.cost)} | {ratio(rn.cost, fl(commit))}; {ratio(rn.cost, fl(commit, True))} "
              f"| {target} |")
        p("")
        p("Per superstep (same difference of sizes): the client process's CPU (user + system, less the "
          "baseline's), transactions committed (`pg_stat_database.xact_commit`), statements "
          "(`pg_stat_statements` calls, untimed pass), WAL written, bytes stored (tables, TOAST and "
          "indexes of the run's schema); and what a run pays once beyond the baseline (connect, "
          "tables, thread, lease, the last wait).\n")
        p("| durability, persist | system | cost/step | client CPU/step | xact/step | statements/step | "
          "WAL/step | stored/step | fixed/run |")
        p("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for label, commit, persist, _ in ROWS:
            for name, cfg in (("LangGraph PostgresSaver", Cfg("langgraph", case, "pg", commit, persist, "sync")),
                              ("LangGraph AsyncPostgresSaver", Cfg("langgraph", case, "pg", commit, persist, "async")),
                              ("runner", Cfg("runner", case, "pg", commit, persist))):
                if cfg not in runs:
                    continue
                d = derive(cfg, runs)
                fixed = "—" if d.fixed is None else f"{d.fixed * 1e3:,.1f} ms"
                p(f"| {label} | {name} | {us(d.cost)} | {us(d.cpu)} | {num(d.xact, 2)} | {num(d.stmts, 2)} "
                  f"| {size_b(d.wal)} | {size_b(d.stored)} | {fixed} |")
        p("")
        # Where runner's time goes: each statement is a round trip of its own (tokio-postgres,
        # awaited one by one); the floor makes one.
        for label, commit, persist, _ in ROWS:
            d = derive(Cfg("runner", case, "pg", commit, persist), runs)
            if d.cost is None or d.stmts is None:
                continue
            rt = floor["select1"]
            if persist == "sync":
                extra = (d.stmts - 1) * rt
                p(f"- runner, {label}: {us(d.cost)} a step, {ratio(d.cost, fl(commit))} the floor's {us(fl(commit))}; "
                  f"{d.stmts:.1f} statements a step, each its own round trip, where the floor makes one: "
                  f"{d.stmts - 1:.1f} more at {us(rt)} (`SELECT 1`) are {us(extra)}, floor + that "
                  f"{us(fl(commit) + extra)}; client CPU {us(d.cpu)} a step.")
            else:
                p(f"- runner, {label}: {us(d.cost)} a step with {num(d.xact, 3)} commits a step (the background "
                  f"writer commits what queued meanwhile in one transaction), but {d.stmts:.1f} statements a "
                  f"step, each its own round trip: {d.stmts:.1f} × {us(rt)} = {us(d.stmts * rt)}; client CPU "
                  f"{us(d.cpu)} a step.")
        p("")
        for label, commit, persist, _ in ROWS:
            d = derive(Cfg("runner", case, "pg", commit, persist), runs)
            if not d.by_stmt:
                continue
            p(f"runner's statements per superstep, {label} (calls a step; mean server time a call):\n")
            p("| calls/step | server ms/call | statement |")
            p("|---:|---:|---|")
            for q, calls, ms in d.by_stmt:
                p(f"| {calls:.2f} | {ms:.3f} | `{short(q)}` |")
            p("")

    errors = [(c.key(), r.error) for c, r in runs.items() if r.error]
    if errors:
        p("Errors:\n")
        for k, e in errors:
            p(f"- `{k}`: {e}")
        p("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
