"""Compares what the two servers answered to the same scenarios (the drivers' records), after
normalising what is expected to differ between any two runs: ids (thread, run, checkpoint,
task, message and interrupt ids, each kind numbered in the order it first appears; the run
ids of an `events` mode event's `parent_ids` too) and timestamps; an error answer is compared
by its status and shape (its `detail` is any text); a graph drawing's nodes and edges, which
are sets, in one order (by id, by source and target). Nothing else is normalised.

    python compare.py REFERENCE.json RUNNER.json DIFFERENCES.yaml [--sdk NAME] [--report OUT.json]

Every difference found must be covered by an entry of DIFFERENCES.yaml (the deliberate
differences, each with its reason and the docs that tell users); an entry that covers nothing
is stale. Prints every uncovered difference and every stale entry; exits 1 if there is any.
"""

import difflib
import json
import re
import sys

import yaml

TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?([+-]\d{2}:\d{2}|Z)?$")
MESSAGE_TYPES = {"human", "ai", "tool", "system", "AIMessageChunk", "HumanMessageChunk", "ToolMessageChunk", "remove"}


class Ids:
    """Each kind of id numbered in the order its values first appear."""

    def __init__(self):
        self.kinds = {}

    def __call__(self, kind, value):
        if not isinstance(value, str) or value == "":
            return value
        table = self.kinds.setdefault(kind, {})
        if value not in table:
            table[value] = len(table) + 1
        return f"<{kind} {table[value]}>"

    def namespace(self, ns):
        """`node:task|node:task` with each task id numbered."""
        if not isinstance(ns, str) or ns == "":
            return ns
        parts = []
        for part in ns.split("|"):
            node, sep, task = part.partition(":")
            parts.append(node + sep + (self("task", task) if sep else ""))
        return "|".join(parts)


def id_kind(key, parent):
    """The kind of id `parent[key]` holds, if it is one."""
    if key in ("thread_id",):
        return "thread"
    if key == "run_id":
        return "run"
    if key == "cron_id":
        return "cron"
    if key in ("checkpoint_id", "parent_checkpoint_id"):
        return "checkpoint"
    if key in ("task_id",):
        return "task"
    if key in ("langgraph_request_id",):
        return "request"
    if key == "id":
        if parent.get("type") in MESSAGE_TYPES or "content" in parent:
            return "message"
        if "value" in parent and len(parent) <= 3:
            return "interrupt"
        if "name" in parent and ("interrupts" in parent or "triggers" in parent or "path" in parent or "result" in parent):
            return "task"
        return "other"
    return None


def normalise(value, ids, key=None, parent=None):
    if isinstance(value, dict):
        out = {}
        for k in sorted(value):
            v = value[k]
            kind = id_kind(k, value)
            if k == "id" and "event" in value and "data" in value:
                # A stream event's id: only its order matters (what a rejoin with
                # Last-Event-ID sends shows it), and the reference's may repeat.
                out[k] = "<event id>" if v is not None else None
            elif kind:
                out[k] = ids(kind, v)
            elif k in ("checkpoint_ns", "langgraph_checkpoint_ns"):
                out[k] = ids.namespace(v)
            elif k == "parent_ids" and isinstance(v, list):
                # The runs around an `events` mode event, outermost first.
                out[k] = [ids("run", r) for r in v]
            elif k in ("parents", "checkpoint_map") and isinstance(v, dict):
                # Namespace -> checkpoint id.
                out[k] = {ids.namespace(n): ids("checkpoint", c) for n, c in sorted(v.items())}
            elif k == "interrupts" and isinstance(v, dict):
                # A thread's pending interrupts, by task id.
                out[k] = {ids("task", t): normalise(i, ids, t, v) for t, i in sorted(v.items())}
            elif k == "event" and isinstance(v, str) and "|" in v:
                mode, _, ns = v.partition("|")
                out[k] = mode + "|" + ids.namespace(ns)
            elif k == "data" and str(value.get("event", "")).startswith("messages/metadata") and isinstance(v, dict):
                # The legacy mode's metadata, by message id.
                out[k] = {ids("message", m): normalise(meta, ids, m, v) for m, meta in sorted(v.items())}
            else:
                out[k] = normalise(v, ids, k, value)
        return out
    if isinstance(value, list):
        return [normalise(v, ids, key, parent) for v in value]
    if isinstance(value, str) and TIME.match(value):
        return "<time>"
    return value


def shapes(records):
    """Error answers compared by status and shape: a `detail` is any text. A graph drawing's
    nodes and edges are sets: sorted (by id; by source, then target)."""
    out = []
    for r in records:
        body = r.get("error", {}).get("body") if isinstance(r.get("error"), dict) else None
        if isinstance(body, dict) and isinstance(body.get("detail"), str):
            r = {**r, "error": {**r["error"], "body": {**body, "detail": "<detail>"}}}
        result = r.get("result")
        if r.get("op") == "assistants.get_graph" and isinstance(result, dict):
            result = {**result,
                      "nodes": sorted(result.get("nodes", []), key=lambda n: str(n.get("id"))),
                      "edges": sorted(result.get("edges", []), key=lambda e: (str(e.get("source")), str(e.get("target"))))}
            r = {**r, "result": result}
        out.append(r)
    return out


