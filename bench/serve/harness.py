"""Serve benchmark and load test: `runner serve` against the reference server (`langgraph dev`)
on the same graph, both driven through the same client (langgraph-sdk). Run by
bench/serve/run.sh, which installs the packages and builds runner.

Benchmark (default): for each server, on bench/serve/graphs/three.yaml (three nodes of 1 ms
each) and its LangGraph twin bench/serve/reference/agent.py:
- time to first event: a run streamed (`values`, `updates`) on a fresh thread, from the request
  to its first event (`metadata`) and to its first state event, median of --samples;
- events/s per stream: a stream's events over its duration, request to end, median;
- runs/s at concurrency 1, 8 and 32: clients that each create a thread and stream a run to its
  end, again and again, for --seconds; each client is its own SDK client (its own connection
  pool), as separate users are: 32 tasks sharing one httpx pool spend the client's CPU in the
  pool's bookkeeping, which grows with the connections it holds; with --js, 32 more through
  LangGraph's JS client (bench/serve/throughput.mjs, one node process);
- resident memory (the server's process tree): idle after one run, and the peak while 200
  streams of three_slow (1 s steps) are open.
Load test (--load), runner only: 200 concurrent streamed runs of three_slow, every stream's
events compared with the expected sequence and the thread's stored history; then 200 more, the
server killed (SIGKILL) once every run has finished a step, restarted on the same database, and
every run joined: each must end once (`success`, one run on its thread, each node's write once
in the history and in the events the client saw before and after the restart).
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from langgraph_sdk import get_client

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "lib"))
from procs import tree  # noqa: E402

MODES = ["values", "updates"]
NODES = ["one", "two", "three"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_tree(pid):
    """Resident memory of `pid` and its descendants, in bytes."""
    total = 0
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def cpu_tree(pid):
    """CPU seconds `pid` and its descendants have used."""
    ticks = 0
    for p in tree(pid):
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(f[11]) + int(f[12])
        except (OSError, IndexError, ValueError):
            pass
    return ticks / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, name, cmd, cwd, url, log):
        self.name, self.url = name, url
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(f"{url}/ok", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"{name} did not start (see {log.name})")
            time.sleep(0.1)

    def rss(self):
        return rss_tree(self.proc.pid)

    def cpu(self):
        return cpu_tree(self.proc.pid)

    def kill9(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()


def start_runner(args, out, db):
    port = free_port()
    cmd = [args.runner, "serve", str(HERE / "graphs"), "--host", "127.0.0.1", "--port", str(port),
           "--db", str(db), "--mock", str(HERE / "mock.yaml")]
    log = open(out / "runner.log", "a")
    return Server("runner", cmd, out, f"http://127.0.0.1:{port}", log)


def start_langgraph(args, out):
    port = free_port()
    work = out / "reference"
    # `langgraph dev` keeps its threads, runs and store in .langgraph_api/ and loads them at
    # start: each measure starts it empty, as runner starts on a new database.
    shutil.rmtree(work / ".langgraph_api", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    for f in ("agent.py", "langgraph.json"):
        (work / f).write_text((HERE / "reference" / f).read_text())
    langgraph = os.path.join(os.path.dirname(os.path.abspath(args.python)), "langgraph")
    cmd = [langgraph, "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port), "--n-jobs-per-worker", str(args.jobs)]
    env_log = open(out / "langgraph.log", "a")
    os.environ.setdefault("LANGGRAPH_CLI_NO_ANALYTICS", "1")
    return Server("langgraph dev", cmd, work, f"http://127.0.0.1:{port}", env_log)


def clients(url, n, timeout=120):
    """`n` SDK clients, one per concurrent stream: a client's connection pool holds at most
    100 connections (httpx's default, which the SDK keeps), so streams past the 100th on one
    client would wait for an earlier one to end."""
    return [get_client(url=url, api_key=None, timeout=httpx.Timeout(timeout)) for _ in range(n)]


async def one_run(client, graph="three", **kw):
    """A run streamed on a fresh thread: (seconds to first event, to first state event, to the
    end, events)."""
    tid = (await client.threads.create())["thread_id"]
    t0 = time.perf_counter()
    first = first_state = None
    events = []
    async for part in client.runs.stream(tid, graph, input={}, stream_mode=MODES, **kw):
        now = time.perf_counter() - t0
        if first is None:
            first = now
        if first_state is None and part.event in MODES:
            first_state = now
        events.append(part)
    return first, first_state, time.perf_counter() - t0, events, tid


async def throughput(url, concurrency, seconds):
    done, errors = 0, 0
    end = time.perf_counter() + seconds

    async def worker():
        nonlocal done, errors
        client = get_client(url=url, api_key=None, timeout=httpx.Timeout(120))
        while time.perf_counter() < end:
            try:
                await one_run(client)
                done += 1
            except Exception:  # counted and reported: the rate is of runs that ended
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - t0), errors


async def open_streams(server, n, hold):
    """Peak resident memory while `n` streams of three_slow are open (sampled every 0.1 s for
    `hold` seconds once every stream has its first event, or after 30 s)."""
    started = 0

    async def stream(client):
        nonlocal started
        tid = (await client.threads.create())["thread_id"]
        seen = False
        async for _ in client.runs.stream(tid, "three_slow", input={}, stream_mode=MODES):
            if not seen:
                seen = True
                started += 1

    tasks = [asyncio.create_task(stream(c)) for c in clients(server.url, n)]
    deadline = time.perf_counter() + 30
    while started < n and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    peak, end = 0, time.perf_counter() + hold
    while time.perf_counter() < end:
        peak = max(peak, server.rss())
        await asyncio.sleep(0.1)
    opened = started
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return peak, opened


async def measure(server, args):
    client = get_client(url=server.url, api_key=None, timeout=httpx.Timeout(120))
    await one_run(client)
    await asyncio.sleep(1)
    r = {"rss_idle": server.rss()}
    samples = [await one_run(client) for _ in range(args.samples)]
    r["first_event"] = [s[0] for s in samples]
    r["first_state_event"] = [s[1] for s in samples]
    r["events_per_stream"] = [len(s[3]) for s in samples]
    r["events_per_s"] = [len(s[3]) / s[2] for s in samples]
    for c in (1, 8, 32):
        t0, server0, client0 = time.perf_counter(), server.cpu(), time.process_time()
        rate, errors = await throughput(server.url, c, args.seconds)
        wall = time.perf_counter() - t0
        r[f"runs_per_s_{c}"], r[f"errors_{c}"] = rate, errors
        # Shares of one core over the measure: who was busy.
        r[f"server_cpu_{c}"] = (server.cpu() - server0) / wall
        r[f"client_cpu_{c}"] = (time.process_time() - client0) / wall
    if args.js:
        # The same loops through LangGraph's JS client, one node process.
        c = 32
        t0, server0 = time.perf_counter(), server.cpu()
        node = await asyncio.create_subprocess_exec(
            "node", args.js, server.url, str(c), str(args.seconds), stdout=subprocess.PIPE)
        out, _ = await node.communicate()
        wall = time.perf_counter() - t0
        if node.returncode != 0:
            sys.exit(f"node {args.js} exited with {node.returncode} (its error is above)")
        js = json.loads(out)
        r[f"js_runs_per_s_{c}"], r[f"js_errors_{c}"] = js["runs_per_s"], js["errors"]
        r[f"js_server_cpu_{c}"], r[f"js_client_cpu_{c}"] = (server.cpu() - server0) / wall, js["client_cpu"]
    r["rss_200_streams"], r["streams_opened"] = await open_streams(server, 200, 2.0)
    return r


def med(xs):
    return statistics.median(xs)


def report(res, args):
    rn, lg = res.get("runner"), res.get("langgraph")
    rows = [
        ("time to first event (`metadata`), fresh thread", "first_event", "ms", min),
        ("time to first state event (`values`/`updates`)", "first_state_event", "ms", min),
        ("events/s per stream", "events_per_s", "rate", max),
    ]
    print("| measure | langgraph dev | runner serve | ratio |")
    print("|---|---:|---:|---:|")

    def fmt(v, unit):
        return {"ms": f"{v * 1000:,.1f} ms", "rate": f"{v:,.0f}", "mib": f"{v / 2**20:,.1f} MiB"}[unit]

    def ratio(a, b, better):
        if not a or not b:
            return "—"
        return f"{(a / b if better is min else b / a):,.1f}x"

    for label, key, unit, better in rows:
        a, b = med(lg[key]), med(rn[key])
        print(f"| {label}, median of {args.samples} | {fmt(a, unit)} | {fmt(b, unit)} | {ratio(a, b, better)} |")
    for c in (1, 8, 32):
        a, b = lg[f"runs_per_s_{c}"], rn[f"runs_per_s_{c}"]
        errs = f" ({lg[f'errors_{c}']}/{rn[f'errors_{c}']} errors)" if lg[f"errors_{c}"] or rn[f"errors_{c}"] else ""
        print(f"| runs/s, {c} client{'s' if c > 1 else ''} (thread + streamed run){errs} | {a:,.1f} | {b:,.1f} | {b / a:,.1f}x |")
    if "js_runs_per_s_32" in rn and "js_runs_per_s_32" in lg:
        a, b = lg["js_runs_per_s_32"], rn["js_runs_per_s_32"]
        errs = f" ({lg['js_errors_32']}/{rn['js_errors_32']} errors)" if lg["js_errors_32"] or rn["js_errors_32"] else ""
        print(f"| runs/s, 32 clients, JS SDK (one node process){errs} | {a:,.1f} | {b:,.1f} | {b / a:,.1f}x |")
    print(f"| resident memory, idle | {fmt(lg['rss_idle'], 'mib')} | {fmt(rn['rss_idle'], 'mib')} | {lg['rss_idle'] / rn['rss_idle']:,.1f}x less |")
    print(f"| resident memory, 200 open streams (peak) | {fmt(lg['rss_200_streams'], 'mib')} | {fmt(rn['rss_200_streams'], 'mib')} | {lg['rss_200_streams'] / rn['rss_200_streams']:,.1f}x less |")
    print()
    print("CPU while measuring runs/s, in cores (server / client):",
          ", ".join(f"{c} client{'s' if c > 1 else ''}: langgraph dev {lg[f'server_cpu_{c}']:.2f} / {lg[f'client_cpu_{c}']:.2f},"
                    f" runner {rn[f'server_cpu_{c}']:.2f} / {rn[f'client_cpu_{c}']:.2f}" for c in (1, 8, 32))
          + (f"; 32 clients, JS SDK: langgraph dev {lg['js_server_cpu_32']:.2f} / {lg['js_client_cpu_32']:.2f},"
             f" runner {rn['js_server_cpu_32']:.2f} / {rn['js_client_cpu_32']:.2f}" if "js_runs_per_s_32" in rn and "js_runs_per_s_32" in lg else "")
          + ".")
    print()
    print(f"Events per stream: langgraph dev {med(lg['events_per_stream'])}, runner {med(rn['events_per_stream'])}"
          f" (runner also sends the input's `values`). Streams that had their first event when memory"
          f" was sampled: langgraph dev {lg['streams_opened']}/200, runner {rn['streams_opened']}/200.")


def expected_ok(events):
    """The problems of one run's events against the expected sequence, none if right."""
    names = [e.event for e in events]
    want = ["metadata", "values"] + ["updates", "values"] * 3
    problems = []
    if names != want:
        problems.append(f"events {names}")
    ups = [e.data for e in events if e.event == "updates"]
    if ups != [{n: {k: n}} for n, k in zip(NODES, "abc")]:
        problems.append(f"updates {ups}")
    ids = [e.id for e in events]
    if len(set(ids)) != len(ids):
        problems.append(f"duplicate ids {ids}")
    return problems


async def history_ok(client, tid, values_seen):
    """The problems of a thread's stored history against the values a client saw."""
    h = await client.threads.get_history(tid, limit=100)
    stored = [x["values"] for x in reversed(h)]
    steps = [x["metadata"]["step"] for x in reversed(h)]
    problems = []
    if steps != list(range(-1, len(steps) - 1)):
        problems.append(f"steps {steps}")
    if stored != values_seen:
        problems.append(f"history {stored} != streamed {values_seen}")
    return problems


async def load(args, out):
    n = args.load_runs
    db = out / "load.db"
    for f in out.glob("load.db*"):
        f.unlink()
    result = {}
    server = start_runner(args, out, db)
    client = get_client(url=server.url, api_key=None, timeout=httpx.Timeout(300))

    # 1. n concurrent streamed runs: every event there once, in order, as stored.
    t0 = time.perf_counter()
    outcomes = await asyncio.gather(
        *(one_run(c, "three_slow", stream_resumable=True) for c in clients(server.url, n, 300)),
        return_exceptions=True)
    wall = time.perf_counter() - t0
    errors = [repr(o) for o in outcomes if isinstance(o, BaseException)]
    ok = [o for o in outcomes if not isinstance(o, BaseException)]
    bad = {}
    for first, _, _, events, tid in ok:
        p = expected_ok(events) + await history_ok(client, tid, [e.data for e in events if e.event == "values"])
        if p:
            bad[tid] = p
    result["streams"] = {"runs": n, "errors": len(errors), "wrong": len(bad),
                         "events": sum(len(o[3]) for o in ok), "seconds": wall,
                         "first_event_max_ms": max((o[0] for o in ok), default=0) * 1000,
                         "rss_after": server.rss()}
    if errors or bad:
        result["streams"]["detail"] = errors[:5] + [f"{k}: {v}" for k, v in list(bad.items())[:5]]

    # 2. n more, the server killed under them once each has finished a step, and restarted.
    seen = {}

    async def until_killed(client):
        tid = (await client.threads.create())["thread_id"]
        seen[tid] = []
        try:
            async for part in client.runs.stream(tid, "three_slow", input={}, stream_mode=MODES,
                                                 stream_resumable=True, on_disconnect="continue"):
                seen[tid].append(part)
        except Exception:  # the server was killed: what was seen stays in `seen`
            pass

    tasks = [asyncio.create_task(until_killed(c)) for c in clients(server.url, n, 300)]
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline and (
            len(seen) < n or not all(any(e.event == "updates" for e in v) for v in seen.values())):
        await asyncio.sleep(0.02)
    server.kill9()
    killed_at = {tid: [e.event for e in v] for tid, v in seen.items()}
    await asyncio.gather(*tasks)
    t0 = time.perf_counter()
    server = start_runner(args, out, db)
    client = get_client(url=server.url, api_key=None, timeout=httpx.Timeout(300))
    started = time.perf_counter() - t0

    async def rejoin(tid, client):
        before = seen[tid]
        run_id = before[0].data["run_id"]
        after = []
        async for part in client.runs.join_stream(tid, run_id, last_event_id=before[-1].id):
            after.append(part)
        final = await client.runs.join(tid, run_id)
        runs = await client.runs.list(tid)
        problems = []
        if [r["status"] for r in runs] != ["success"]:
            problems.append(f"runs {[(r['run_id'], r['status']) for r in runs]}")
        if final != {"a": "one", "b": "two", "c": "three"}:
            problems.append(f"joined {final}")
        events = before + after
        ups = [next(iter(e.data)) for e in events if e.event == "updates"]
        if ups != NODES:
            problems.append(f"node updates seen {ups}")
        ids = [e.id for e in events if e.id is not None]
        if len(set(ids)) != len(ids):
            problems.append(f"duplicate ids {ids}")
        h = await client.threads.get_history(tid, limit=100)
        steps = sorted(x["metadata"]["step"] for x in h)
        if steps != [-1, 0, 1, 2]:
            problems.append(f"history steps {steps}")
        return tid, problems, len(after)

    t0 = time.perf_counter()
    joined = await asyncio.gather(*(rejoin(t, c) for t, c in zip(seen, clients(server.url, len(seen), 300))),
                                  return_exceptions=True)
    jerr = [repr(j) for j in joined if isinstance(j, BaseException)]
    jbad = {j[0]: j[1] for j in joined if not isinstance(j, BaseException) and j[1]}
    result["kill9"] = {"runs": n, "steps_done_at_kill": sorted(
        {k.count("updates") for k in killed_at.values()}),
        "restart_seconds": started, "join_seconds": time.perf_counter() - t0,
        "errors": len(jerr), "wrong": len(jbad),
        "ended_once": n - len(jerr) - len(jbad),
        "events_after_restart": sum(j[2] for j in joined if not isinstance(j, BaseException))}
    if jerr or jbad:
        result["kill9"]["detail"] = jerr[:5] + [f"{k}: {v}" for k, v in list(jbad.items())[:5]]
    server.stop()
    (out / "load.json").write_text(json.dumps(result, indent=1))
    s, k = result["streams"], result["kill9"]
    print("| load test (runner serve, mock provider, 1 s per step) | result |")
    print("|---|---|")
    print(f"| {n} concurrent streamed runs (3 steps, 8 events each) | {s['events']:,} events in "
          f"{s['seconds']:.1f} s; {s['wrong']} runs with lost, duplicated or reordered events or a "
          f"history that differs; {s['errors']} errors; first event at most {s['first_event_max_ms']:.0f} ms |")
    print(f"| kill -9 under {n} running streams (steps done at the kill: {k['steps_done_at_kill']}), "
          f"restart on the same database | up again in {k['restart_seconds']:.2f} s; {k['ended_once']}/{n} "
          f"runs ended exactly once (`success`, one run on the thread, each node's update once in "
          f"what the client saw, history steps -1..2); {k['errors']} errors; all joined in "
          f"{k['join_seconds']:.1f} s |")
    for d in s.get("detail", []) + k.get("detail", []):
        print(f"- {d}")
    return not (errors or bad or jerr or jbad)


async def bench(args, out):
    res = {}
    if not args.skip_langgraph:
        server = start_langgraph(args, out)
        try:
            res["langgraph"] = await measure(server, args)
        finally:
            server.stop()
    for f in out.glob("bench.db*"):
        f.unlink()
    server = start_runner(args, out, out / "bench.db")
    try:
        res["runner"] = await measure(server, args)
    finally:
        server.stop()
    (out / "results.json").write_text(json.dumps(res, indent=1))
    if "langgraph" in res:
        report(res, args)
    else:
        print(json.dumps({k: (med(v) if isinstance(v, list) else v) for k, v in res["runner"].items()}, indent=1))
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--jobs", type=int, default=10, help="langgraph dev --n-jobs-per-worker")
    ap.add_argument("--load", action="store_true")
    ap.add_argument("--load-runs", type=int, default=200)
    ap.add_argument("--skip-langgraph", action="store_true")
    ap.add_argument("--js", help="bench/serve/throughput.mjs where @langchain/langgraph-sdk is installed: also runs/s through the JS SDK")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ok = asyncio.run(load(args, out) if args.load else bench(args, out))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
