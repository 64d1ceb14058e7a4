//! From settings to a run: its checkpointer, its services and the engine requests it makes.

use std::sync::Arc;

use indexmap::IndexMap;
use serde_json::Value;

use super::RunError;
use super::options::{CassetteOption, MockOption};
use super::settings::{Overrides, RunSettings};
use crate::cassette::Cassette;
use crate::checkpoint::Checkpointer;
use crate::compile::Plan;
use crate::engine::RunRequest;
use crate::nodes::Services;
use crate::providers::cassette::{Recording, RecordingEmbedder, Replaying, replaying_embedders};
use crate::providers::mock::MockProvider;
use crate::providers::{Embedder, Provider, Providers};
use crate::spec::ModelProfile;

/// A run, assembled: what `Engine::new` takes besides the plan and the event sink, and what
/// every request of the run carries.
pub struct Run {
    pub store: Arc<dyn Checkpointer>,
    pub services: Services,
    pub overrides: Overrides,
}

impl RunSettings {
    /// The checkpointer and the services of a run of `plan`.
    pub fn build(&self, plan: &Plan) -> Result<Run, RunError> {
        Ok(Run {
            store: self.open_store()?,
            services: self.services(plan)?,
            overrides: self.overrides.clone(),
        })
    }

    /// The checkpointer alone, for a caller that looks at the thread before it has a plan
    /// (`resume` reads the workflow's path from the thread).
    pub fn open_store(&self) -> Result<Arc<dyn Checkpointer>, RunError> {
        self.checkpoints.open(self.durability)
    }

    /// The read-only checkpointer, for looking at threads.
    pub fn open_store_read_only(&self) -> Result<Arc<dyn Checkpointer>, RunError> {
        self.checkpoints.open_read_only()
    }

    /// The providers (a mock, a cassette and `--model` overrides applied), the cassette, the
    /// data store, the web client and the read roots of a run of `plan`.
    pub fn services(&self, plan: &Plan) -> Result<Services, RunError> {
        let mock = match &self.mock {
            None => None,
            Some(MockOption::Empty) => Some(Arc::new(MockProvider::empty())),
            Some(MockOption::Script(script)) => Some(Arc::new(
                MockProvider::from_value(script).map_err(|message| RunError::Mock { path: None, message })?,
            )),
            Some(MockOption::File(path)) => Some(Arc::new(MockProvider::from_file(path).map_err(|message| {
                RunError::Mock {
                    path: Some(path.clone()),
                    message,
                }
            })?)),
        };
        let project: Vec<String> = self
            .project_models
            .iter()
            .filter(|spec| {
                spec.split_once('=')
                    .is_some_and(|(name, _)| plan.models().contains_key(name))
            })
            .cloned()
            .collect();
        let models = override_models(
            plan.models(),
            &[project, self.models.clone()].concat(),
            &self.prices,
            &self.contexts,
        )?;
        let cassette = match &self.cassette {
            Some(CassetteOption::Record(path)) => Some(Arc::new(Cassette::record_with(path, self.env.credentials())?)),
            Some(CassetteOption::Replay(path)) => Some(Arc::new(Cassette::replay_with(path, self.env.credentials())?)),
            None => None,
        };
        let providers = match &cassette {
            // Nothing live is set up: a replay reaches no network and needs no key.
            Some(c) if c.is_replay() => replaying(&models, c),
            _ => {
                // A mock given to the run serves every profile, whatever its provider.
                let override_all = mock.is_some();
                let live = Providers::for_models_in(&models, mock, override_all, &|name| self.env.get(name))?;
                match &cassette {
                    Some(c) => recording(live, c),
                    None => live,
                }
            }
        }
        .traced();
        // A key read from a variable with any name is a secret like the conventional ones, and
        // so are the credentials a project's `.env` holds (the process's are known already).
        for profile in models.values() {
            if let Some(key) = profile.api_key_env.as_deref().and_then(|name| self.env.get(name)) {
                crate::secrets::register(&key);
            }
        }
        for key in self.env.credentials() {
            crate::secrets::register(&key);
        }
        let web = crate::net::Web::new(crate::net::WebConfig {
            allow: self.allow_net.clone(),
            ..Default::default()
        });
        Ok(Services {
            kinds: self.kinds.clone(),
            providers,
            web: Arc::new(web.with_cassette(cassette.clone())),
            cassette,
            data: self.data_store()?,
            read_roots: self.read_roots.clone(),
            env: self.env.clone(),
        })
    }
}

/// Every profile served from the cassette `replay`.
fn replaying(models: &IndexMap<String, ModelProfile>, replay: &Arc<Cassette>) -> Providers {
    let mut providers = Providers::serve_all(models, Arc::new(Replaying::new(replay.clone())));
    for (profile, embedder) in replaying_embedders(replay) {
        providers.set_embedder(&profile, embedder);
    }
    providers
}

/// `live`, with every call and embedding recorded to `cassette`.
fn recording(live: Providers, cassette: &Arc<Cassette>) -> Providers {
    live.wrap(|p| Arc::new(Recording::new(p, cassette.clone())) as Arc<dyn Provider>)
        .wrap_embedders(|name, e| Arc::new(RecordingEmbedder::new(name, e, cassette.clone())) as Arc<dyn Embedder>)
}

