"""Helpers of scripts/symbol-order.sh.

  symbol_order.py serve RUNNER OUT CALLGRIND...   serve bench/serve/graphs under callgrind, drive it
  symbol_order.py order RUNNER CG...              the functions the profiles executed, in order
"""

import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "serve"))


async def drive(url):
    """The calls the serve benchmark makes, and the rest of a served app's common ones."""
    import httpx
    from langgraph_sdk import get_client

    c = get_client(url=url, api_key=None, timeout=httpx.Timeout(600))
    modes = [["values", "updates"], ["messages-tuple"], ["messages"],
             ["custom", "tasks", "checkpoints"], ["debug"]]
    for m in modes:
        t = await c.threads.create()
        async for _ in c.runs.stream(t["thread_id"], "three", input={}, stream_mode=m):
            pass
    t = await c.threads.create(metadata={"k": "v"})
    await c.runs.wait(t["thread_id"], "three", input={})
    await c.threads.get_state(t["thread_id"])
    await c.threads.get_history(t["thread_id"])
    await c.threads.search(metadata={"k": "v"})
    await c.assistants.search()
    r = await c.runs.create(t["thread_id"], "three", input={})
    await c.runs.join(t["thread_id"], r["run_id"])
    await c.runs.list(t["thread_id"])
    async for _ in c.runs.stream(None, "three", input={}, stream_mode="values"):
        pass
    await c.store.put_item(["a"], "k", {"x": 1})
    await c.store.search_items(["a"], query="x")

    async def one():
        t = await c.threads.create()
        async for _ in c.runs.stream(t["thread_id"], "three", input={}, stream_mode=["values", "updates"]):
            pass

    await asyncio.gather(*(one() for _ in range(20)))


def serve(runner, out, callgrind):
    import harness  # bench/serve's: starts a server and waits for its /ok

    port = harness.free_port()
    with tempfile.TemporaryDirectory() as work:
        cmd = [*callgrind, f"--callgrind-out-file={out}", runner, "serve", str(ROOT / "bench/serve/graphs"),
               "--port", str(port), "--db", f"{work}/r.db", "--data-db", f"{work}/d.db",
               "--mock", str(ROOT / "bench/serve/mock.yaml")]
        with open(Path(work) / "serve.log", "w") as log:
            server = harness.Server("runner serve under callgrind", cmd, work, f"http://127.0.0.1:{port}", log)
            try:
                asyncio.run(drive(server.url))
            finally:
                server.stop()  # SIGTERM: callgrind writes its profile as runner exits


def functions(path, obj):
    """Names of `obj`'s functions a callgrind output records, as they first appear (callers and
    callees alike; a recursion's `'N` suffix dropped)."""
    names, ob, cob = {}, None, None
    for line in open(path, errors="replace"):
        key, _, value = line.partition("=")
        value = value.strip()
        if key == "ob":
            ob = value
        elif key == "cob":
            cob = value
        elif key in ("fn", "cfn"):
            o = (cob or ob) if key == "cfn" else ob
            cob = None
            if o == obj:
                names.setdefault(re.sub(r"'\d+$", "", value), None)
    return names


def order(runner, profiles):
    nm = subprocess.run(["nm", "--defined-only", runner], capture_output=True, text=True, check=True)
    code = {p[2] for p in (l.split() for l in nm.stdout.splitlines()) if len(p) == 3 and p[1] in "tTwW"}
    seen = {}
    for p in profiles:
        for name in functions(p, runner):
            if name in code:
                seen.setdefault(name, None)
    sys.stdout.write("".join(f"{n}\n" for n in seen))


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1] == "order":
        order(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
