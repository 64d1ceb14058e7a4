"""The differential conformance suite: the same scenarios, through LangGraph's own Python and
JS clients, against the reference server (`langgraph dev`, serving reference/graphs.py) and
`runner serve` (serving the YAML twins in workflows/), and the answers compared.

    python run.py --runner PATH/TO/runner [--js [DIR]] [--flows] [--postgres URL] [--out DIR] [--only NAME ...]

Run with the venv that requirements.txt was installed into (tests/conformance.rs makes it).
--js also drives the scenarios through the JS client: DIR holds drive.mjs with
@langchain/langgraph-sdk installed beside it (`npm ci` in js/); bare --js means js/.
Without it only the Python client drives. --flows (with --js) also runs agent-chat-ui's
flows (js/flows.mjs, the SDK's React hook) against both servers, the reference allowed its
known failure; a failed flow fails the run. --postgres URL serves runner's side from
PostgreSQL (a schema per client) with its runs on two `runner worker`s apart from the API. Exits 1 when a difference is not among the deliberate ones in
differences.yaml, or a deliberate one no longer occurs.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ok(url: str, proc: subprocess.Popen, log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the server exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "/ok", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url}: no answer to /ok within {seconds} s:\n{log.read_text()[-4000:]}")


class Server:
    def __init__(self, name, cmd, cwd, env, out: Path):
        self.name = name
        self.log = out / f"{name}.log"
        self.port = int(cmd[cmd.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_ok(self.url, self.proc, self.log)

    def stop(self):
        for proc in [self.proc, *getattr(self, "workers", [])]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def start_reference(out: Path) -> Server:
    work = out / "reference"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(HERE / "reference", work)
    langgraph = Path(sys.executable).parent / "langgraph"
    env = dict(
        os.environ,
        CONFORMANCE_MOCK=str(HERE / "mock.yaml"),
        LANGGRAPH_CLI_NO_ANALYTICS="1",
        LANGGRAPH_NO_VERSION_CHECK="true",
        LANGSMITH_TRACING="false",
        LANGCHAIN_TRACING_V2="false",
    )
    cmd = [str(langgraph), "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(free_port()),
           "--n-jobs-per-worker", "10"]
    return Server("reference", cmd, work, env, out)


def start_runner(runner: str, out: Path, postgres: str | None = None) -> Server:
    """runner serve on a SQLite file; or, given a PostgreSQL URL, a server of the API only
    (`--workers 0`) and two `runner worker` processes beside it, so every run executes on
    another process than the one its client talks to."""
    db = out / "runner.db"
    for f in [*out.glob("runner.db*"), *out.glob("data.db*")]:
        f.unlink()
    common = [str(HERE / "workflows"), "--mock", str(HERE / "mock.yaml"), "--db", postgres or str(db),
              "--data-db", str(out / "data.db")]
    cmd = [runner, "serve", *common, "--port", str(free_port())]
    if postgres:
        cmd += ["--workers", "0"]
    env = dict(os.environ, RUNNER_LOG="runner=warn", RUNNER_NO_CACHE="1")
    server = Server("runner", cmd, out, env, out)
    server.workers = []
    if postgres:
        for i in range(2):
            with open(out / f"worker-{i}.log", "w") as log:
                server.workers.append(subprocess.Popen([runner, "worker", *common, "--workers", "16"], cwd=out, env=env,
                                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    return server


def schema_of(url: str, sdk: str) -> str:
    """`url` with a PostgreSQL schema of the client's own (its `schema=` with `_SDK` after it),
    so that each client's runner has a database apart, as each has a SQLite file apart."""
    base, sep, query = url.partition("?")
    params = [p for p in query.split("&") if p]
    named = [p for p in params if p.startswith("schema=")]
    params = [p for p in params if not p.startswith("schema=")]
    schema = (named[0].split("=", 1)[1] if named else "conformance") + f"_{sdk}"
    return base + "?" + "&".join(params + [f"schema={schema}"])


