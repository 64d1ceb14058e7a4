"""`command.update` and `command.goto` on run create, driven by LangGraph's own Python client
(langgraph-sdk, pinned in requirements.txt) as an application sends them. Run by
tests/serve_api.rs: `python command.py URL`. Exits non-zero with the failed assertion on any
difference from what LangGraph does."""

import asyncio
import sys

import httpx
from langgraph_sdk import get_client

URL = sys.argv[1]


def texts(values):
    return [m["content"] for m in values["messages"]]


async def main():
    client = get_client(url=URL, api_key=None)

    # update goes through the reducers (the message is appended, not the history replaced);
    # goto runs that node next.
    t = (await client.threads.create())["thread_id"]
    values = await client.runs.wait(t, "chat", input={"messages": [{"type": "human", "content": "hi"}]})
    assert texts(values) == ["hi", "echo: hi"], values
    values = await client.runs.wait(
        t, "chat", command={"update": {"messages": [{"type": "human", "content": "added"}]}, "goto": "reply"}
    )
    assert texts(values) == ["hi", "echo: hi", "added", "echo: added"], values
    # LangGraph's list-of-pairs form of update, without goto: written, nothing runs.
    values = await client.runs.wait(t, "chat", command={"update": [["messages", [{"type": "human", "content": "quiet"}]]]})
    assert texts(values)[-1] == "quiet", values

    # goto END resolves a waiting gate without an answer (agent-chat-ui's "mark as resolved").
    g = (await client.threads.create())["thread_id"]
    await client.runs.wait(g, "gate", input={"topic": "tides"})
    state = await client.threads.get_state(g)
    assert state["next"] == ["review"] and state["tasks"][0]["interrupts"], state
    values = await client.runs.wait(g, "gate", command={"goto": "__end__"})
    assert values["draft"] == "first draft", values
    state = await client.threads.get_state(g)
    assert state["next"] == [] and state["tasks"] == [], state
    assert (await client.threads.get(g))["status"] == "idle"

    # update, then resume: the gate's answer sees the edited state.
    h = (await client.threads.create())["thread_id"]
    await client.runs.wait(h, "gate", input={"topic": "tides"})
    values = await client.runs.wait(
        h, "gate", command={"update": {"draft": "edited by hand"}, "resume": {"action": "accept"}}
    )
    assert values == {"draft": "edited by hand", "log": ["write", "accept"]}, values

    # A Send (langgraph_sdk's `Send`: {"node", "input"}) runs a fan-out target on that item.
    f = (await client.threads.create())["thread_id"]
    values = await client.runs.wait(f, "fan", input={"items": [{"name": "a"}]})
    assert values["done"] == ["a"], values
    send = {"node": "work", "input": {"name": "b"}}
    values = await client.runs.wait(f, "fan", command={"goto": [send, {"node": "work", "input": {"name": "c"}}]})
    assert values["done"] == ["a", "b", "c"], values

    # A node the graph does not have is refused, and the thread is unchanged.
    try:
        await client.runs.wait(t, "chat", command={"goto": "nowhere"})
        raise AssertionError("goto to an unknown node was accepted")
    except httpx.HTTPStatusError as e:
        assert e.response.status_code == 422, e.response.text
        assert "nowhere" in e.response.text, e.response.text
    print("sdk command: every check passed")


asyncio.run(main())
