//! The stable diagnostic codes. A code never changes meaning once released; retired codes are
//! not reused. docs/diagnostics.md lists them with examples (a test keeps it complete).

use serde::Serialize;

use super::Severity;

macro_rules! codes {
    ($($variant:ident = $code:literal, $name:literal, $sev:ident, $summary:literal;)*) => {
        /// A stable diagnostic code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code { $($variant),* }

        impl Code {
            /// Every code, in order.
            pub const ALL: &[Code] = &[$(Code::$variant),*];

            /// The code, e.g. `E201`.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $code),* }
            }

            /// A short kebab-case name, e.g. `unknown-kind`.
            pub fn name(self) -> &'static str {
                match self { $(Code::$variant => $name),* }
            }

            /// The severity a problem of this code has.
            pub fn severity(self) -> Severity {
                match self { $(Code::$variant => Severity::$sev),* }
            }

            /// One line on what the code means.
            pub fn summary(self) -> &'static str {
                match self { $(Code::$variant => $summary),* }
            }
        }
    };
}

codes! {
    // Reading the file.
    Io = "E001", "io", Error, "the file could not be read";
    NotUtf8 = "E002", "not-utf8", Error, "the file is not UTF-8 text";
    Empty = "E003", "empty-file", Error, "the file holds no YAML document";
    TooLarge = "E004", "file-too-large", Error, "the file is larger than a workflow may be";
    YamlSyntax = "E005", "yaml-syntax", Error, "the YAML does not parse";
    DuplicateKey = "E006", "duplicate-key", Error, "a mapping has the same key twice";
    TooDeep = "E007", "too-deep", Error, "values are nested deeper than a workflow may nest them";
    AliasBomb = "E008", "alias-expansion", Error, "anchors and aliases expand to too many values";
    MultipleDocuments = "E009", "multiple-documents", Error, "the file holds more than one YAML document";
    UnsupportedYaml = "E010", "unsupported-yaml", Error, "a YAML feature with no JSON equivalent (tags, complex keys, NaN)";
    // The schema.
    UnknownField = "E100", "unknown-field", Error, "a field the schema does not know";
    WrongType = "E101", "wrong-type", Error, "a value of the wrong type";
    MissingField = "E102", "missing-field", Error, "a required field is missing";
    InvalidValue = "E103", "invalid-value", Error, "a value the schema does not allow";
    // Names.
    UnknownNode = "E200", "unknown-node", Error, "an edge, route or handler names a node that does not exist";
    UnknownKind = "E201", "unknown-kind", Error, "a node or kind extends a kind that does not exist";
    UnknownReducer = "E202", "unknown-reducer", Error, "a state key names a reducer that does not exist";
    UnknownPredicate = "E203", "unknown-predicate", Error, "a condition names a predicate that does not exist";
    UnknownModel = "E204", "unknown-model", Error, "a node names a model profile that does not exist";
    UnknownType = "E205", "unknown-type", Error, "a `$ref` names a type that does not exist";
    MissingPrompt = "E206", "missing-prompt", Error, "a prompt file does not exist";
    MissingFile = "E207", "missing-file", Error, "an imported, subgraph or schema file does not exist";
    ImportCycle = "E208", "import-cycle", Error, "files import or embed each other in a cycle";
    DuplicateName = "E209", "duplicate-name", Error, "two definitions share a name";
    ReservedName = "E210", "reserved-name", Error, "a name that is reserved or malformed";
    UnknownStateKey = "E211", "unknown-state-key", Error, "a write or output names a state key that is not declared";
    KindCycle = "E212", "kind-cycle", Error, "user kinds extend each other in a cycle";
    BadImport = "E213", "bad-import", Error, "an imported file defines nodes, edges or tools";
    BadParams = "E214", "bad-params", Error, "a node's params do not fit its kind's parameters";
    BadHandoff = "E215", "bad-handoff", Error, "a subgraph hands off to a node or writes a key its parent workflow does not have";
    InputFeed = "E216", "input-feed", Error, "a state key is fed from an input field the input schema does not declare";
    UnknownTool = "E217", "unknown-tool", Error, "a node names a tool the workflow does not declare";
    UnpricedCostCap = "W218", "unpriced-cost-cap", Warning, "a cost cap over a model profile that has no `pricing`, so the cap never triggers";
    NoRoomForPrompt = "E219", "no-room-for-prompt", Error, "a node's completion cap is as large as its model profile's context window, leaving no room for the prompt";
    McpLockMissing = "E220", "mcp-lock-missing", Error, "an MCP server's tools are not in the workflow's lock file (`runner mcp lock` writes it)";
    McpLockStale = "E221", "mcp-lock-stale", Error, "an MCP server's configuration changed since the lock file was written";
    UnknownMcpTool = "E222", "unknown-mcp-tool", Error, "a `tools:` entry imports a tool its MCP server does not list";
    ReplyOverMaxTokens = "W223", "reply-over-max-tokens", Warning, "a node's output schema allows a reply longer than its `max_tokens`, so a reply that uses the schema's bounds is cut";
    // Expressions, templates and types.
    ExprSyntax = "E300", "expression-syntax", Error, "an expression does not parse";
    TemplateSyntax = "E301", "template-syntax", Error, "a template does not parse";
    UndeclaredVariable = "E302", "undeclared-variable", Error, "an expression or template reads something that is not declared";
    ReducerType = "E303", "reducer-type", Error, "a reducer does not fit its key's type";
    ForeachNotArray = "E304", "foreach-not-array", Error, "a fan-out iterates over something that is not an array";
    DefaultType = "E305", "default-type", Error, "a default value does not match its schema";
    InterruptResponse = "E306", "interrupt-response", Error, "an interrupt gate has no usable response schema";
    BadSchema = "E307", "bad-schema", Error, "a JSON Schema is not valid";
    BadInterpolation = "E308", "bad-interpolation", Error, "a `${env:...}` interpolation is malformed";
    BadDuration = "E309", "bad-duration", Error, "a duration does not parse";
    UnknownFilter = "E310", "unknown-filter", Error, "an expression or template uses a filter, test or function that does not exist";
    ReducerBypass = "E311", "reducer-bypass", Error, "a write bypasses its key's reducer where it cannot: `remove_all_messages()` on a key that does not hold messages, or `overwrite(...)` in a fanned-out node";
    // The graph.
    BadEdge = "E400", "bad-edge", Error, "an edge is malformed";
    NoEntry = "E401", "no-entry", Error, "START has no outgoing edge";
    Unreachable = "E402", "unreachable", Error, "a node can never run";
    NoExit = "E403", "no-exit", Error, "END cannot be reached from a node: a loop with no way out";
    WriteConflict = "E404", "write-conflict", Error, "nodes that can run in one superstep write a key that has no reducer";
    NoDefaultRoute = "W405", "no-default-route", Warning, "a route whose conditions may all be false";
    // W406 `dead-end` (a warning for a node with no outgoing edge) is retired: that is E408.
    RouteOrder = "E407", "route-order", Error, "a default clause that is not last makes later clauses dead";
    SilentEnd = "E408", "silent-end", Error, "a node with no outgoing edge, not marked as an end with `-> END`";
    DeadJoin = "E409", "dead-join", Error, "a join waits for a node that can run only after the join";
    BadDefer = "E410", "bad-defer", Error, "`defer` on a node whose tasks cannot be deferred";
    BadCache = "E411", "bad-cache", Error, "`cache` on a node whose result cannot be reused: an interrupt gate, or a tool's `run` node";
    ReplacedInLoop = "W412", "replaced-in-loop", Warning, "a node in a loop writes a one-item list to a key that replaces, so each pass drops what the last one wrote";
    // Serving.
    BadRoute = "E500", "bad-route", Error, "a `serve` route is malformed: its path, a clash with another route, or `stream` beside `respond`";
    BadSchedule = "E501", "bad-schedule", Error, "a `serve` schedule is malformed: its cron expression, time zone, end, input, config or webhook";
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
