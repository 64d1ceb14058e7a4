"""LangGraph's Python client against `runner serve` with users: a client that passes
`headers={"Authorization": "Bearer …"}` works unchanged, sees its own threads, and gets the
SDK's not-found error for another user's. Run by tests/serve_auth.rs:
`python auth.py URL ALICE_TOKEN BOB_TOKEN`."""

import asyncio
import sys

from langgraph_sdk import get_client
from langgraph_sdk.errors import AuthenticationError, NotFoundError

URL, ALICE, BOB = sys.argv[1:4]


def client_of(token):
    return get_client(url=URL, api_key=None, headers={"Authorization": f"Bearer {token}"})


async def main():
    alice, bob = client_of(ALICE), client_of(BOB)

    thread = await alice.threads.create(metadata={"topic": "tides"})
    assert thread["metadata"]["owner"] == "alice", thread
    values = await alice.runs.wait(thread["thread_id"], "notes", input={"text": "moon"})
    assert values["who"] == "alice", values
    state = await alice.threads.get_state(thread["thread_id"])
    assert state["next"] == ["review"], state
    found = await alice.threads.search(metadata={"topic": "tides"})
    assert [t["thread_id"] for t in found] == [thread["thread_id"]], found

    # Bob's client: the thread does not exist for him.
    try:
        await bob.threads.get(thread["thread_id"])
        raise AssertionError("bob read alice's thread")
    except NotFoundError:
        pass
    assert await bob.threads.search(metadata={"topic": "tides"}) == []

    # Without the header the same client is refused.
    bare = get_client(url=URL, api_key=None)
    try:
        await bare.threads.search()
        raise AssertionError("a client without credentials was served")
    except AuthenticationError:
        pass

    print("sdk auth: every check passed")


asyncio.run(main())
