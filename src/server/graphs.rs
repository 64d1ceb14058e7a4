//! The served workflows: one graph per workflow file of the folder (and per file of its
//! subfolders that declares `serve:`), each with LangGraph's system assistant (id
//! `uuid5(NAMESPACE, graph_id)`), its picture and its schemas, and its own routes; reloaded
//! from the folder on demand (SIGHUP, or `runner dev`'s watcher). `GET /runner/workflows` says
//! what is served and why a file is not (its diagnostics, with file, line and column).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::Json;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::Shared;
use super::http::{ApiError, JsonBody};
use crate::compile::Plan;
use crate::diag::{self, Format};

/// The namespace LangGraph derives its system assistants' ids from.
const NAMESPACE: uuid::Uuid = uuid::uuid!("6ba7b821-9dad-11d1-80b4-00c04fd430c8");

/// The id of the system assistant of `graph_id`, as LangGraph's server makes it.
pub fn assistant_id(graph_id: &str) -> String {
    uuid::Uuid::new_v5(&NAMESPACE, graph_id.as_bytes()).to_string()
}

/// A served workflow.
pub struct Graph {
    /// The file's stem (in a subfolder: its path below the folder, `-` for `/`).
    pub graph_id: String,
    pub assistant_id: String,
    /// The file, absolute: recorded with the threads the graph starts.
    pub path: PathBuf,
    pub plan: Arc<Plan>,
    /// When the server first served it, as assistants report `created_at`.
    created_at: String,
    /// When the server last loaded it (its start, or the reload that changed it).
    loaded_at: String,
    /// Its assistant's `version`: 1, plus one for every reload that changed it.
    version: u64,
    /// Every file its compilation read: the workflow, its imports and subgraphs, its prompts.
    files: Vec<PathBuf>,
}

/// A workflow file that is not served, and why: in short (`does not validate`), and in full
/// (its diagnostics, rendered).
#[derive(Debug, Clone)]
pub struct Rejected {
    pub path: PathBuf,
    pub reason: &'static str,
    pub why: String,
    /// The diagnostics as data: `{code, severity, message, file, line, col, help?}`.
    pub diagnostics: Vec<Value>,
    /// Every file its compilation read.
    pub files: Vec<PathBuf>,
}

/// What the last load or reload of the folder found.
#[derive(Debug, Default)]
struct Loaded {
    /// The folder served.
    dir: PathBuf,
    rejected: Vec<Rejected>,
    /// Of `rejected`, those whose previous version is still served.
    kept: Vec<PathBuf>,
    at: String,
}

/// Every served graph, in file-name order. A run holds the graph it started with: a reload
/// swaps the list, never a graph under a run.
#[derive(Default)]
pub struct Graphs {
    graphs: RwLock<Vec<Arc<Graph>>>,
    loaded: RwLock<Loaded>,
}

/// What a reload changed.
#[derive(Debug, Default)]
pub struct Reloaded {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
    /// Files that do not validate: a graph served before keeps its previous version (its
    /// file is in `kept`); a new file is not served.
    pub rejected: Vec<Rejected>,
    pub kept: Vec<PathBuf>,
}

impl Graphs {
    pub(crate) fn all(&self) -> Vec<Arc<Graph>> {
        // A writer never panics while holding the lock (it only swaps a vector).
        self.graphs.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The graph an assistant id or a graph id names.
    pub fn find(&self, id: &str) -> Option<Arc<Graph>> {
        self.all()
            .into_iter()
            .find(|g| g.assistant_id == id || g.graph_id == id)
    }

    /// The graph whose workflow file a thread records.
    pub(crate) fn of_workflow(&self, workflow: &str) -> Option<Arc<Graph>> {
        self.all().into_iter().find(|g| g.path.as_os_str() == workflow)
    }

    /// Every file the served and rejected workflows' compilations read, and the folder's
    /// files: what a change to should reload the folder.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.all().iter().flat_map(|g| g.files.clone()).collect();
        let loaded = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        files.extend(loaded.rejected.iter().flat_map(|r| r.files.clone()));
        files.sort();
        files.dedup();
        files
    }

