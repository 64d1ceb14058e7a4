"""Runs the conformance scenarios against one server through LangGraph's Python client
(langgraph-sdk), recording what every call returned: a stream's events, a thread's state, a
run, or the error the server answered.

    python drive.py URL SCENARIOS.json OUT.json [SCENARIO ...]

SCENARIOS.json is scenarios.yaml as JSON (run.py writes it). The JS driver (drive.mjs) reads
the same file and records the same shapes, so one comparison (compare.py) reads both.
"""

import asyncio
import json
import sys
import time
import traceback

import httpx
from langgraph_sdk import get_client


# Arguments the Python SDK takes by position only, in order.
POSITIONAL = {
    "store.put_item": ("namespace",),
    "store.get_item": ("namespace",),
    "store.delete_item": ("namespace",),
    "store.search_items": ("namespace_prefix",),
}


class Failed(Exception):
    """A step that could not be carried out at all (not an error answer, which is recorded)."""


def resolve(value, saved):
    """`$name.path` strings are replaced by what the step named `name` returned."""
    if isinstance(value, str) and value.startswith("$") and not value.startswith("$$"):
        name, *path = value[1:].split(".")
        if name not in saved:
            raise Failed(f"{value}: no step saved `{name}`")
        at = saved[name]
        for part in path:
            if isinstance(at, list):
                at = at[int(part)]
            elif isinstance(at, dict) and part in at:
                at = at[part]
            else:
                raise Failed(f"{value}: `{part}` is not in {json.dumps(at)[:300]}")
        return at
    if isinstance(value, str) and value.startswith("$$"):
        return value[1:]
    if isinstance(value, list):
        return [resolve(v, saved) for v in value]
    if isinstance(value, dict):
        return {resolve(k, saved): resolve(v, saved) for k, v in value.items()}
    return value


def error_record(e: httpx.HTTPStatusError) -> dict:
    """The status and the body (parsed as JSON when it is JSON) of an error answer."""
    body = getattr(e, "body", None)
    if body is None:
        try:
            body = e.response.json()
        except ValueError:
            body = e.response.text or None
    return {"status": e.response.status_code, "body": body}


class Scenario:
    def __init__(self, client, spec):
        self.client = client
        self.spec = spec
        self.saved = {}
        self.background = {}
        self.records = []

    async def run(self):
        for i, step in enumerate(self.spec["steps"]):
            if "background" in step:
                self.background[step["background"]] = (i, asyncio.create_task(self.call(step)))
                continue
            if step["op"] == "await":
                index, task = self.background.pop(step["name"])
                self.keep(index, self.spec["steps"][index], await task)
                continue
            self.keep(i, step, await self.call(step))
        for name, (index, task) in self.background.items():
            self.keep(index, self.spec["steps"][index], await task)
        return self.records

    def keep(self, index, step, outcome):
        result, record = outcome
        if "save" in step:
            self.saved[step["save"]] = result
        if step.get("record", True) and record is not None:
            self.records.append({"step": index, "op": step["op"], **record})

    async def call(self, step):
        """The step's result (what `save` keeps) and what is recorded of it."""
        op = step["op"]
        args = resolve(step.get("args", {}), self.saved)
        try:
            if op == "sleep":
                await asyncio.sleep(step["seconds"])
                return None, None
            if op == "wait_status":
                return await self.wait_status(args, step)
            if op in ("runs.stream", "runs.join_stream"):
                return await self.stream(op, args, step)
            group, name = op.split(".")
            # The store's namespace (or prefix) is positional-only in the Python SDK.
            positional = [args.pop(k) for k in POSITIONAL.get(op, ()) if k in args]
            result = await getattr(getattr(self.client, group), name)(*positional, **args)
            return result, {"result": result}
        except httpx.HTTPStatusError as e:
            return None, {"error": error_record(e)}

    async def stream(self, op, args, step):
        created = []
        if op == "runs.stream":
            args["on_run_created"] = created.append
            parts = self.client.runs.stream(**args)
        else:
            parts = self.client.runs.join_stream(**args)
        events = []
        stop_after = step.get("stop_after")
        async for part in parts:
            event = {"event": part.event, "data": part.data}
            if part.id is not None:
                event["id"] = part.id
            events.append(event)
            if stop_after is not None and len(events) >= stop_after:
                await parts.aclose()
                break
        result = {"events": events, "run": created[0] if created else None}
        return result, {"result": events}

    async def wait_status(self, args, step):
        """Polls a run (the thread's newest, without `run_id`) until its status is one of
        `statuses`."""
        deadline = time.monotonic() + step.get("timeout", 30)
        while True:
            if "run_id" in args:
                run = await self.client.runs.get(args["thread_id"], args["run_id"])
            else:
                runs = await self.client.runs.list(args["thread_id"])
                run = runs[0] if runs else {"status": "none", "run_id": None}
            if run["status"] in step["statuses"]:
                return run, {"result": run["status"]}
            if time.monotonic() > deadline:
                raise Failed(f"run {run['run_id']} stayed {run['status']}, not {step['statuses']}")
            await asyncio.sleep(0.05)


async def main():
    url, scenarios_file, out_file, *only = sys.argv[1:]
    with open(scenarios_file) as f:
        scenarios = json.load(f)
    client = get_client(url=url, api_key=None, timeout=httpx.Timeout(60.0))
    out = {}
    for spec in scenarios:
        if only and spec["name"] not in only:
            continue
        if "python" not in spec.get("sdks", ["python", "js"]):
            continue
        try:
            out[spec["name"]] = await asyncio.wait_for(Scenario(client, spec).run(), spec.get("timeout", 60))
        except Exception as e:  # noqa: BLE001 - a scenario that breaks is reported, the others go on
            out[spec["name"]] = {"failed": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    await client.aclose()
    with open(out_file, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


asyncio.run(main())
