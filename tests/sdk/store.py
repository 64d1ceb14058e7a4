"""Drives `runner serve`'s store with LangGraph's own Python client (langgraph-sdk, pinned in
requirements.txt): what a client puts, a run's `store` node reads, and the other way round.
Run by tests/serve_api.rs: `python store.py URL`. Exits non-zero with the failed assertion on
any difference from what the SDK expects."""

import asyncio
import sys

from langgraph_sdk import get_client

URL = sys.argv[1]


async def main():
    client = get_client(url=URL, api_key=None)
    store = client.store

    await store.put_item(["users", "py"], "prefs", {"theme": "sepia"})
    item = await store.get_item(["users", "py"], "prefs")
    assert item["value"] == {"theme": "sepia"} and item["namespace"] == ["users", "py"], item
    assert item["created_at"] and item["updated_at"], item

    # A run reads the item and leaves a note.
    values = await client.runs.wait(None, "memo", input={"user": "py"})
    assert values["prefs"] == {"theme": "sepia"}, values
    note = await store.get_item(["users", "py", "notes"], "visit")
    assert note["value"] == {"seen": True, "theme": "sepia"}, note

    found = await store.search_items(["users", "py"], filter={"seen": True})
    assert [i["key"] for i in found["items"]] == ["visit"], found
    found = await store.search_items(["users"], query="sepia", limit=5)
    assert found["items"] and found["items"][0]["score"] is not None, found
    assert (await store.search_items(["users"], limit=1, offset=1))["items"], "paging"

    listed = await store.list_namespaces(prefix=["users"])
    assert listed["namespaces"] == [["users", "py"], ["users", "py", "notes"]], listed
    listed = await store.list_namespaces(suffix=["notes"], max_depth=3)
    assert listed["namespaces"] == [["users", "py", "notes"]], listed

    await store.delete_item(["users", "py"], "prefs")
    assert await store.get_item(["users", "py"], "prefs") is None

    # The server runs with `--store-index offline`: LangGraph's semantic search, with `index`
    # and `ttl` as the client sends them.
    await store.put_item(["docs"], "tides", {"text": "the moon pulls the tides"})
    await store.put_item(["docs"], "bread", {"text": "baking sourdough bread"})
    await store.put_item(["docs"], "plain", {"text": "moon tides"}, index=False)
    await store.put_item(["docs"], "titled", {"text": "unrelated", "title": "moon tides"}, index=["title"])
    await store.put_item(["docs"], "brief", {"text": "kept a while"}, ttl=5)
    found = (await store.search_items(["docs"], query="moon tides", limit=4))["items"]
    assert [i["key"] for i in found[:2]] == ["titled", "tides"], found
    assert found[0]["score"] > found[1]["score"] > 0, found
    assert [i["key"] for i in found if i["score"] is None] == [], found
    unscored = (await store.search_items(["docs"], query="moon tides", limit=10))["items"]
    assert unscored[-1]["key"] == "plain" and unscored[-1]["score"] is None, unscored

    print("sdk store: every check passed")


asyncio.run(main())