def drive(sdk: str, server: Server, scenarios: Path, out: Path, only, js_dir) -> subprocess.Popen:
    result = out / f"{sdk}-{server.name}.json"
    if sdk == "python":
        cmd = [sys.executable, str(HERE / "drive.py"), server.url, str(scenarios), str(result), *only]
    else:
        cmd = ["node", str(Path(js_dir) / "drive.mjs"), server.url, str(scenarios), str(result), *only]
    log = open(out / f"{sdk}-{server.name}.log", "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def run_flows(js_dir, servers, out: Path) -> bool:
    """agent-chat-ui's flows against each server, one after the other; True if one failed."""
    failed = False
    for s in servers:
        cmd = ["node", str(Path(js_dir) / "flows.mjs"), s.url, "--json", str(out / f"flows-{s.name}.json")]
        if s.name == "reference":
            cmd.append("--allow-known-reference-failure")
        with open(out / f"flows-{s.name}.log", "w") as log:
            code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
        summary = (out / f"flows-{s.name}.log").read_text().strip().splitlines()
        print(f"[flows] {s.name}: {summary[-1] if summary else '(no output)'}" + (f" (see {out / f'flows-{s.name}.log'})" if code else ""))
        failed |= code != 0
    return failed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True)
    ap.add_argument("--js", nargs="?", const=str(HERE / "js"),
                    help="a folder with drive.mjs and node_modules/@langchain/langgraph-sdk (default: js/ after `npm ci`)")
    ap.add_argument("--flows", action="store_true", help="also run agent-chat-ui's flows (flows.mjs, needs --js)")
    ap.add_argument("--out", default=str(HERE.parent.parent / "target" / "conformance"))
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--postgres", help="a PostgreSQL URL: runner serves the API only and two workers run the runs")
    args = ap.parse_args()
    if args.js:
        js = Path(args.js).resolve()
        if not (js / "drive.mjs").is_file():
            raise SystemExit(f"--js {js}: no drive.mjs there")
        if not (js / "node_modules" / "@langchain" / "langgraph-sdk").is_dir():
            raise SystemExit(f"--js {js}: @langchain/langgraph-sdk is not installed there; run `npm ci` in it")
        args.js = str(js)
    if args.flows and not args.js:
        raise SystemExit("--flows needs --js (the folder with flows.mjs and its npm ci)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scenarios = out / "scenarios.json"
    scenarios.write_text(json.dumps(yaml.safe_load((HERE / "scenarios.yaml").read_text())))
    sdks = ["python"] + (["js"] if args.js else [])
    started = time.monotonic()
    # Each client gets its own pair of servers, so that the clients drive at the same time
    # without one's threads showing in the other's searches.
    pairs = {}
    flows_failed = False
    try:
        for sdk in sdks:
            (out / sdk).mkdir(exist_ok=True)
            postgres = schema_of(args.postgres, sdk) if args.postgres else None
            pairs[sdk] = [start_reference(out / sdk), start_runner(args.runner, out / sdk, postgres)]
        print(f"servers up in {time.monotonic() - started:.1f} s", flush=True)
        procs = [(sdk, s, drive(sdk, s, scenarios, out, args.only, args.js)) for sdk in sdks for s in pairs[sdk]]
        for sdk, s, p in procs:
            if p.wait() != 0:
                print(f"the {sdk} driver against {s.name} failed:\n" + (out / f"{sdk}-{s.name}.log").read_text()[-4000:])
                return 1
        print(f"drivers done at {time.monotonic() - started:.1f} s", flush=True)
        if args.flows:
            # On PostgreSQL only runner's side changes: the reference's flows ran with SQLite's.
            flows_failed = run_flows(args.js, pairs["js"][1:] if args.postgres else pairs["js"], out)
            print(f"flows done at {time.monotonic() - started:.1f} s", flush=True)
    finally:
        for pair in pairs.values():
            for s in pair:
                s.stop()
    failed = flows_failed
    used = {}
    for sdk in sdks:
        report = out / f"{sdk}-report.json"
        code = subprocess.call([sys.executable, str(HERE / "compare.py"), str(out / f"{sdk}-reference.json"),
                                str(out / f"{sdk}-runner.json"), str(HERE / "differences.yaml"),
                                "--sdk", sdk, "--report", str(report)])
        failed |= code != 0
        for entry, n in json.loads(report.read_text())["used"].items():
            used[entry] = used.get(entry, 0) + n
    stale = [e for e, n in used.items() if n == 0]
    for e in stale:
        print(f"STALE deliberate difference `{e}`: it no longer occurs; remove it from differences.yaml")
    if args.only:
        stale = []
    print(f"conformance: {'FAILED' if failed or stale else 'passed'} in {time.monotonic() - started:.1f} s")
    return 1 if failed or stale else 0


if __name__ == "__main__":
    sys.exit(main())