def show(v, width=300):
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= width else s[:width] + "..."


def diff(path, ref, run, out):
    """Every difference between `ref` and `run` as (path, kind, reference, runner)."""
    if isinstance(ref, dict) and isinstance(run, dict):
        for k in sorted(set(ref) | set(run)):
            if k not in run:
                out.append((f"{path}.{k}", "missing", ref[k], None))
            elif k not in ref:
                out.append((f"{path}.{k}", "extra", None, run[k]))
            else:
                diff(f"{path}.{k}", ref[k], run[k], out)
    elif isinstance(ref, list) and isinstance(run, list):
        if path.endswith("result") and all(isinstance(e, dict) and "event" in e for e in ref + run) and (ref or run):
            events(path, ref, run, out)
            return
        if len(ref) != len(run):
            out.append((f"{path}", "length", len(ref), len(run)))
        for i, (a, b) in enumerate(zip(ref, run)):
            diff(f"{path}[{i}]", a, b, out)
    elif ref != run:
        out.append((path, "value", ref, run))


def name_of(e):
    """A stream event's name; an `events` mode event's with its callback event's
    (`events:on_chat_model_start`), which paths then name too."""
    if e["event"] == "events" and isinstance(e.get("data"), dict) and isinstance(e["data"].get("event"), str):
        return f"events:{e['data']['event']}"
    return e["event"]


def events(path, ref, run, out):
    """A stream's events aligned by name first, so that one event more or less is reported
    as that, not as every later event differing."""
    names = lambda evs: [name_of(e) for e in evs]
    matcher = difflib.SequenceMatcher(a=names(ref), b=names(run), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for k in range(i2 - i1):
                diff(f"{path}[{i1 + k}:{name_of(ref[i1 + k])}]", ref[i1 + k], run[j1 + k], out)
        else:
            for k in range(i1, i2):
                out.append((f"{path}[{k}:{name_of(ref[k])}]", "missing event", ref[k], None))
            for k in range(j1, j2):
                out.append((f"{path}[+{k}:{name_of(run[k])}]", "extra event", None, run[k]))


def glob(pattern: str, text: str) -> bool:
    """Whether `text` matches `pattern`, where `*` stands for any run of characters and every
    other character (brackets included) for itself."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), text, re.S) is not None


def covered(entry, scenario, path, kind):
    scenarios = entry.get("scenarios")
    if scenarios and not any(glob(s, scenario) for s in scenarios):
        return False
    kinds = entry.get("kinds")
    if kinds and kind not in kinds:
        return False
    return any(glob(p, path) for p in entry["paths"])


def main():
    args = sys.argv[1:]
    sdk = "python"
    report_file = None
    if "--sdk" in args:
        i = args.index("--sdk")
        sdk = args[i + 1]
        del args[i : i + 2]
    if "--report" in args:
        i = args.index("--report")
        report_file = args[i + 1]
        del args[i : i + 2]
    ref_file, run_file, differences_file = args
    ref_all = json.load(open(ref_file))
    run_all = json.load(open(run_file))
    entries = yaml.safe_load(open(differences_file)) or []
    used = {e["id"]: 0 for e in entries}
    uncovered = []
    broken = []
    for name in sorted(set(ref_all) | set(run_all)):
        ref, run = ref_all.get(name), run_all.get(name)
        if ref is None or run is None:
            broken.append(f"{name}: only one server ran it")
            continue
        for side, records in (("reference", ref), ("runner", run)):
            if isinstance(records, dict):
                broken.append(f"{name}: the {side} run of the scenario broke: {records['failed']}")
        if isinstance(ref, dict) or isinstance(run, dict):
            continue
        found = []
        diff("", normalise(shapes(ref), Ids()), normalise(shapes(run), Ids()), found)
        for path, kind, a, b in found:
            # Paths name the step and its op: `[3:runs.stream].result[5:values].data...`
            path = re.sub(r"^\[(\d+)\]", lambda m: f"[{m.group(1)}:{ref[int(m.group(1))]['op'] if int(m.group(1)) < len(ref) else '?'}]", path)
            hit = [e for e in entries if covered(e, name, path, kind)]
            for e in hit:
                used[e["id"]] += 1
            if not hit:
                uncovered.append((name, path, kind, a, b))
    stale = [e for e, n in used.items() if n == 0]
    for line in broken:
        print(f"[{sdk}] BROKEN {line}")
    for name, path, kind, a, b in uncovered:
        print(f"[{sdk}] {name} {path} ({kind})\n    reference: {show(a)}\n    runner:    {show(b)}")
    if report_file:
        with open(report_file, "w") as f:
            json.dump({"broken": broken, "uncovered": [list(u) for u in uncovered], "used": used}, f, indent=1)
    print(f"[{sdk}] {len(uncovered)} differences not listed as deliberate, {len(broken)} scenarios broken; "
          f"deliberate differences used: {sum(1 for n in used.values() if n)} of {len(used)}")
    return 1 if uncovered or broken else 0


if __name__ == "__main__":
    sys.exit(main())
