"""Drives `runner serve`'s crons with LangGraph's own Python client (langgraph-sdk, pinned in
requirements.txt): created stateless and on a thread, read, searched, counted, changed and
deleted as an application would, and the errors the API answers. Run by tests/serve_crons.rs:
`python crons.py URL`, the server's scheduler reading its time from a file that holds
2030-01-01T00:00:30Z. Exits non-zero with the failed assertion on any difference from
what the SDK expects."""

import asyncio
import sys
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import httpx
from langgraph_sdk import get_client

URL = sys.argv[1]


async def refused(call, status):
    try:
        await call
    except httpx.HTTPStatusError as e:
        assert e.response.status_code == status, (e.response.status_code, e.response.text)
        return e.response.json()["detail"]
    raise AssertionError(f"expected {status}")


async def main():
    client = get_client(url=URL, api_key=None)
    crons = client.crons
    assistant = (await client.assistants.search(graph_id="tick"))[0]["assistant_id"]

    # A stateless cron: every Monday at 09:00 in Paris, each run on a thread of its own.
    weekly = await crons.create(
        "tick",
        schedule="0 9 * * 1",
        timezone=ZoneInfo("Europe/Paris"),
        input={"note": "digest"},
        metadata={"team": "a", "kind": "digest"},
        on_run_completed="keep",
    )
    assert weekly["assistant_id"] == assistant, weekly
    # No users: the anonymous caller, as LangGraph's server shows it.
    assert weekly["thread_id"] is None and weekly["user_id"] == "", weekly
    assert weekly["schedule"] == "0 9 * * 1" and weekly["timezone"] == "Europe/Paris", weekly
    # The clock says Tuesday 2030-01-01 00:00:30 UTC: the next Monday 09:00 in Paris (CET).
    assert weekly["next_run_date"].startswith("2030-01-07T08:00:00"), weekly
    assert weekly["on_run_completed"] == "keep" and weekly["enabled"] is True, weekly
    assert weekly["metadata"] == {"team": "a", "kind": "digest"}, weekly
    payload = weekly["payload"]
    assert payload["assistant_id"] == assistant and payload["input"] == {"note": "digest"}, payload
    assert payload["config"]["configurable"]["cron_id"] == weekly["cron_id"], payload
    assert weekly["created_at"].startswith("2030-01-01T00:00:30"), weekly

    # A cron on a thread, every minute.
    thread = await client.threads.create(metadata={"owner": "sdk"})
    minutely = await crons.create_for_thread(
        thread["thread_id"],
        "tick",
        schedule="* * * * *",
        input={"note": "minute"},
        metadata={"team": "b"},
        multitask_strategy="enqueue",
        end_time=datetime(2030, 1, 1, 1, 0, tzinfo=timezone.utc),
    )
    assert minutely["thread_id"] == thread["thread_id"], minutely
    assert minutely["on_run_completed"] is None, minutely
    assert minutely["next_run_date"].startswith("2030-01-01T00:01:00"), minutely
    assert minutely["end_time"].startswith("2030-01-01T01:00:00"), minutely

    # Read back by id (the SDK has no `get`: its HTTP client).
    got = await client.http.get(f"/runs/crons/{weekly['cron_id']}")
    assert got == weekly, (got, weekly)

    # Searched: newest first, filtered, sorted, paged, selected.
    found = await crons.search()
    assert [c["cron_id"] for c in found] == [minutely["cron_id"], weekly["cron_id"]], found
    found = await crons.search(assistant_id=assistant, metadata={"team": "a"})
    assert [c["cron_id"] for c in found] == [weekly["cron_id"]], found
    found = await crons.search(thread_id=thread["thread_id"])
    assert [c["cron_id"] for c in found] == [minutely["cron_id"]], found
    found = await crons.search(sort_by="next_run_date", sort_order="asc")
    assert [c["cron_id"] for c in found] == [minutely["cron_id"], weekly["cron_id"]], found
    found = await crons.search(limit=1, offset=1, sort_by="created_at", sort_order="asc")
    assert [c["cron_id"] for c in found] == [minutely["cron_id"]], found
    found = await crons.search(select=["cron_id", "schedule"], limit=1)
    assert found == [{"cron_id": minutely["cron_id"], "schedule": "* * * * *"}], found
    assert await crons.count() == 2
    assert await crons.count(metadata={"team": "b"}) == 1
    assert await crons.count(thread_id=thread["thread_id"]) == 1

    # Changed: a new schedule moves the next run; metadata is merged; it can be turned off.
    changed = await crons.update(
        weekly["cron_id"], schedule="30 7 * * *", metadata={"kind": "daily"}, enabled=False
    )
    assert changed["schedule"] == "30 7 * * *" and changed["enabled"] is False, changed
    assert changed["next_run_date"].startswith("2030-01-01T06:30:00"), changed
    assert changed["metadata"] == {"team": "a", "kind": "daily"}, changed
    assert changed["payload"]["assistant_id"] == assistant, changed
    assert [c["cron_id"] for c in await crons.search(enabled=False)] == [weekly["cron_id"]]
    cleared = await crons.update(minutely["cron_id"], end_time=None)
    assert cleared["end_time"] is None, cleared

    # Refused as the API refuses.
    detail = await refused(crons.create("tick", schedule="every day"), 422)
    assert "Invalid cron schedule" in detail, detail
    detail = await refused(crons.create("tick", schedule="* * * * *", timezone="Mars/Olympus"), 422)
    assert "Invalid timezone" in detail, detail
    await refused(crons.create("nope", schedule="* * * * *"), 404)
    await refused(crons.create_for_thread("00000000-0000-0000-0000-000000000000", "tick", schedule="* * * * *"), 404)
    await refused(crons.create("tick", schedule="* * * * *", multitask_strategy="sometimes"), 422)
    await refused(crons.update(weekly["cron_id"]), 400)
    await refused(client.http.get("/runs/crons/00000000-0000-0000-0000-000000000000"), 404)
    await refused(crons.search(sort_by="schedule"), 422)

    # Deleted; a thread's crons go with the thread.
    await crons.delete(weekly["cron_id"])
    await refused(crons.delete(weekly["cron_id"]), 404)
    await client.threads.delete(thread["thread_id"])
    assert await crons.count() == 0
    print("sdk crons: every check passed")


asyncio.run(main())
