#!/usr/bin/env python3
"""LangGraph side of the engine benchmark: the graphs of bench/engine/workflows/*.yaml in Python.

One process runs one case once and prints one JSON object on stdout (run.sh / harness.py start a
fresh process per run and take the median). Timed separately, all with time.perf_counter:

    import_s  importing langgraph (+ the sqlite saver)
    build_s   building and compiling the StateGraph (and opening the SQLite connection)
    invoke_s  graph.invoke(...) only: the number the comparison uses
    close_s   checkpointing the WAL into the database and closing it (SqliteSaver only)

Interpreter start is what the harness measures around the process minus the sum of these.

Cases (N = 1,000 each, as in the YAML workflows):

    loop     a -> b -> c -> (a | END after N rounds), `total` summed (operator.add): 3N supersteps
    append   the same loop; c also appends one item per round to `items` (operator.add on lists)
    chain    N nodes in a row, each adding 1 to `total`: N supersteps
    fanout   `plan` sends N tasks (Send) to `work`; their results merge through operator.add:
             2 supersteps, N tasks in the second

Checkpointers (--checkpointer):

    none         compile(checkpointer=None)
    memory       InMemorySaver (for reference: what an in-process checkpointer costs LangGraph)
    crash-safe   SqliteSaver, connection set to journal_mode=WAL + synchronous=NORMAL
                 (= runner's default durability: survives a killed process)
    power-safe   SqliteSaver, connection set to journal_mode=WAL + synchronous=FULL
                 (= runner --durability power-safe: survives power loss). This is also what
                 SqliteSaver gives you by default: its setup() runs PRAGMA journal_mode=WAL and
                 Python's sqlite3 leaves synchronous at SQLite's default, FULL.

--lg-durability is LangGraph's own `durability` argument of invoke: "async" (its default: each
step's checkpoint is written by a background thread while the next step runs; every step is
still checkpointed) or "sync" (the checkpoint is written before the next step starts).

    python bench/engine/langgraph_cases.py loop --checkpointer power-safe --db /tmp/x/lg.db
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import operator  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import sqlite3  # noqa: E402
import sys  # noqa: E402
from typing import Annotated, Any  # noqa: E402

from typing_extensions import TypedDict  # noqa: E402

T_STDLIB = time.perf_counter()

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Send  # noqa: E402

T_IMPORTED = time.perf_counter()

# What each run must produce, and how many supersteps / tasks it takes (checked below).
CASES = ("loop", "append", "chain", "fanout")


def expected(case: str, n: int) -> dict[str, Any]:
    if case in ("loop", "append"):
        return {"supersteps": 3 * n, "tasks": 3 * n, "total": 3 * n}
    if case == "chain":
        return {"supersteps": n, "tasks": n, "total": n}
    return {"supersteps": 2, "tasks": n + 1, "total": sum(2 * i for i in range(n))}


class LoopState(TypedDict):
    total: Annotated[int, operator.add]
    rounds: int


class AppendState(TypedDict):
    total: Annotated[int, operator.add]
    rounds: int
    items: Annotated[list[str], operator.add]


class ChainState(TypedDict):
    total: Annotated[int, operator.add]


class FanoutState(TypedDict):
    ids: list[int]
    results: Annotated[list[int], operator.add]


class WorkInput(TypedDict):
    task: int


def build_loop(n: int, append: bool) -> tuple[StateGraph, dict[str, Any]]:
    builder = StateGraph(AppendState if append else LoopState)

    def a(state: dict) -> dict:
        return {"total": 1}

    def b(state: dict) -> dict:
        return {"total": 1}

    if append:

        def c(state: dict) -> dict:
            r = state["rounds"]
            return {"total": 1, "rounds": r + 1, "items": [f"item-{r}"]}

    else:

        def c(state: dict) -> dict:
            return {"total": 1, "rounds": state["rounds"] + 1}

    def route(state: dict) -> str:
        return "a" if state["rounds"] < n else END

    builder.add_node("a", a)
    builder.add_node("b", b)
    builder.add_node("c", c)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_conditional_edges("c", route, ["a", END])
    inp: dict[str, Any] = {"total": 0, "rounds": 0}
    if append:
        inp["items"] = []
    return builder, inp


def build_chain(n: int) -> tuple[StateGraph, dict[str, Any]]:
    builder = StateGraph(ChainState)

    def add_one(state: ChainState) -> dict:
        return {"total": 1}

    prev = START
    for i in range(n):
        name = f"n{i:04d}"
        builder.add_node(name, add_one)
        builder.add_edge(prev, name)
        prev = name
    builder.add_edge(prev, END)
    return builder, {"total": 0}


def build_fanout(n: int) -> tuple[StateGraph, dict[str, Any]]:
    builder = StateGraph(FanoutState)

    def plan(state: FanoutState) -> dict:
        return {"ids": list(range(n))}

    def send(state: FanoutState) -> list[Send]:
        return [Send("work", {"task": i}) for i in state["ids"]]

    def work(state: WorkInput) -> dict:
        return {"results": [state["task"] * 2]}

    builder.add_node("plan", plan)
    builder.add_node("work", work)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges("plan", send, ["work"])
    builder.add_edge("work", END)
    return builder, {"ids": [], "results": []}


def build(case: str, n: int) -> tuple[StateGraph, dict[str, Any]]:
    if case == "loop":
        return build_loop(n, append=False)
    if case == "append":
        return build_loop(n, append=True)
    if case == "chain":
        return build_chain(n)
    return build_fanout(n)


def db_bytes(path: str) -> dict[str, int]:
    """Sizes of the database and its -wal / -shm files (absent files: 0)."""
    return {
        suffix or "db": os.path.getsize(path + suffix) if os.path.exists(path + suffix) else 0
        for suffix in ("", "-wal", "-shm")
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case", choices=CASES)
    p.add_argument("--n", type=int, default=1000, help="iterations / nodes / tasks (default 1000)")
    p.add_argument(
        "--checkpointer", choices=("none", "memory", "crash-safe", "power-safe"), default="none"
    )
    p.add_argument("--db", help="SQLite file for crash-safe / power-safe (must not exist)")
    p.add_argument("--lg-durability", choices=("async", "sync"), default="async")
    args = p.parse_args()

    sqlite_mode = args.checkpointer in ("crash-safe", "power-safe")
    if sqlite_mode:
        if not args.db:
            p.error("--db is required with a SQLite checkpointer")
        if os.path.exists(args.db):
            p.error(f"{args.db} exists: each run needs a fresh database")

    t_build = time.perf_counter()
    builder, inp = build(args.case, args.n)
    conn = None
    checkpointer: Any = None
    if args.checkpointer == "memory":
        checkpointer = InMemorySaver()
    elif sqlite_mode:
        conn = sqlite3.connect(args.db, check_same_thread=False)
        sync = "NORMAL" if args.checkpointer == "crash-safe" else "FULL"
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={sync}")
        checkpointer = SqliteSaver(conn)
        checkpointer.setup()  # creates the tables (and sets WAL again) outside the timed part
    graph = builder.compile(checkpointer=checkpointer)
    config: dict[str, Any] = {"recursion_limit": 100_000}
    kwargs: dict[str, Any] = {}
    if checkpointer is not None:
        config["configurable"] = {"thread_id": "bench"}
        kwargs["durability"] = args.lg_durability
    t_built = time.perf_counter()

    t_inv = time.perf_counter()
    result = graph.invoke(inp, config, **kwargs)
    t_inv_end = time.perf_counter()
    invoke_s = t_inv_end - t_inv

    want = expected(args.case, args.n)
    got_total = sum(result["results"]) if args.case == "fanout" else result["total"]
    if got_total != want["total"]:
        sys.exit(f"wrong result for {args.case}: {got_total} != {want['total']}")
    if args.case == "append" and len(result["items"]) != args.n:
        sys.exit(f"append: {len(result['items'])} items, expected {args.n}")

    out: dict[str, Any] = {
        "case": args.case,
        "n": args.n,
        "checkpointer": args.checkpointer,
        "lg_durability": args.lg_durability if checkpointer is not None else None,
        "supersteps": want["supersteps"],
        "tasks": want["tasks"],
        "import_s": T_IMPORTED - T_STDLIB,
        "stdlib_import_s": T_STDLIB - T0,
        "build_s": t_built - t_build,
        "invoke_s": invoke_s,
    }
    if checkpointer is not None:
        state = graph.get_state(config)
        # metadata step: -1 is the input checkpoint, then one per superstep.
        out["last_step"] = state.metadata.get("step")
        if out["last_step"] is not None and out["last_step"] != want["supersteps"]:
            sys.exit(f"{args.case}: last checkpoint step {out['last_step']} != {want['supersteps']}")
    if sqlite_mode and conn is not None:
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
        wrows = conn.execute("SELECT count(*) FROM writes").fetchone()[0]
        before = db_bytes(args.db)
        t_close = time.perf_counter()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        out["close_s"] = time.perf_counter() - t_close
        after = db_bytes(args.db)
        out.update(
            journal_mode=journal,
            synchronous={0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[synchronous],
            checkpoint_rows=rows,
            write_rows=wrows,
            db_bytes_before_close=before,
            db_bytes=after["db"] + after["-wal"],
        )
    out["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["python"] = platform.python_version()
    from importlib.metadata import version

    out["langgraph"] = version("langgraph")
    out["langgraph_checkpoint_sqlite"] = version("langgraph-checkpoint-sqlite")
    out["sqlite"] = sqlite3.sqlite_version
    out["script_s"] = time.perf_counter() - T0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