    /// `GET /runner/workflows`: what is served, what is not and why, when the folder was
    /// last read; `dev` says whether a watcher reloads it.
    pub(crate) fn report(&self, dev: bool) -> Value {
        let loaded = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        let shown = |path: &Path| shown_path(&loaded.dir, path);
        let graphs: Vec<Value> = self
            .all()
            .iter()
            .map(|g| {
                let mut v = json!({"graph_id": g.graph_id, "assistant_id": g.assistant_id,
                                   "file": shown(&g.path), "name": g.plan.name(), "version": g.version});
                if let Some(d) = g.plan.description() {
                    v["description"] = json!(d);
                }
                v
            })
            .collect();
        let rejected: Vec<Value> = loaded
            .rejected
            .iter()
            .map(|r| {
                let diagnostics: Vec<Value> = r
                    .diagnostics
                    .iter()
                    .map(|d| {
                        let mut d = d.clone();
                        if let Some(file) = d.get("file").and_then(Value::as_str) {
                            d["file"] = json!(shown(Path::new(file)));
                        }
                        d
                    })
                    .collect();
                json!({"file": shown(&r.path), "reason": r.reason, "diagnostics": diagnostics,
                       "previous_version_served": loaded.kept.contains(&r.path)})
            })
            .collect();
        json!({"graphs": graphs, "rejected": rejected, "reloaded_at": loaded.at, "dev": dev})
    }

    fn record(&self, dir: &Path, rejected: &[Rejected], kept: Vec<PathBuf>) {
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = Loaded {
            dir: std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()),
            rejected: rejected.to_vec(),
            kept,
            at: crate::clock::now(),
        };
    }

    pub fn ids(&self) -> Vec<String> {
        self.all().iter().map(|g| g.graph_id.clone()).collect()
    }

    /// Every route the graphs declare of their own: `(method, path, graph id)`.
    pub fn routes(&self) -> Vec<(String, String, String)> {
        self.all()
            .iter()
            .flat_map(|g| {
                g.plan.routes().iter().map(|r| {
                    (
                        format!("{:?}", r.method).to_uppercase(),
                        r.path.clone(),
                        g.graph_id.clone(),
                    )
                })
            })
            .collect()
    }

    /// Loads `dir` again: new files are served, changed ones recompiled, removed ones dropped.
    /// A file that stops validating keeps serving its previous version, so that a mistake
    /// made while editing a served workflow does not take it away from its clients; it is
    /// reported, and replaced once it validates again.
    pub fn reload(&self, dir: &Path) -> std::io::Result<Reloaded> {
        let (fresh, rejected) = load(dir)?;
        let old = self.all();
        let mut report = Reloaded::default();
        let mut next: Vec<Arc<Graph>> = Vec::new();
        for g in fresh.all() {
            match old.iter().find(|o| o.graph_id == g.graph_id) {
                // The plan's hash covers what it was compiled from: the workflow, its imports,
                // subgraphs, prompts and schema files. The same hash keeps the graph as it is.
                Some(o) if o.plan.hash() == g.plan.hash() => next.push(o.clone()),
                Some(o) => {
                    report.changed.push(g.graph_id.clone());
                    next.push(Arc::new(Graph {
                        graph_id: g.graph_id.clone(),
                        assistant_id: g.assistant_id.clone(),
                        path: g.path.clone(),
                        plan: g.plan.clone(),
                        created_at: o.created_at.clone(),
                        loaded_at: g.loaded_at.clone(),
                        version: o.version + 1,
                        files: g.files.clone(),
                    }));
                }
                None => {
                    report.added.push(g.graph_id.clone());
                    next.push(g);
                }
            }
        }
        for r in rejected {
            if let Some(o) = old.iter().find(|o| o.path == r.path) {
                report.kept.push(o.path.clone());
                next.push(o.clone());
            }
            report.rejected.push(r);
        }
        for o in &old {
            if !next.iter().any(|g| g.graph_id == o.graph_id) {
                report.removed.push(o.graph_id.clone());
            }
        }
        next.sort_by(|a, b| a.path.cmp(&b.path));
        *self.graphs.write().unwrap_or_else(|p| p.into_inner()) = next;
        self.record(dir, &report.rejected, report.kept.clone());
        Ok(report)
    }
}

/// Whether `path` is a workflow: a YAML file that is not a test file or a mock script.
fn is_workflow(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    path.is_file() && crate::spec::load::is_workflow_file_name(name)
}

