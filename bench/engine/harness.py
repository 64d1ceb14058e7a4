#!/usr/bin/env python3
"""Engine benchmark driver: runs every case for LangGraph and runner and prints Markdown tables.

Started by bench/engine/run.sh (which makes the venv and builds runner); standard library only.
Every run is a fresh process with a fresh database; each configuration runs --reps times (>= 3)
and the median is reported.

LangGraph: langgraph_cases.py reports in-process times; the comparison uses the time of
graph.invoke(...) alone (no interpreter start, imports or graph building).

runner: the real binary, timed from outside (wall time from spawn to exit, so process start,
parsing and compiling the workflow and opening the database are included: this is unfavourable
to runner). One engine-only estimate is added where it can be had:
  - for the loops, the marginal cost: (wall(1,000 rounds) - wall(1 round)) / (3,000 - 3) steps,
    with `--set iterations=1` (events off, as in the timed runs);
  - otherwise from a `--stream jsonl` run: run_end's duration (or last event time - first event
    time), which also includes writing the events.
Peak memory: GNU time's %M for the child (its ru_maxrss from os.wait4 would also count the forked
interpreter's pages before exec); without /usr/bin/time, that ru_maxrss.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORKFLOWS = HERE / "workflows"
RECURSION_LIMIT = "100000"

# Supersteps and tasks per case at N = 1,000 (the YAML files and langgraph_cases.py agree).
SUPERSTEPS = {"loop": 3000, "append": 3000, "chain": 1000, "fanout": 2}
TASKS = {"loop": 3000, "append": 3000, "chain": 1000, "fanout": 1001}
# What the time is divided by: supersteps, except for the fan-out (2 supersteps, 1,000 tasks).
UNIT = {"loop": "step", "append": "step", "chain": "step", "fanout": "task"}
PER = {"loop": 3000, "append": 3000, "chain": 1000, "fanout": 1000}

SKIPPED_MSG = "runner side skipped: engine not built yet"


@dataclass(frozen=True)
class LG:
    case: str
    checkpointer: str  # none | memory | crash-safe | power-safe
    durability: str = "async"  # LangGraph's invoke(durability=...)


@dataclass(frozen=True)
class RN:
    case: str
    mode: str  # none (--db :memory:) | crash-safe | power-safe
    iterations: int | None = None  # --set iterations=N (loops only)
    persist: str = "async"  # runner's --persist: async pairs with LangGraph's default durability


@dataclass
class Row:
    label: str
    lg: LG
    rn: RN
    target: str = ""
    target_ratio: float | None = None


ROWS = [
    # Equal durability: LangGraph's default `durability="async"` (checkpoints written in the
    # background while the next step runs) against runner's `--persist async` (the same).
    Row("loop, no checkpointer", LG("loop", "none"), RN("loop", "none"), ">= 30x", 30),
    Row("loop, SQLite crash-safe (WAL + NORMAL)", LG("loop", "crash-safe"), RN("loop", "crash-safe"), ">= 15x", 15),
    Row("loop, SQLite power-safe (WAL + FULL)", LG("loop", "power-safe"), RN("loop", "power-safe"), ">= 15x", 15),
    Row("append loop, SQLite crash-safe", LG("append", "crash-safe"), RN("append", "crash-safe")),
    Row("append loop, SQLite power-safe", LG("append", "power-safe"), RN("append", "power-safe")),
    Row("1,000-node chain, no checkpointer", LG("chain", "none"), RN("chain", "none")),
    Row("fan-out to 1,000 tasks, no checkpointer", LG("fanout", "none"), RN("fanout", "none")),
    # For reference, not targets: each step committed before the next starts, on both sides.
    Row("loop, LangGraph InMemorySaver vs runner :memory:", LG("loop", "memory"), RN("loop", "none")),
    Row("loop, crash-safe, durability=sync on both", LG("loop", "crash-safe", "sync"), RN("loop", "crash-safe", persist="sync")),
    Row("loop, power-safe, durability=sync on both", LG("loop", "power-safe", "sync"), RN("loop", "power-safe", persist="sync")),
    Row("1,000-node chain, SQLite crash-safe", LG("chain", "crash-safe"), RN("chain", "crash-safe")),
    Row("fan-out to 1,000 tasks, SQLite crash-safe", LG("fanout", "crash-safe"), RN("fanout", "crash-safe")),
]


class EngineMissing(Exception):
    pass


@dataclass
class Runs:
    samples: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def med(self, key: str) -> float | None:
        vals = [s[key] for s in self.samples if s.get(key) is not None]
        return statistics.median(vals) if vals else None

    def max(self, key: str) -> float | None:
        vals = [s[key] for s in self.samples if s.get(key) is not None]
        return max(vals) if vals else None


def db_size(path: Path) -> int:
    """The database plus its -wal file (what a copy of the thread would need)."""
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def fresh_dir(work: Path, name: str) -> Path:
    d = work / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


# ---------------------------------------------------------------- LangGraph


def fsync_floor(work: Path, commits: int = 200) -> float:
    """Seconds per SQLite FULL commit on the disk the databases are on: WAL journaling,
    `synchronous=FULL`, one small row per transaction (the least a power-safe step can cost)."""
    import sqlite3

    d = fresh_dir(work, "floor")
    conn = sqlite3.connect(str(d / "floor.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=wal")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (i INTEGER PRIMARY KEY, v TEXT)")
    times = []
    for i in range(commits + 10):
        t0 = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (f"step {i}",))
        conn.execute("COMMIT")
        if i >= 10:  # the first commits also grow the file: not counted
            times.append(time.perf_counter() - t0)
    conn.close()
    return statistics.median(times)


def run_langgraph(cfg: LG, reps: int, work: Path, python: str) -> Runs:
    runs = Runs()
    for i in range(reps):
        d = fresh_dir(work, "lg")
        cmd = [python, str(HERE / "langgraph_cases.py"), cfg.case, "--checkpointer", cfg.checkpointer]
        if cfg.checkpointer in ("crash-safe", "power-safe"):
            cmd += ["--db", str(d / "lg.db")]
        if cfg.checkpointer != "none":
            cmd += ["--lg-durability", cfg.durability]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            runs.error = f"exit {p.returncode}: {p.stderr.strip()[-400:]}"
            return runs
        s = json.loads(p.stdout.strip().splitlines()[-1])
        s["process_s"] = wall
        in_script = s["script_s"]
        s["startup_s"] = wall - in_script + s["stdlib_import_s"]  # interpreter start, outside the script
        runs.samples.append(s)
        print(f"  langgraph {cfg.case:6} {cfg.checkpointer:10} {cfg.durability:5} run {i + 1}: "
              f"invoke {s['invoke_s'] * 1e3:8.1f} ms", file=sys.stderr)
    return runs


# ---------------------------------------------------------------- runner


def runner_cmd(binary: Path, cfg: RN, db: Path, stream: str = "none") -> list[str]:
    cmd = [str(binary), "run", str(WORKFLOWS / f"{cfg.case}.yaml")]
    cmd += ["--db", ":memory:" if cfg.mode == "none" else str(db)]
    cmd += ["--stream", stream, "--recursion-limit", RECURSION_LIMIT]
    if cfg.mode == "power-safe":
        cmd += ["--durability", "power-safe"]
    if cfg.mode != "none":
        cmd += ["--persist", cfg.persist]
    if cfg.iterations is not None:
        cmd += ["--set", f"iterations={cfg.iterations}"]
    return cmd


GNU_TIME = Path("/usr/bin/time")


def spawn(cmd: list[str], out: Path, err: Path) -> tuple[int, float, int]:
    """Runs cmd; returns (exit code, wall seconds, peak RSS in KiB).

    The peak comes from GNU time's %M when it is installed: a child's own ru_maxrss (os.wait4)
    also counts the pages of the forked Python interpreter before exec, which inflates it by
    however large this harness has grown."""
    rss_file = out.with_suffix(".rss")
    wrapped = [str(GNU_TIME), "-f", "%M", "-o", str(rss_file)] + cmd if GNU_TIME.exists() else cmd
    with open(out, "wb") as fo, open(err, "wb") as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(wrapped, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
    rss = usage.ru_maxrss
    if GNU_TIME.exists():
        try:
            rss = int(rss_file.read_text().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            pass
    return p.returncode, wall, rss


def check_missing(rc: int, stderr: str) -> None:
    if rc == 2 and "unrecognized subcommand" in stderr:
        raise EngineMissing()


def run_runner(binary: Path, cfg: RN, reps: int, work: Path) -> Runs:
    runs = Runs()
    for i in range(reps):
        d = fresh_dir(work, "rn")
        db = d / "r.db"
        cmd = runner_cmd(binary, cfg, db)
        rc, wall, rss = spawn(cmd, d / "stdout", d / "stderr")
        stderr = (d / "stderr").read_text(errors="replace")
        check_missing(rc, stderr)
        if rc != 0:
            runs.error = f"exit {rc}: {' '.join(cmd)}\n{stderr.strip()[-600:]}"
            return runs
        s: dict[str, Any] = {"wall_s": wall, "maxrss_kb": rss}
        if cfg.mode != "none":
            s["db_bytes"] = db_size(db)
        runs.samples.append(s)
        print(f"  runner    {cfg.case:6} {cfg.mode:10} it={cfg.iterations} run {i + 1}: "
              f"wall {wall * 1e3:8.1f} ms, rss {rss / 1024:.1f} MiB", file=sys.stderr)
    # One more run with --stream jsonl, untimed, for the engine's own timestamps (if any).
    if cfg.iterations is None:
        d = fresh_dir(work, "rn")
        cmd = runner_cmd(binary, cfg, d / "r.db", stream="jsonl")
        rc, _, _ = spawn(cmd, d / "stdout", d / "stderr")
        if rc == 0:
            # Events may go to stdout or stderr (the result goes to the other): read both.
            span = jsonl_span((d / "stdout").read_text(errors="replace") + "\n"
                              + (d / "stderr").read_text(errors="replace"))
            if span is not None:
                runs.samples[0]["jsonl"] = span
    return runs


TS_KEYS = ("elapsed_ms", "elapsed_us", "ts", "timestamp", "time", "at", "t")


def parse_ts(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def jsonl_span(text: str) -> dict[str, Any] | None:
    """Engine time from the event stream: (last - first timestamp) and how many steps it saw.

    Tolerant of the event format, which is not fixed yet: the first of TS_KEYS found in an event
    (numbers are taken as seconds, ms or µs by magnitude; strings as RFC 3339), and the step
    count from events whose type mentions a step start.
    """
    stamps: list[float] = []
    key_used = None
    run_ms = None
    steps = 0
    for line in text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict):
            continue
        kind = str(ev.get("type") or ev.get("event") or ev.get("kind") or "").lower()
        if kind == "run_end" and isinstance(ev.get("duration_ms"), (int, float)):
            run_ms = float(ev["duration_ms"])
        if "step" in kind and "start" in kind and "node" not in kind:
            steps += 1
        for k in TS_KEYS:
            if k in ev and (t := parse_ts(ev[k])) is not None:
                stamps.append(t)
                key_used = k
                break
    if run_ms is not None:  # the engine's own total (run_end.duration_ms)
        return {"span_s": run_ms / 1e3, "steps": steps or None, "key": "run_end.duration_ms"}
    if len(stamps) < 2:
        return None
    span = max(stamps) - min(stamps)
    # Scale to seconds: epoch seconds ~1.7e9, ms ~1.7e12, µs ~1.7e15, ns ~1.7e18.
    top = max(stamps)
    if key_used == "elapsed_ms":
        span /= 1e3
    elif key_used == "elapsed_us":
        span /= 1e6
    elif top > 1e17:
        span /= 1e9
    elif top > 1e14:
        span /= 1e6
    elif top > 1e11:
        span /= 1e3
    return {"span_s": span, "steps": steps or None, "key": key_used}


# ---------------------------------------------------------------- report


def us(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1e6:,.0f} µs" if x >= 1e-5 else f"{x * 1e6:.2f} µs"


def ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:,.1f} ms"


def mib(kb: float | None) -> str:
    return "—" if kb is None else f"{kb / 1024:.1f} MiB"


def size(b: float | None) -> str:
    if b is None:
        return "—"
    if b >= 1 << 20:
        return f"{b / (1 << 20):.2f} MiB"
    return f"{b / 1024:.0f} KiB"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "—"
    return f"{a / b:.1f}x"


def machine() -> dict[str, str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fs = subprocess.run(["df", "-T", str(ROOT / "target")], capture_output=True, text=True).stdout.splitlines()
    return {
        "cpu": model,
        "nproc": str(os.cpu_count()),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "fs": fs[-1].split()[1] if len(fs) > 1 else "?",
        "kernel": platform.release(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="runs per configuration (>= 3; median reported)")
    ap.add_argument("--runner", default=str(ROOT / "target" / "release" / "runner"))
    ap.add_argument("--python", default=sys.executable, help="the venv's python (LangGraph side)")
    ap.add_argument("--skip-runner", metavar="WHY", help="do not run the runner side; print WHY")
    ap.add_argument("--skip-langgraph", action="store_true")
    ap.add_argument("--only", help="comma-separated row numbers (1-based) to run")
    ap.add_argument("--json", help="also write every sample here")
    args = ap.parse_args()
    reps = max(3, args.reps)
    work = ROOT / "target" / "bench-engine"  # same filesystem as the project: real fsyncs
    work.mkdir(parents=True, exist_ok=True)
    rows = ROWS
    if args.only:
        keep = {int(x) for x in args.only.split(",")}
        rows = [r for i, r in enumerate(ROWS, 1) if i in keep]

    mach = machine()
    lg: dict[LG, Runs] = {}
    rn: dict[RN, Runs] = {}
    runner_note = args.skip_runner
    binary = Path(args.runner)
    if runner_note is None and not binary.exists():
        runner_note = f"runner side skipped: {binary} not found"

    if not args.skip_langgraph:
        for r in rows:
            if r.lg not in lg:
                lg[r.lg] = run_langgraph(r.lg, reps, work, args.python)

    if runner_note is None:
        wanted: list[RN] = []
        for r in rows:
            wanted.append(r.rn)
            if r.rn.case in ("loop", "append"):
                wanted.append(RN(r.rn.case, r.rn.mode, 1))
        try:
            for cfg in wanted:
                if cfg not in rn:
                    rn[cfg] = run_runner(binary, cfg, reps, work)
        except EngineMissing:
            runner_note = SKIPPED_MSG
            rn.clear()

    # The floors the targets are measured against, in the same run: the fsync of one SQLite
    # FULL commit on this disk, and a bare `runner --version`.
    floor = fsync_floor(work)
    version_s = None
    if runner_note is None:
        walls = []
        for _ in range(max(reps, 10)):
            t0 = time.perf_counter()
            subprocess.run([str(binary), "--version"], capture_output=True)
            walls.append(time.perf_counter() - t0)
        version_s = statistics.median(walls)

    # ---- report
    engine_per_step: dict[int, float] = {}
    out: list[str] = []
    p = out.append
    lg_any = next((x.samples[0] for x in lg.values() if x.samples), None)
    p("### Engine benchmark: runner vs LangGraph\n")
    p(f"Machine: {mach['cpu']}, {mach['nproc']} CPUs, Linux {mach['kernel']}, databases on "
      f"{mach['fs']}; load average at start {mach['load']}.  ")
    if lg_any:
        p(f"LangGraph {lg_any['langgraph']} (langgraph-checkpoint-sqlite "
          f"{lg_any['langgraph_checkpoint_sqlite']}), Python {lg_any['python']}, SQLite {lg_any['sqlite']}.  ")
    if binary.exists():
        v = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout.strip()
        p(f"runner: `{v or binary}` (release build).  ")
    p(f"Median of {reps} runs, each a fresh process and a fresh database. N = 1,000 everywhere.\n")
    if runner_note:
        p(f"**{runner_note}.**\n")

    p("LangGraph: time of `graph.invoke()` only (no interpreter start, imports or graph building). "
      "runner: wall time of the whole `runner run` process (start, workflow compile and database "
      "open included); \"engine\" is runner's own time where it can be measured: for the loops "
      "the marginal cost per step between 1 and 1,000 rounds, otherwise a `--stream jsonl` "
      "run's own total (which also pays for writing the events). Per step, except the fan-out: "
      "per task (2 supersteps, 1,001 tasks).\n")
    p("| # | case | LangGraph total | LangGraph /step | runner total (process) | runner /step (process) "
      "| ratio | runner /step (engine) | ratio (engine) | target |")
    p("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for i, r in enumerate(ROWS, 1):
        if r not in rows:
            continue
        L = lg.get(r.lg)
        R = rn.get(r.rn)
        per = PER[r.lg.case]
        lt = L.med("invoke_s") if L else None
        l_step = lt / per if lt is not None else None
        rt = R.med("wall_s") if R else None
        r_step = rt / per if rt is not None else None
        eng = None
        # Loops: the marginal cost per step, with events off as in the timed runs. Elsewhere the
        # engine's own total from a `--stream jsonl` run, which also pays for writing the events.
        if r.rn.case in ("loop", "append") and R and (R1 := rn.get(RN(r.rn.case, r.rn.mode, 1))):
            if rt is not None and R1.med("wall_s") is not None:
                eng = max(rt - R1.med("wall_s"), 0.0) / (SUPERSTEPS[r.rn.case] - 3)
        elif R and R.samples and R.samples[0].get("jsonl"):
            eng = R.samples[0]["jsonl"]["span_s"] / per
        if eng is not None:
            engine_per_step[i] = eng
        unit = UNIT[r.lg.case]
        cells = [
            str(i), r.label,
            ms(lt) if L and not L.error else f"error: {L.error[:80]}" if L else "—",
            us(l_step) + ("" if unit == "step" or l_step is None else "/task"),
            ms(rt) if not (R and R.error) else "error (below)",
            us(r_step),
            ratio(l_step, r_step),
            us(eng),
            ratio(l_step, eng),
            r.target,
        ]
        p("| " + " | ".join(cells) + " |")
    p("")

    # DB sizes
    p("Database size after the run (main file + `-wal`; LangGraph's WAL checkpointed and closed first):\n")
    p("| # | case | LangGraph DB | runner DB | LangGraph / runner | LangGraph rows (checkpoints, writes) | target |")
    p("|---|---|---:|---:|---:|---|---|")
    for i, r in enumerate(ROWS, 1):
        if r not in rows or r.lg.checkpointer not in ("crash-safe", "power-safe"):
            continue
        L, R = lg.get(r.lg), rn.get(r.rn)
        lb = L.med("db_bytes") if L else None
        rb = R.med("db_bytes") if R else None
        rows_s = "—"
        if L and L.samples:
            rows_s = f"{L.samples[0]['checkpoint_rows']:,}, {L.samples[0]['write_rows']:,}"
        tgt = ">= 10x smaller" if r.lg.case == "append" else ""
        p(f"| {i} | {r.label} | {size(lb)} | {size(rb)} | {ratio(lb, rb)} | {rows_s} | {tgt} |")
    p("")

    # Memory and start-up
    p("Peak resident memory (max over runs) and start-up:\n")
    p("| # | case | runner peak RSS (target < 20 MiB) | LangGraph peak RSS | LangGraph imports | LangGraph interpreter start | LangGraph build + compile |")
    p("|---|---|---:|---:|---:|---:|---:|")
    for i, r in enumerate(ROWS, 1):
        if r not in rows:
            continue
        L, R = lg.get(r.lg), rn.get(r.rn)
        p(f"| {i} | {r.label} | {mib(R.max('maxrss_kb') if R else None)} "
          f"| {mib(L.max('maxrss_kb') if L else None)} | {ms(L.med('import_s') if L else None)} "
          f"| {ms(L.med('startup_s') if L else None)} | {ms(L.med('build_s') if L else None)} |")
    p("")
    one = [(m, rn.get(RN("loop", m, 1))) for m in ("none", "crash-safe", "power-safe")]
    if any(x and x.samples for _, x in one):
        p("runner process for a 1-round loop (3 supersteps: start, compile, open, run, exit): " + ", ".join(
            f"{m} {ms(x.med('wall_s'))}" for m, x in one if x and x.samples) + ".\n")
    if version_s is not None:
        p(f"A bare `runner --version`: {ms(version_s)}; a 1-round loop against it (target <= 3x): " + ", ".join(
            f"{m} {ratio(x.med('wall_s'), version_s)}" for m, x in one if x and x.samples) + ".\n")
    sync_row = next(i for i, r in enumerate(ROWS, 1) if r.rn == RN("loop", "power-safe", persist="sync"))
    line = f"fsync floor (one SQLite FULL commit in WAL mode on the same disk, median of 200): {us(floor)}"
    if sync_row in engine_per_step:
        line += (f"; runner power-safe with `--persist sync` (row {sync_row}): "
                 f"{us(engine_per_step[sync_row])}/step, {ratio(engine_per_step[sync_row], floor)} the floor "
                 "(target <= 1.2x)")
    p(line + ".\n")

    errors = [(k, v.error) for d in (lg, rn) for k, v in d.items() if v.error]
    if errors:
        p("Errors:\n")
        for k, e in errors:
            p(f"- `{k}`: {e}")
        p("")
    p("runner command lines (per run, fresh `<tmp>`):\n")
    p("```")
    shown = set()
    for r in rows:
        for cfg in (r.rn, RN(r.rn.case, r.rn.mode, 1) if r.rn.case in ("loop", "append") else None):
            if cfg is None or cfg in shown:
                continue
            shown.add(cfg)
            cmd = runner_cmd(Path("target/release/runner"), cfg, Path("<tmp>/r.db"))
            p(" ".join(c.replace(str(ROOT) + "/", "") for c in cmd))
    p("```")
    print("\n".join(out))

    if args.json:
        dump = {
            "machine": mach,
            "fsync_floor_s": floor,
            "runner_version_s": version_s,
            "runner_note": runner_note,
            "langgraph": {str(k): {"samples": v.samples, "error": v.error} for k, v in lg.items()},
            "runner": {str(k): {"samples": v.samples, "error": v.error} for k, v in rn.items()},
        }
        Path(args.json).write_text(json.dumps(dump, indent=1))


if __name__ == "__main__":
    main()
