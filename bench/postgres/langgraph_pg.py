#!/usr/bin/env python3
"""LangGraph side of the PostgreSQL checkpoint benchmark: one run of one graph, one JSON line out.

The graphs are bench/engine/langgraph_cases.py's own (`loop`: a -> b -> c -> a ... for N rounds,
3N supersteps; `chain`: N nodes in a row, N supersteps), so both benchmarks and runner's YAML
files describe the same graph. Checkpointers (--saver):

    none    compile(checkpointer=None): the baseline the checkpoint cost is measured against
            (invoke() for --mode sync, ainvoke() for --mode async)
    pg      PostgresSaver (--mode sync, graph.invoke) or AsyncPostgresSaver (--mode async,
            graph.ainvoke), each from_conn_string(...) as LangGraph's docs show: one connection
            in autocommit mode, tables created by setup() in the schema --schema

--commit on|off sets the connection's synchronous_commit (LangGraph has no setting of its own:
`on`, the server's default, is what it gets out of the box; `off` is the same durability as
runner's default crash-safe mode). --durability is LangGraph's invoke(durability=...).

Only graph.invoke / ainvoke is timed (invoke_s); connecting and setup() happen before.

    python bench/postgres/langgraph_pg.py loop --n 100 --saver pg --mode sync \\
        --conninfo "host=127.0.0.1 port=5432 dbname=bench user=postgres" --schema lg_1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

from langgraph_cases import build, expected  # noqa: E402  (the engine benchmark's graphs)
from psycopg.conninfo import make_conninfo  # noqa: E402

CASES = ("loop", "chain")


def check(case: str, n: int, result: dict[str, Any]) -> None:
    want = expected(case, n)["total"]
    if result["total"] != want:
        sys.exit(f"wrong result for {case} n={n}: total {result['total']} != {want}")


def conninfo(args: argparse.Namespace) -> str:
    options = f"-c search_path={args.schema} -c synchronous_commit={args.commit}"
    return make_conninfo(args.conninfo, options=options)


def run_sync(args: argparse.Namespace, builder: Any, inp: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {"recursion_limit": 100_000}
    if args.saver == "none":
        graph = builder.compile()
        t0 = time.perf_counter()
        result = graph.invoke(inp, config)
        return {"invoke_s": time.perf_counter() - t0, "result": result}
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(conninfo(args)) as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)
        config["configurable"] = {"thread_id": "bench"}
        t0 = time.perf_counter()
        result = graph.invoke(inp, config, durability=args.durability)
        invoke_s = time.perf_counter() - t0
        step = graph.get_state(config).metadata.get("step")
    return {"invoke_s": invoke_s, "result": result, "last_step": step}


async def run_async(args: argparse.Namespace, builder: Any, inp: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {"recursion_limit": 100_000}
    if args.saver == "none":
        graph = builder.compile()
        t0 = time.perf_counter()
        result = await graph.ainvoke(inp, config)
        return {"invoke_s": time.perf_counter() - t0, "result": result}
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(conninfo(args)) as saver:
        await saver.setup()
        graph = builder.compile(checkpointer=saver)
        config["configurable"] = {"thread_id": "bench"}
        t0 = time.perf_counter()
        result = await graph.ainvoke(inp, config, durability=args.durability)
        invoke_s = time.perf_counter() - t0
        step = (await graph.aget_state(config)).metadata.get("step")
    return {"invoke_s": invoke_s, "result": result, "last_step": step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("case", choices=CASES)
    p.add_argument("--n", type=int, required=True, help="rounds (loop) or nodes (chain)")
    p.add_argument("--saver", choices=("none", "pg"), default="none")
    p.add_argument("--mode", choices=("sync", "async"), default="sync",
                   help="sync: PostgresSaver + invoke; async: AsyncPostgresSaver + ainvoke")
    p.add_argument("--durability", choices=("async", "sync", "exit"), default="async")
    p.add_argument("--commit", choices=("on", "off"), default="on", help="synchronous_commit")
    p.add_argument("--conninfo", help="libpq connection string of the database")
    p.add_argument("--schema", help="schema for LangGraph's tables (must exist)")
    args = p.parse_args()
    if args.saver == "pg" and not (args.conninfo and args.schema):
        p.error("--saver pg needs --conninfo and --schema")

    builder, inp = build(args.case, args.n)
    if args.mode == "sync":
        out = run_sync(args, builder, inp)
    else:
        out = asyncio.run(run_async(args, builder, inp))
    check(args.case, args.n, out.pop("result"))
    want = expected(args.case, args.n)["supersteps"]
    if out.get("last_step") is not None and out["last_step"] != want:
        sys.exit(f"{args.case}: last checkpoint step {out['last_step']} != {want}")
    out.update(
        supersteps=want,
        langgraph=version("langgraph"),
        langgraph_checkpoint_postgres=version("langgraph-checkpoint-postgres"),
        psycopg=version("psycopg"),
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
