"""Scale-out benchmark (bench/scale/run.sh starts the PostgreSQL server and builds the binaries).

Every measurement is on a schema of its own (an empty store) of the one server, with processes
started for it and stopped after it:

- **latency**: one `runner serve --workers 0` (the API only) and one `runner worker`; the load
  generator runs graph `three` (three mock model calls of 1 ms) one run after another: from
  `POST /threads/{id}/runs/stream` leaving the client to the stream's `metadata` event (the API
  server's own), to its first `values` event (the run's first event: queued by the API server,
  claimed and executed by the worker, logged, read back by the API server, sent) and to the end.
- **throughput**: the same with 1, 2, 4 workers: `CLIENTS` loops of create a thread + `runs/wait`
  for `SECONDS`; runs/s, and who used the CPU meanwhile (the API server, the workers,
  PostgreSQL's processes, the load generator, and whatever else ran on the machine: the
  difference from /proc/stat's total), and PostgreSQL's statements by total time
  (pg_stat_statements, reset before each run).
- **failover**: worker A executes `RUNS` streamed runs of graph `ticks` (about 20 s each); once
  each has sent an event, worker B starts, then A is killed (SIGKILL); for each run, the time from
  the kill to its first event from B, against the lease's time to live + 1 s, and whether it ended
  with its whole output.

With `--rtt-ms X`, the runner processes reach PostgreSQL through a relay (the load generator's
`relay` mode) that holds every chunk X/2 ms each way: a database a network away, as a managed
one in another zone is, where each round trip a run makes costs X ms more.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "lib"))
from procs import tree  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def cpu(pids):
    """CPU seconds the processes (and their descendants) have used."""
    ticks = 0
    for root in pids:
        for p in tree(root):
            try:
                f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(f[11]) + int(f[12])
            except (OSError, IndexError, ValueError):
                pass
    return ticks / CLK


def machine_cpu():
    """CPU seconds the whole machine has used (every core, not idle)."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) / CLK


