"""Drives `runner serve` with LangGraph's own Python client (langgraph-sdk, pinned in
requirements.txt), as an application would. Run by tests/serve.rs: `python drive.py URL`.
Exits non-zero with the failed assertion on any difference from what the SDK expects."""

import asyncio
import sys
import uuid

from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError

URL = sys.argv[1]


async def main():
    client = get_client(url=URL, api_key=None)

    # Assistants: one per workflow file, with LangGraph's system assistant id.
    found = await client.assistants.search(graph_id="gate")
    assert [a["graph_id"] for a in found] == ["gate"], found
    expected = str(uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), "gate"))
    assert found[0]["assistant_id"] == expected, found
    assert (await client.assistants.get(expected))["graph_id"] == "gate"

    # A thread, and a run streamed in three modes that stops at the gate.
    thread = await client.threads.create(metadata={"who": "sdk"})
    tid = thread["thread_id"]
    created = []
    parts = []
    async for part in client.runs.stream(
        tid,
        "gate",
        input={"topic": "tides"},
        stream_mode=["values", "updates", "custom"],
        on_run_created=created.append,
    ):
        parts.append(part)
    events = [p.event for p in parts]
    assert events[0] == "metadata", events
    assert created and created[0]["thread_id"] == tid, created
    assert created[0]["run_id"] == parts[0].data["run_id"], (created, parts[0])
    updates = [p.data for p in parts if p.event == "updates"]
    assert {"write": {"draft": "first draft", "log": ["write"]}} in updates, updates
    assert any("__interrupt__" in u for u in updates), updates
    last_values = [p.data for p in parts if p.event == "values"][-1]
    assert last_values["draft"] == "first draft", last_values
    assert last_values["__interrupt__"][0]["id"], last_values

    # The state waits at the gate; the thread is interrupted and carries the graph.
    state = await client.threads.get_state(tid)
    assert state["next"] == ["review"], state["next"]
    assert state["interrupts"] and state["tasks"][0]["interrupts"], state
    thread = await client.threads.get(tid)
    assert thread["status"] == "interrupted", thread
    assert thread["metadata"]["graph_id"] == "gate" and thread["metadata"]["who"] == "sdk", thread

    # Resume the interrupt: the gate's node runs with the answer, and the run ends.
    resumed = []
    async for part in client.runs.stream(
        tid, "gate", command={"resume": {"action": "accept"}}, stream_mode="updates"
    ):
        resumed.append(part)
    assert any(p.event == "updates" and "review" in p.data for p in resumed), resumed
    state = await client.threads.get_state(tid)
    assert state["next"] == [] and state["values"]["log"] == ["write", "accept"], state
    assert (await client.threads.get(tid))["status"] == "idle"

    # History: newest first, each checkpoint's parent the next one.
    history = await client.threads.get_history(tid, limit=10)
    steps = [h["metadata"]["step"] for h in history]
    assert steps == sorted(steps, reverse=True) and steps[-1] == -1, steps
    for newer, older in zip(history, history[1:]):
        assert newer["parent_checkpoint"]["checkpoint_id"] == older["checkpoint"]["checkpoint_id"]
    assert history[-1]["parent_checkpoint"] is None

    # Search by the metadata a run stamps.
    listed = await client.threads.search(metadata={"graph_id": "gate"}, limit=100)
    assert tid in [t["thread_id"] for t in listed], listed
    assert await client.threads.search(metadata={"who": "nobody"}) == []

    # Stateless runs: waited for, and streamed with an emit node's custom event: its data as
    # the workflow emitted it, as `get_stream_writer()(data)` sends it on the reference.
    assert await client.runs.wait(None, "shout", input={"word": "hello"}) == {"said": "hello there"}
    parts = [
        p
        async for p in client.runs.stream(
            None, "shout", input={"word": "hello"}, stream_mode=["custom", "messages-tuple"]
        )
    ]
    customs = [p.data for p in parts if p.event == "custom"]
    assert customs == [{"text": "hello there"}], customs
    # The model's tokens as LangChain message chunks sharing one id, the last one marked.
    messages = [p.data for p in parts if p.event == "messages"]
    assert "".join(chunk["content"] for chunk, _ in messages) == "hello there", messages
    assert {chunk["id"] for chunk, _ in messages} == {messages[0][0]["id"]}, messages
    assert all(chunk["type"] == "AIMessageChunk" for chunk, _ in messages), messages
    assert messages[-1][0]["chunk_position"] == "last", messages
    assert all(meta["langgraph_node"] == "say" and meta["graph_id"] == "shout" for _, meta in messages)

    # A run that fails ends its stream with an `error` event.
    failed = [p async for p in client.runs.stream(None, "shout", input={"word": "boom"})]
    assert failed[-1].event == "error", failed
    assert "no reply" in failed[-1].data["message"], failed[-1]

    # runs.wait on a thread, through to the gate.
    t2 = (await client.threads.create())["thread_id"]
    waited = await client.runs.wait(t2, "gate", input={"topic": "tides"})
    assert waited["draft"] == "first draft" and waited["__interrupt__"], waited

    # A run in the background: created, joined, looked at, listed.
    t3 = (await client.threads.create())["thread_id"]
    run = await client.runs.create(t3, "shout", input={"word": "hello"})
    # Its status when answered: a quick run may have ended already.
    assert run["thread_id"] == t3 and run["status"] in ("pending", "running", "success"), run
    assert await client.runs.join(t3, run["run_id"]) == {"said": "hello there"}
    assert (await client.runs.get(t3, run["run_id"]))["status"] == "success"
    assert [r["run_id"] for r in await client.runs.list(t3)] == [run["run_id"]]

    # A resumable run joined from its first event, as the SDK reconnects to a dropped stream.
    resumable = await client.runs.create(
        t3, "shout", input={"word": "hello"}, stream_resumable=True, stream_mode=["values", "custom"]
    )
    joined = [p async for p in client.runs.join_stream(t3, resumable["run_id"], last_event_id="-1")]
    assert joined[0].event == "metadata" and joined[0].id == "1", joined[0]
    assert [p.id for p in joined] == [str(i) for i in range(1, len(joined) + 1)], joined
    assert {"text": "hello there"} in [p.data for p in joined if p.event == "custom"], joined

    # Cancelling stops a run at once: the task it was running (`tick`, in a second-long model
    # call) is dropped unwritten, and the thread waits for it, interrupted, saying why.
    t4 = (await client.threads.create())["thread_id"]
    slow = await client.runs.create(t4, "slow")
    # A background create answers while the run may still be pending (a pending run cancelled
    # never touches its thread): cancel once it runs.
    for _ in range(200):
        if (await client.runs.get(t4, slow["run_id"]))["status"] == "running":
            break
        await asyncio.sleep(0.01)
    await client.runs.cancel(t4, slow["run_id"], wait=True)
    assert (await client.runs.get(t4, slow["run_id"]))["status"] == "interrupted"
    state = await client.threads.get_state(t4)
    assert state["next"] == ["tick"] and state["values"] == {"said": ""}, state
    cancelled = await client.threads.get(t4)
    assert cancelled["status"] == "interrupted", cancelled
    assert cancelled["error"] == {
        "error": "UserInterrupt",
        "message": "interrupt requested via POST /threads/{thread_id}/runs/{run_id}/cancel",
    }, cancelled
    # Its thread can be continued: the dropped task runs again, then the rest.
    assert await client.runs.wait(t4, "slow") == {"said": "done"}

    # Metadata merged; the state at an older checkpoint, by id or by checkpoint.
    updated = await client.threads.update(tid, metadata={"extra": 1})
    assert updated["metadata"]["extra"] == 1 and updated["metadata"]["who"] == "sdk", updated
    older = history[1]
    by_id = await client.threads.get_state(tid, checkpoint_id=older["checkpoint"]["checkpoint_id"])
    by_checkpoint = await client.threads.get_state(tid, checkpoint=older["checkpoint"])
    assert by_id["values"] == by_checkpoint["values"] == older["values"], (by_id, older)
    assert by_id["next"] == older["next"]

    try:
        await client.threads.get(str(uuid.uuid4()))
        raise AssertionError("a missing thread was found")
    except NotFoundError:
        pass

    await client.aclose()
    print("sdk: every check passed")


asyncio.run(main())