/// The workflows of `dir` to serve: every workflow file in it, and those of its subfolders (at
/// any depth) that declare `serve:` (the others are parts: subgraphs, tools). Each with its
/// graph id: the file's stem, or its path below `dir` with `-` for `/`
/// (`mindmap/expand.yaml` is `mindmap-expand`).
fn served_files(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut folders = vec![(dir.to_path_buf(), String::new())];
    while let Some((folder, prefix)) = folders.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&folder)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for path in entries {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            if path.is_dir() {
                // Hidden folders (`.git`, editors' own) hold no workflows.
                if !name.starts_with('.') {
                    folders.push((path, format!("{prefix}{name}-")));
                }
                continue;
            }
            if !is_workflow(&path) || (!prefix.is_empty() && !declares_serve(&path)) {
                continue;
            }
            let stem = name.trim_end_matches(".yaml").trim_end_matches(".yml");
            out.push((format!("{prefix}{stem}"), path));
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

/// Whether the workflow file at `path` has a `serve:` section (one that does not parse has none:
/// a part of another workflow is not reported for it).
fn declares_serve(path: &Path) -> bool {
    crate::spec::load::read(path)
        .ok()
        .and_then(|file| crate::spec::load::parse(file).ok())
        .is_some_and(|doc| doc.value.get("serve").is_some())
}

pub(super) fn load(dir: &Path) -> std::io::Result<(Graphs, Vec<Rejected>)> {
    let files = served_files(dir)?;
    let kinds = crate::nodes::builtin().decls();
    let mut graphs: Vec<Arc<Graph>> = Vec::new();
    let mut rejected = Vec::new();
    for (graph_id, file) in files {
        let path = std::fs::canonicalize(&file).unwrap_or(file);
        let (plan, result) = crate::compile::compile_file(&path, &kinds);
        let mut files: Vec<PathBuf> = result.files.paths().map(Path::to_path_buf).collect();
        if !files.contains(&path) {
            files.push(path.clone());
        }
        let Some(plan) = plan else {
            rejected.push(Rejected {
                reason: "does not validate",
                why: diag::render(&result.diagnostics, &result.files, Format::Human),
                diagnostics: diagnostics(&result.diagnostics),
                files,
                path,
            });
            continue;
        };
        let clash = |why: String, path: PathBuf, files: Vec<PathBuf>| Rejected {
            reason: "clashes with another served workflow",
            diagnostics: vec![json!({"code": "clash", "severity": "error", "message": why,
                                     "file": path.display().to_string(), "line": null, "col": null})],
            why: format!("  {why}\n"),
            files,
            path,
        };
        if let Some(other) = graphs.iter().find(|g| g.graph_id == graph_id) {
            let why = format!("its graph id `{graph_id}` is {}'s already", other.path.display());
            rejected.push(clash(why, path, files));
            continue;
        }
        if let Some(why) = route_clash(&graphs, &plan) {
            rejected.push(clash(why, path, files));
            continue;
        }
        let now = crate::clock::now();
        graphs.push(Arc::new(Graph {
            assistant_id: assistant_id(&graph_id),
            graph_id,
            path,
            plan,
            created_at: now.clone(),
            loaded_at: now,
            version: 1,
            files,
        }));
    }
    let loaded = Graphs {
        graphs: RwLock::new(graphs),
        loaded: RwLock::default(),
    };
    loaded.record(dir, &rejected, Vec::new());
    Ok((loaded, rejected))
}

/// The diagnostics of a file that does not validate, as `GET /runner/workflows` shows them.
fn diagnostics(diags: &[diag::Diagnostic]) -> Vec<Value> {
    diag::render_json_value(diags)["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            let mut v = json!({
                "code": d["code"], "severity": d["severity"], "message": d["message"], "file": d["file"],
                "line": d["line"], "col": d["column"],
            });
            if !d["help"].is_null() {
                v["help"] = d["help"].clone();
            }
            v
        })
        .collect()
}

/// `path` below the served folder `dir` when it is there (`chain.yaml`), else as it is.
fn shown_path(dir: &Path, path: &Path) -> String {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    canonical
        .strip_prefix(dir)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string())
}

/// `GET /runner/workflows`.
pub(super) async fn workflows(State(app): State<Shared>) -> Json<Value> {
    Json(app.graphs.report(app.dev))
}

/// Why `plan`'s routes cannot be served beside `graphs`': one of them answers a request
/// another graph's route answers already.
fn route_clash(graphs: &[Arc<Graph>], plan: &Plan) -> Option<String> {
    for route in plan.routes() {
        for g in graphs {
            if let Some(other) =
                g.plan.routes().iter().find(|r| {
                    r.method == route.method && crate::compile::routes::same_shape(&r.segments, &route.segments)
                })
            {
                return Some(format!(
                    "its route `{:?} {}` answers what {}'s route `{}` answers already",
                    route.method,
                    route.path,
                    g.path.display(),
                    other.path
                ));
            }
        }
    }
    None
}

fn assistant(g: &Graph) -> Value {
    json!({
        "assistant_id": g.assistant_id,
        "graph_id": g.graph_id,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "name": g.graph_id,
        "description": g.plan.description(),
        "version": g.version,
        "created_at": g.created_at,
        "updated_at": g.loaded_at,
    })
}

