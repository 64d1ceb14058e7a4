"""The conformance suite's graphs as LangGraph writes them, served by the reference server
(`langgraph dev`). Each graph has a runner twin in ../workflows/ with the same name: the same
nodes, writing the same values, in the same order. The model is scripted from ../mock.yaml,
the same script `runner serve --mock` reads, so both servers stream the same replies."""

import asyncio
import json
import operator
import os
from typing import Annotated, Any, TypedDict

import yaml
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.cache.memory import InMemoryCache
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import CachePolicy, Command, interrupt

SCRIPT = os.environ.get("CONFORMANCE_MOCK") or os.path.join(os.path.dirname(__file__), "..", "mock.yaml")
with open(SCRIPT) as f:
    MATCH = yaml.safe_load(f)["match"]


def _text(content) -> str:
    """A message's text: its string, or its text blocks joined (agent-chat-ui sends a new
    message's content as blocks, `[{"type": "text", "text": ...}]`)."""
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def _reply(messages: list[BaseMessage]) -> dict:
    """The scripted reply runner's mock gives: the first entry whose `contains` is in the
    messages' text, joined by newlines."""
    prompt = "\n".join(_text(m.content) for m in messages)
    for entry in MATCH:
        if entry["contains"] in prompt:
            reply = entry["reply"]
            return {"text": reply} if isinstance(reply, str) else reply
    raise ValueError(f"the script has no reply for {prompt!r}")


def _calls(reply: dict) -> list[dict]:
    return [
        {"name": c["name"], "args": c.get("args", {}), "id": c.get("id") or f"call_{i + 1}", "type": "tool_call"}
        for i, c in enumerate(reply.get("tool_calls", []))
    ]


