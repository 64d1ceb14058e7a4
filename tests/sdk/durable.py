"""Drives `runner serve`'s run controls with LangGraph's own Python client (langgraph-sdk, pinned
in requirements.txt). Run by tests/serve.rs:

- `python durable.py URL join THREAD:RUN...`: joins runs a killed server left and a restarted
  one resumed; each ends once, with the slow workflow's result;
- `python durable.py URL controls`: cancel with rollback, `multitask_strategy` interrupt and
  rollback, deleting runs, per-run `interrupt_before` / `interrupt_after`.

Exits non-zero with the failed assertion on any difference from what the SDK expects."""

import asyncio
import sys

import httpx

from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError, NotFoundError

URL = sys.argv[1]


async def join(client, pairs):
    last = {}
    for pair in pairs:
        tid, rid = pair.split(":")
        # `join` answers the thread's values when the run ends: a run queued behind it on the
        # same thread may have started by then, so only a thread's last run is checked by them.
        last[tid] = await client.runs.join(tid, rid)
        assert (await client.runs.get(tid, rid))["status"] == "success", pair
    assert all(values == {"said": "done"} for values in last.values()), last


async def until(check, what):
    for _ in range(200):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def said(client, tid):
    return (await client.threads.get_state(tid))["values"].get("said")


async def cancel_with_rollback(client):
    # A first run ends; a second (a new turn) is rolled back mid-way: the thread is as the
    # first left it, and the second run is gone.
    tid = (await client.threads.create())["thread_id"]
    assert await client.runs.wait(tid, "slow") == {"said": "done"}
    before = await client.threads.get_history(tid, limit=100)
    second = await client.runs.create(tid, "slow", input={})
    await until(lambda: said_is(client, tid, "half"), "the second run's first step")
    await client.runs.cancel(tid, second["run_id"], wait=True, action="rollback")
    try:
        await client.runs.get(tid, second["run_id"])
        raise AssertionError("a rolled-back run is deleted")
    except NotFoundError:
        pass
    after = await client.threads.get_history(tid, limit=100)
    assert [h["checkpoint_id"] for h in after] == [h["checkpoint_id"] for h in before], (before, after)
    assert (await client.threads.get_state(tid))["values"] == {"said": "done"}
    assert (await client.threads.get(tid))["status"] == "idle"


async def said_is(client, tid, value):
    return await said(client, tid) == value


async def multitask_interrupt(client):
    # A newer run with `interrupt` cancels the running one at once and continues the thread from
    # where it stopped; the cancelled run stays, `interrupted`, and can then be deleted.
    tid = (await client.threads.create())["thread_id"]
    first = await client.runs.create(tid, "slow")
    second = await client.runs.create(tid, "slow", multitask_strategy="interrupt")
    assert (await client.runs.get(tid, first["run_id"]))["status"] == "interrupted"
    try:
        await client.runs.delete(tid, second["run_id"])
        raise AssertionError("a running run cannot be deleted")
    except ConflictError:
        pass
    assert await client.runs.join(tid, second["run_id"]) == {"said": "done"}
    await client.runs.delete(tid, first["run_id"])
    assert [r["run_id"] for r in await client.runs.list(tid)] == [second["run_id"]]


async def multitask_rollback(client):
    # A newer run with `rollback` stops the running one and deletes it with everything it
    # wrote: the thread holds only the newer run's checkpoints.
    tid = (await client.threads.create())["thread_id"]
    first = await client.runs.create(tid, "slow")
    second = await client.runs.create(tid, "slow", multitask_strategy="rollback")
    assert await client.runs.join(tid, second["run_id"]) == {"said": "done"}
    assert [r["run_id"] for r in await client.runs.list(tid)] == [second["run_id"]], first
    steps = [h["metadata"]["step"] for h in await client.threads.get_history(tid, limit=100)]
    # One turn: its input (-1) and start (0) checkpoints, tick's (1), tock's (2).
    assert steps == [2, 1, 0, -1], steps


async def interrupt_points(client):
    # Per-run interrupt points (the slow workflow declares none): a run stops before (or after)
    # the nodes it names, or every node with "*"; the next run, without them, goes on.
    for points in ({"interrupt_before": ["tock"]}, {"interrupt_after": "*"}):
        tid = (await client.threads.create())["thread_id"]
        await client.runs.wait(tid, "slow", **points)
        state = await client.threads.get_state(tid)
        assert state["next"] == ["tock"] and state["values"] == {"said": "half"}, (points, state)
        assert await client.runs.wait(tid, "slow") == {"said": "done"}, points
    try:
        await client.runs.wait(None, "slow", interrupt_before=["nope"])
        raise AssertionError("an interrupt point that is no node is refused")
    # `runs.wait` raises httpx's error, not the SDK's own.
    except httpx.HTTPStatusError as e:
        assert e.response.status_code == 422, e


async def main():
    client = get_client(url=URL, api_key=None)
    if sys.argv[2] == "join":
        await join(client, sys.argv[3:])
    else:
        await asyncio.gather(
            cancel_with_rollback(client),
            multitask_interrupt(client),
            multitask_rollback(client),
            interrupt_points(client),
        )
    print("durable: every check passed")


asyncio.run(main())