class Proc:
    def __init__(self, name, cmd, out):
        self.name = name
        self.log = open(out / f"{name}.log", "a")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.path = out / f"{name}.log"

    def wait_log(self, text, timeout=60):
        deadline = time.time() + timeout
        while text not in self.path.read_text(errors="replace"):
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"{self.name} did not start (see {self.path})")
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Bench:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.schemas = 0
        # The runner processes' way to PostgreSQL: direct, or through a delaying relay.
        self.db_port = args.port
        self.relay = None
        if args.rtt_ms:
            with __import__("socket").socket() as s:
                s.bind(("127.0.0.1", 0))
                self.db_port = s.getsockname()[1]
            self.relay = subprocess.Popen([args.load, "relay", str(self.db_port), str(args.port),
                                           str(int(args.rtt_ms * 500))], start_new_session=True)
            time.sleep(0.3)

    def psql(self, sql):
        rows = subprocess.run(
            [self.args.psql, "-h", "127.0.0.1", "-p", str(self.args.port), "-U", "postgres", "-d", "postgres",
             "-AtX", "-F", "\t", "-c", sql],
            check=True, capture_output=True, text=True).stdout
        return [r.split("\t") for r in rows.splitlines() if r]

    def postmaster(self):
        return int((self.out / "data" / "postmaster.pid").read_text().split()[0])

    def url(self):
        self.schemas += 1
        return f"postgres://postgres@127.0.0.1:{self.db_port}/postgres?schema=s{self.schemas}&sslmode=disable"

    def api(self, db, name="api"):
        with __import__("socket").socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = Proc(name, [self.args.runner, "serve", str(HERE / "graphs"), "--host", "127.0.0.1", "--port", str(port),
                        "--db", db, "--workers", "0"], self.out)
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/ok", timeout=1).status == 200:
                    break
            except OSError:
                pass
            if p.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the API server did not start (see {p.path})")
            time.sleep(0.05)
        return p, url

    def worker(self, db, name, ttl=None):
        cmd = [self.args.runner, "worker", str(HERE / "graphs"), "--db", db, "--mock", str(HERE / "mock.yaml"),
               "--workers", "256"]
        if ttl:
            cmd += ["--lease-ttl", str(ttl)]
        p = Proc(name, cmd, self.out)
        p.wait_log("working:")
        return p

    def load(self, *argv):
        p = subprocess.run([self.args.load, *map(str, argv)], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"the load generator failed: {p.stderr.strip()}")
        return json.loads(p.stdout.strip().splitlines()[-1])

    def cluster(self, n):
        """An API server and `n` workers on a new schema."""
        db = self.url()
        api, url = self.api(db)
        workers = [self.worker(db, f"worker{i}") for i in range(n)]
        return db, api, url, workers

    def latency_and_throughput(self, res):
        stats = self.has_statements()
        for n in self.args.workers:
            db, api, url, workers = self.cluster(n)
            try:
                if "latency" in self.args.only:
                    res.setdefault("latency", {})[n] = self.load("latency", url, "three", self.args.samples)
                    log(f"latency, {n} workers: {res['latency'][n]}")
                if "throughput" in self.args.only:
                    if stats:
                        self.psql("SELECT pg_stat_statements_reset()")
                    pg = self.postmaster()
                    before = (cpu([api.proc.pid]), cpu([w.proc.pid for w in workers]), cpu([pg]), machine_cpu())
                    started = time.monotonic()
                    lg = subprocess.Popen([self.args.load, "throughput", url, "three", str(self.args.clients),
                                           str(self.args.seconds)], stdout=subprocess.PIPE, text=True)
                    _, status, usage = os.wait4(lg.pid, 0)
                    wall = time.monotonic() - started
                    after = (cpu([api.proc.pid]), cpu([w.proc.pid for w in workers]), cpu([pg]), machine_cpu())
                    if status != 0:
                        raise SystemExit("the load generator failed")
                    r = json.loads(lg.stdout.read().strip().splitlines()[-1])
                    used = [a - b for a, b in zip(after, before)]
                    loadgen = usage.ru_utime + usage.ru_stime
                    r["cpu_s"] = {"api": used[0], "workers": used[1], "postgres": used[2], "load": loadgen,
                                  "machine": used[3], "others": used[3] - used[0] - used[1] - used[2] - loadgen}
                    r["wall_s"] = wall
                    if stats:
                        r["statements"] = self.statements(r["runs"])
                    res.setdefault("throughput", {})[n] = r
                    log(f"throughput, {n} workers: {r['runs_per_s']:.0f} runs/s")
            finally:
                for p in [api, *workers]:
                    p.stop()

    def has_statements(self):
        try:
            self.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self.psql("SELECT 1 FROM pg_stat_statements LIMIT 1")
            return True
        except subprocess.CalledProcessError:
            return False

    def statements(self, runs):
        rows = self.psql(
            "SELECT calls, total_exec_time, regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'postgres') "
            "ORDER BY total_exec_time DESC LIMIT 12")
        total = self.psql(
            "SELECT sum(calls), sum(total_exec_time) FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'postgres')")[0]
        return {
            "calls_per_run": float(total[0] or 0) / max(runs, 1),
            "exec_ms": float(total[1] or 0),
            "top": [{"calls_per_run": int(c) / max(runs, 1), "total_ms": float(t), "mean_us": float(t) * 1000 / max(int(c), 1),
                     "query": q[:110]} for c, t, q in rows],
        }

    def failover(self, res):
        for ttl in self.args.ttls:
            db = self.url()
            api, url = self.api(db)
            a = self.worker(db, f"failover-a-ttl{ttl}", ttl)
            b = None
            try:
                lg = subprocess.Popen([self.args.load, "failover", url, "ticks", str(self.args.runs)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                ready = json.loads(lg.stdout.readline())
                assert ready.get("ready"), ready
                b = self.worker(db, f"failover-b-ttl{ttl}", ttl)
                time.sleep(0.5)
                lg.stdin.write(f"{a.proc.pid}\n")
                lg.stdin.flush()
                out, _ = lg.communicate(timeout=600)
                if lg.returncode != 0:
                    raise SystemExit("the load generator failed")
                r = json.loads(out.strip().splitlines()[-1])
                iterations = 200
                r["whole"] = sum(1 for v in r.pop("last_values") if v and json.loads(v).get("rounds") == iterations)
                r["ttl_s"] = ttl
                res.setdefault("failover", {})[ttl] = r
                log(f"failover, lease ttl {ttl} s: {r}")
            finally:
                for p in [api, a, b]:
                    if p:
                        p.stop()


def log(text):
    print(text, file=sys.stderr, flush=True)


def report(res, args):
    lines = []
    if "latency" in res:
        away = f"; PostgreSQL {args.rtt_ms} ms of round trip away" if args.rtt_ms else ""
        lines += ["", "Enqueue to first event on another process (API server and workers apart; ms; "
                  f"{args.samples} runs one after another{away}):", "",
                  "| workers | `metadata` p50 | first `values` event p50 | p90 | p99 | run's end p50 |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for n, r in res["latency"].items():
            m, f, e = r["metadata_ms"], r["first_event_ms"], r["end_ms"]
            lines.append(f"| {n} | {m['p50']:.2f} | {f['p50']:.2f} | {f['p90']:.2f} | {f['p99']:.2f} | {e['p50']:.2f} |")
    if "throughput" in res:
        lines += ["", f"Runs/s, {args.clients} clients creating a thread and waiting for a run, {args.seconds} s; CPU "
                  "as a share of the machine's 2 cores over the measurement:", "",
                  "| workers | runs/s | run p50 | run p99 | API server | workers | PostgreSQL | load generator | "
                  "other processes | idle |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        cores = os.cpu_count() or 2
        for n, r in res["throughput"].items():
            c, wall = r["cpu_s"], r["wall_s"]
            share = lambda s: f"{100 * s / (wall * cores):.0f}%"
            idle = wall * cores - c["machine"]
            lines.append(f"| {n} | {r['runs_per_s']:.0f} | {r['run_ms']['p50']:.1f} ms | {r['run_ms']['p99']:.1f} ms | "
                         f"{share(c['api'])} | {share(c['workers'])} | {share(c['postgres'])} | {share(c['load'])} | "
                         f"{share(c['others'])} | {share(idle)} |")
        last = list(res["throughput"].values())[-1]
        if "statements" in last:
            s = last["statements"]
            lines += ["", f"PostgreSQL's statements with {list(res['throughput'])[-1]} workers: "
                      f"{s['calls_per_run']:.1f} a run, {s['exec_ms'] / max(last['runs'], 1) * 1000:.0f} µs of "
                      "execution a run; the heaviest:", "",
                      "| calls a run | mean | total | statement |", "|---:|---:|---:|---|"]
            for t in s["top"]:
                q = t["query"].replace("|", "\\|")
                lines.append(f"| {t['calls_per_run']:.2f} | {t['mean_us']:.0f} µs | {t['total_ms']:.0f} ms | `{q}` |")
    if "failover" in res:
        lines += ["", f"Failover: {args.runs} runs on worker A, worker B started, A killed (SIGKILL):", "",
                  "| lease TTL | runs resumed on B | kill → first event from B, p50 | max | target (TTL + 1 s) | ended whole |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for ttl, r in res["failover"].items():
            k = r["kill_to_resume_ms"] or {"p50": float("nan"), "max": float("nan")}
            lines.append(f"| {ttl} s | {r['resumed']}/{r['runs']} | {k['p50'] / 1000:.2f} s | {k['max'] / 1000:.2f} s | "
                         f"{ttl + 1} s | {r['whole']}/{r['runs']} |")
    print("\n".join(lines))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True)
    ap.add_argument("--load", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--psql", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--ttls", default="3,10")
    ap.add_argument("--only", default="latency,throughput,failover")
    ap.add_argument("--rtt-ms", type=float, default=0.0)
    args = ap.parse_args()
    args.workers = [int(x) for x in args.workers.split(",")]
    args.ttls = [int(x) for x in args.ttls.split(",")]
    args.only = set(args.only.split(","))
    bench = Bench(args)
    res = {}
    try:
        if args.only & {"latency", "throughput"}:
            bench.latency_and_throughput(res)
        if "failover" in args.only:
            bench.failover(res)
    finally:
        if bench.relay:
            bench.relay.kill()
    (Path(args.out) / "results.json").write_text(json.dumps(res, indent=1))
    report(res, args)


if __name__ == "__main__":
    main()
