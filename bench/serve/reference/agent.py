"""The serve benchmark's graphs for the reference server (`langgraph dev`): bench/serve/graphs/
three.yaml and three_slow.yaml as LangGraph StateGraphs, the same nodes writing the same keys
after the same sleep (runner's nodes wait that long on the scripted mock)."""

import asyncio
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict, total=False):
    a: str
    b: str
    c: str


def build(seconds):
    def step(name, key):
        async def node(state: State):
            await asyncio.sleep(seconds)
            return {key: name}

        return node

    g = StateGraph(State)
    g.add_node("one", step("one", "a"))
    g.add_node("two", step("two", "b"))
    g.add_node("three", step("three", "c"))
    g.add_edge(START, "one")
    g.add_edge("one", "two")
    g.add_edge("two", "three")
    g.add_edge("three", END)
    return g.compile()


three = build(0.001)
three_slow = build(1.0)