fn find(app: &Shared, id: &str) -> Result<Arc<Graph>, ApiError> {
    app.graphs
        .find(id)
        .ok_or_else(|| ApiError::not_found(format!("Assistant '{id}' not found")))
}

#[derive(Deserialize)]
pub(super) struct Search {
    graph_id: Option<String>,
    name: Option<String>,
    #[serde(default)]
    metadata: Map<String, Value>,
    #[serde(default = "ten")]
    limit: usize,
    #[serde(default)]
    offset: usize,
}

fn ten() -> usize {
    10
}

pub(super) async fn search(State(app): State<Shared>, JsonBody(q): JsonBody<Search>) -> Result<Json<Value>, ApiError> {
    let system = json!({"created_by": "system"});
    let found: Vec<Value> = app
        .graphs
        .all()
        .iter()
        .filter(|g| q.graph_id.as_ref().is_none_or(|id| *id == g.graph_id))
        .filter(|g| q.name.as_ref().is_none_or(|n| g.graph_id.contains(n.as_str())))
        .filter(|_| q.metadata.iter().all(|(k, v)| system.get(k) == Some(v)))
        .skip(q.offset)
        .take(q.limit)
        .map(|g| assistant(g))
        .collect();
    Ok(Json(Value::Array(found)))
}

pub(super) async fn get_assistant(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, ApiError> {
    let g = find(&app, &id)?;
    Ok(Json(assistant(&g)))
}

#[derive(Deserialize)]
pub(super) struct GraphQuery {
    xray: Option<String>,
}

/// The plan as LangGraph draws a graph (`{nodes, edges}`, [`crate::compile::picture::langgraph_json`]);
/// `?xray=true` (or a depth) expands its subgraphs, as LangGraph's server does.
pub(super) async fn get_graph(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<GraphQuery>,
) -> Result<Json<Value>, ApiError> {
    let g = find(&app, &id)?;
    let xray = crate::compile::picture::Xray::parse(q.xray.as_deref().unwrap_or_default())
        .ok_or_else(|| ApiError::invalid("Invalid xray value"))?;
    Ok(Json(crate::compile::picture::langgraph_json(&g.plan, xray)))
}

/// The input, output, state and context schemas of the workflow.
pub(super) async fn get_schemas(
    State(app): State<Shared>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Value>, ApiError> {
    let g = find(&app, &id)?;
    let plan = &g.plan;
    let object = |keys: &mut dyn Iterator<Item = (&String, &Value)>| {
        let properties: Map<String, Value> = keys.map(|(k, s)| (k.clone(), s.clone())).collect();
        json!({"type": "object", "properties": properties})
    };
    let state = object(&mut plan.state().iter().map(|(k, c)| (k, &c.schema)));
    let output = match &plan.output() {
        Some(keys) => object(
            &mut plan
                .state()
                .iter()
                .filter(|(k, _)| keys.contains(k))
                .map(|(k, c)| (k, &c.schema)),
        ),
        None => state.clone(),
    };
    Ok(Json(json!({
        "graph_id": g.graph_id,
        "input_schema": plan.input_schema(),
        "output_schema": output,
        "state_schema": state,
        "config_schema": null,
        "context_schema": plan.context_schema(),
    })))
}

#[derive(Deserialize)]
pub(super) struct CacheQuery {
    node: Option<String>,
}

/// `DELETE /assistants/{id}/cache[?node=NAME]`: the cached results of the assistant's workflow
/// (of one of its nodes) deleted, for every thread; a node the workflow lacks is a 404.
pub(super) async fn clear_cache(
    State(app): State<Shared>,
    axum::Extension(caller): axum::Extension<super::auth::Caller>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<CacheQuery>,
) -> Result<StatusCode, ApiError> {
    // Every user's runs share the cache: only an admin empties it.
    if caller.restricted() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "Only an admin may clear an assistant's cache",
        ));
    }
    let g = find(&app, &id)?;
    if let Some(node) = &q.node
        && g.plan.node_by_name(node).is_none()
    {
        return Err(ApiError::not_found(format!(
            "Node '{node}' not found in assistant '{id}'"
        )));
    }
    app.store
        .cache_clear(Some(g.plan.name()), q.node.as_deref(), crate::clock::now_ms())?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    #[test]
    fn assistant_ids_are_langgraphs() {
        // The id LangGraph's server gives the system assistant of a graph named `agent`.
        assert_eq!(super::assistant_id("agent"), "fe096781-5601-53d2-b2f6-0d3403f7e9ca");
    }
}