class Scripted(BaseChatModel):
    """A chat model that answers from the script, streaming its chunks."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        reply = _reply(messages)
        message = AIMessage(content=reply.get("text", ""), tool_calls=_calls(reply))
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _astream(self, messages, stop=None, run_manager=None, **kwargs):
        reply = _reply(messages)
        delay = reply.get("delay", 0)
        if delay:
            await asyncio.sleep(float(delay))
        pieces = reply.get("chunks") or [reply.get("text", "")]
        calls = _calls(reply)
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            message = AIMessageChunk(
                content=piece,
                tool_call_chunks=[
                    {"name": c["name"], "args": __import__("json").dumps(c["args"]), "id": c["id"], "index": n}
                    for n, c in enumerate(calls)
                ]
                if last
                else [],
            )
            chunk = ChatGenerationChunk(message=message)
            if run_manager:
                await run_manager.on_llm_new_token(piece, chunk=chunk)
            yield chunk

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        chunks = [c async for c in self._astream(messages, stop, run_manager, **kwargs)]
        message = chunks[0].message
        for c in chunks[1:]:
            message = message + c.message
        return ChatResult(generations=[ChatGeneration(message=AIMessage(**message.model_dump(exclude={"type", "tool_call_chunks", "chunk_position"})))])


model = Scripted()


# chain: three nodes, each appending its name.
class Chain(TypedDict, total=False):
    items: Annotated[list, operator.add]


def _append(name):
    def node(state: Chain):
        return {"items": [name]}

    return node


_b = StateGraph(Chain)
for _n in ("a", "b", "c"):
    _b.add_node(_n, _append(_n))
_b.add_edge(START, "a")
_b.add_edge("a", "b")
_b.add_edge("b", "c")
_b.add_edge("c", END)
chain = _b.compile()


# chat: a model turn over the conversation, streamed.
class Chat(TypedDict, total=False):
    messages: Annotated[list, add_messages]


async def _model(state: Chat):
    return {"messages": [await model.ainvoke(state["messages"])]}


_b = StateGraph(Chat)
_b.add_node("model", _model)
_b.add_edge(START, "model")
_b.add_edge("model", END)
chat = _b.compile()


# custom: a node that writes two custom events, then its result.
class Custom(TypedDict, total=False):
    done: bool


def _work(state: Custom):
    writer = get_stream_writer()
    for step in (1, 2):
        writer({"step": step, "of": 2})
    return {"done": True}


_b = StateGraph(Custom)
_b.add_node("work", _work)
_b.add_edge(START, "work")
_b.add_edge("work", END)
custom = _b.compile()


# nested: a subgraph between two nodes; the subgraph writes a custom event and streams a
# model reply.
class Nested(TypedDict, total=False):
    topic: str
    summary: str
    log: Annotated[list, operator.add]


class Inner(TypedDict, total=False):
    topic: str
    summary: str


def _outline(state: Inner):
    get_stream_writer()({"outlining": state["topic"]})
    return {"summary": "outline of " + state["topic"]}


async def _write(state: Inner):
    reply = await model.ainvoke([{"role": "user", "content": "Summarise " + state["summary"]}])
    return {"summary": reply.content}


_b = StateGraph(Inner)
_b.add_node("outline", _outline)
_b.add_node("write", _write)
_b.add_edge(START, "outline")
_b.add_edge("outline", "write")
_b.add_edge("write", END)
_inner = _b.compile()

_b = StateGraph(Nested)
_b.add_node("before", lambda s: {"log": ["before"]})
_b.add_node("child", _inner)
_b.add_node("after", lambda s: {"log": ["after"]})
_b.add_edge(START, "before")
_b.add_edge("before", "child")
_b.add_edge("child", "after")
_b.add_edge("after", END)
nested = _b.compile()


# gate: a draft, then a person's decision: accept ends, anything else writes again.
ANSWER = {
    "type": "object",
    "required": ["action"],
    "properties": {"action": {"enum": ["accept", "respond"]}, "feedback": {"type": "string"}},
}


class Gate(TypedDict, total=False):
    draft: str
    log: Annotated[list, operator.add]


def _draft(state: Gate):
    return {"draft": "draft " + str(len(state.get("log") or [])), "log": ["draft"]}


def _review(state: Gate):
    answer = interrupt({"message": "Publish this draft?", "payload": {"draft": state["draft"]}, "response_schema": ANSWER})
    return Command(update={"log": [answer["action"]]}, goto=END if answer["action"] == "accept" else "draft")


_b = StateGraph(Gate)
_b.add_node("draft", _draft)
_b.add_node("review", _review, destinations=("draft", END))
_b.add_edge(START, "draft")
_b.add_edge("draft", "review")
gate = _b.compile()


# two_gates: two gates in one step, each answered on its own.
class Two(TypedDict, total=False):
    log: Annotated[list, operator.add]


def _ask(name):
    def node(state: Two):
        answer = interrupt({"message": name + "?", "response_schema": {"type": "string"}})
        return {"log": [name + ":" + answer]}

    return node


_b = StateGraph(Two)
_b.add_node("pa", _ask("a"))
_b.add_node("pb", _ask("b"))
_b.add_edge(START, "pa")
_b.add_edge(START, "pb")
_b.add_edge("pa", END)
_b.add_edge("pb", END)
two_gates = _b.compile()


# nested_gate: a gate inside a subgraph.
class Asked(TypedDict, total=False):
    answer: str


def _inner_ask(state: Asked):
    return {"answer": interrupt({"message": "Which colour?", "response_schema": {"type": "string"}})}


_b = StateGraph(Asked)
_b.add_node("ask", _inner_ask)
_b.add_edge(START, "ask")
_b.add_edge("ask", END)
_asker = _b.compile()

_b = StateGraph(Asked)
_b.add_node("inner", _asker)
_b.add_edge(START, "inner")
_b.add_edge("inner", END)
nested_gate = _b.compile()


# agent: a tool-calling agent whose `define` calls a person reviews first.
@tool
def define(word: str) -> str:
    """Define a word."""
    # As the twin's tool does (an llm call with the prompt `Look up {word}`): the script's
    # answer, which the model's next turn reads. Not streamed: the script, not the model.
    return _reply([HumanMessage(f"Look up {word}")])["text"]


def _review_description(tool_call, state, runtime):
    # The twin's wording of a review's request (runner's default), so that what differs in
    # a review is its shape, not its prose.
    args = json.dumps(tool_call["args"], separators=(",", ":"))
    return (f"The model calls `{tool_call['name']}` with {args}. "
            "Approve it, edit its arguments, reject it, or answer in its place.")


_agent = create_agent(model, tools=[define], middleware=[HumanInTheLoopMiddleware(
    interrupt_on={"define": {"allowed_decisions": ["approve", "edit", "reject", "respond"],
                             "description": _review_description}})])


class Agentic(TypedDict, total=False):
    messages: Annotated[list, add_messages]


def _agent_node(state: Agentic, config):
    # As runner's agent node writes: only the messages the agent added (a compiled agent
    # added as a node would return the whole conversation, which add_messages dedupes).
    out = _agent.invoke({"messages": state["messages"]}, config)
    seen = {m.id for m in state["messages"]}
    return {"messages": [m for m in out["messages"] if m.id not in seen]}


_b = StateGraph(Agentic)
_b.add_node("agent", _agent_node)
_b.add_edge(START, "agent")
_b.add_edge("agent", END)
agent = _b.compile()


# slow: one slow model call, streamed: for cancels and concurrent runs.
_b = StateGraph(Chat)
_b.add_node("think", _model)
_b.add_edge(START, "think")
_b.add_edge("think", END)
slow = _b.compile()


# configured: a node reading the run's configurable values.
class Configured(TypedDict, total=False):
    style: str
    user: str


def _configured(state: Configured, config):
    c = config.get("configurable", {})
    return {"style": c.get("style", "plain"), "user": c.get("user_id", "nobody")}


_b = StateGraph(Configured)
_b.add_node("read", _configured)
_b.add_edge(START, "read")
_b.add_edge("read", END)
configured = _b.compile()


# cached: a node whose result is cached by its input.
class Cached(TypedDict, total=False):
    word: str
    calls: Annotated[list, operator.add]


def _expensive(state: Cached):
    return {"calls": ["computed " + state["word"]]}


_b = StateGraph(Cached)
_b.add_node("expensive", _expensive, cache_policy=CachePolicy(ttl=600))
_b.add_edge(START, "expensive")
_b.add_edge("expensive", END)
cached = _b.compile(cache=InMemoryCache())


# boom: a node that fails.
def _explode(state: Chain):
    raise ValueError("boom: deliberate failure")


_b = StateGraph(Chain)
_b.add_node("explode", _explode)
_b.add_edge(START, "explode")
_b.add_edge("explode", END)
boom = _b.compile()