/// The plan's model profiles with `PROFILE=SPEC` overrides applied, then `PROFILE=IN,OUT`
/// prices and `PROFILE=TOKENS` context windows.
fn override_models(
    models: &IndexMap<String, ModelProfile>,
    specs: &[String],
    prices: &[String],
    contexts: &[String],
) -> Result<IndexMap<String, ModelProfile>, RunError> {
    let mut models = models.clone();
    for arg in specs {
        let (name, spec) = arg
            .split_once('=')
            .ok_or_else(|| RunError::Model(format!("`{arg}` is not PROFILE=PROVIDER:MODEL[@URL]")))?;
        let profile = profile_mut(&mut models, name)?;
        *profile = crate::providers::override_profile(profile, spec).map_err(RunError::Model)?;
    }
    for arg in prices {
        let (name, price) = arg
            .split_once('=')
            .ok_or_else(|| RunError::Model(format!("`{arg}` is not PROFILE=IN,OUT")))?;
        let pricing = crate::providers::parse_price(price).map_err(RunError::Model)?;
        profile_mut(&mut models, name)?.pricing = Some(pricing);
    }
    for arg in contexts {
        let bad = || {
            RunError::Model(format!(
                "`{arg}` is not PROFILE=TOKENS (a context window, e.g. default=4096)"
            ))
        };
        let (name, tokens) = arg.split_once('=').ok_or_else(bad)?;
        let tokens = tokens.trim().parse::<u32>().ok().filter(|t| *t > 0).ok_or_else(bad)?;
        profile_mut(&mut models, name)?.context = Some(tokens);
    }
    Ok(models)
}

impl RunSettings {
    /// What a person should know about the prices of this run's models: each profile that
    /// `--model` points at a model whose price is unknown, so its calls count as costing
    /// nothing (and a cost cap never triggers).
    pub fn price_notes(&self, plan: &Plan) -> Vec<String> {
        let Ok(models) = override_models(plan.models(), &self.models, &self.prices, &self.contexts) else {
            return Vec::new();
        };
        self.models
            .iter()
            .filter_map(|arg| arg.split_once('='))
            .filter(|(name, _)| models.get(*name).is_some_and(|p| p.pricing.is_none()))
            .map(|(name, spec)| {
                format!(
                    "model profile `{name}` is served by `{spec}`, whose price is unknown: its calls count as costing 0; give one with `--price {name}=IN,OUT` (per million tokens)"
                )
            })
            .collect()
    }
}

/// The profile `name` of `models`, or an error naming the profiles there are.
fn profile_mut<'a>(
    models: &'a mut IndexMap<String, ModelProfile>,
    name: &str,
) -> Result<&'a mut ModelProfile, RunError> {
    if !models.contains_key(name) {
        let known: Vec<&str> = models.keys().map(String::as_str).collect();
        return Err(RunError::Model(format!(
            "the workflow has no model profile `{name}` (its profiles: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    }
    models
        .get_mut(name)
        .ok_or_else(|| RunError::Model(format!("the workflow has no model profile `{name}`")))
}

/// What a run of a workflow is started with: on a new thread, its input and context; on an
/// existing one, its input starts a new turn when given, else the thread continues.
#[derive(Debug, Clone, Default)]
pub struct Start {
    /// The thread to continue, or the id of a new one (none: a new id).
    pub thread_id: Option<String>,
    /// The workflow's path, recorded with a new thread.
    pub workflow: String,
    pub input: Value,
    /// Whether `input` was given (an empty object otherwise).
    pub input_given: bool,
    pub context: Value,
    /// `path=value` overrides of the workflow's `config`, recorded with a new thread.
    pub config: Vec<(String, Value)>,
}

impl Overrides {
    /// The request that starts or continues a thread per `start`. Whether the thread exists
    /// is the engine's to tell, under the thread's lease: a new one is created with the
    /// context and the input (an empty one when none was given); an existing one starts a new
    /// turn when input was given and continues otherwise, keeping its context.
    pub fn start(&self, start: Start) -> RunRequest {
        RunRequest {
            thread_id: start.thread_id,
            workflow: start.workflow,
            input: start.input_given.then_some(start.input),
            context: Some(start.context),
            config: start.config,
            ..self.request()
        }
    }

    /// The request that answers the thread's pending interrupt (`answer_to`: which, when several
    /// wait), or continues it without an answer.
    pub fn answer(
        &self,
        thread_id: String,
        workflow: String,
        answer: Option<Value>,
        answer_to: Option<String>,
    ) -> RunRequest {
        RunRequest {
            thread_id: Some(thread_id),
            workflow,
            answer,
            answer_to,
            ..self.request()
        }
    }

    /// A run's overrides of `workflow_config` (the workflow's `config`): these settings'
    /// (`runner serve --set`) whose path the workflow has, then the run's own (`per_run`, a
    /// served run's `config.configurable`), which win.
    pub fn run_config(&self, workflow_config: &Value, per_run: Vec<(String, Value)>) -> Vec<(String, Value)> {
        self.config
            .iter()
            .filter(|(path, _)| config_has(workflow_config, path))
            .cloned()
            .chain(per_run)
            .collect()
    }

    fn request(&self) -> RunRequest {
        RunRequest {
            lease: self.lease.clone(),
            recursion_limit: self.recursion_limit,
            persist: self.persist,
            force: self.force,
            ..RunRequest::default()
        }
    }
}

/// Whether `config` (a workflow's `config`) has the dotted `path`.
pub fn config_has(config: &Value, path: &str) -> bool {
    path.split('.').try_fold(config, |v, key| v.get(key)).is_some()
}
