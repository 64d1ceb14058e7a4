//! Who calls the server, and what they may see: the caller of every request, found once by a
//! middleware from its credentials — the shared API key, a JWT bearer token (verified against
//! a JWKS or an HS256 secret, `jwt.rs`), or a per-user API key stored hashed in the checkpoint
//! database (`keys.rs`) — and the rules every handler applies with it (`owner.rs`): what a user
//! creates is stamped with their id, and what another user owns answers 404, as LangGraph's
//! servers answer a resource their auth handlers filter out. Quotas are `quota.rs`'s.
//!
//! A server with no credential configured, and the holder of the shared key, call as an admin
//! with no identity: nothing is stamped or filtered, as before users existed.

mod jwt;
pub mod keys;
pub(crate) mod owner;
pub mod quota;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub use jwt::{JwtConfig, JwtKeys};
pub use quota::Quotas;

use super::http::ApiError;
use crate::checkpoint::Checkpointer;

/// How a server knows its callers. Every part is optional; none at all is an open server
/// (which `runner serve` allows on loopback only).
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    /// The one shared key (`--api-key-env`): its holder is an admin.
    pub api_key: Option<String>,
    /// Bearer tokens.
    pub jwt: Option<JwtConfig>,
    /// Per-user API keys (`runner users add`), sent as `x-api-key`.
    pub user_keys: bool,
    /// Per-user budgets over a window.
    pub quotas: Option<Quotas>,
}

impl AuthConfig {
    /// Whether any credential is required.
    pub fn required(&self) -> bool {
        self.api_key.is_some() || self.jwt.is_some() || self.user_keys
    }
}

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// The user's id: what they create is stamped with it. None: the shared key's holder, or
    /// anyone on a server without credentials.
    pub user: Option<String>,
    /// Sees and may change everything.
    pub admin: bool,
}

impl Caller {
    /// The caller of a server without credentials, or holding the shared key.
    pub(crate) fn anonymous_admin() -> Caller {
        Caller {
            user: None,
            admin: true,
        }
    }
}

/// The server's side of authentication: the configuration, the JWKS cache, the store of
/// per-user keys.
pub(crate) struct Auth {
    config: AuthConfig,
    jwt: Option<jwt::Verifier>,
    store: Arc<dyn Checkpointer>,
}

impl Auth {
    pub(crate) fn new(config: AuthConfig, store: Arc<dyn Checkpointer>) -> Auth {
        Auth {
            jwt: config.jwt.clone().map(jwt::Verifier::new),
            config,
            store,
        }
    }

    pub(crate) fn quotas(&self) -> Option<&Quotas> {
        self.config.quotas.as_ref()
    }

    /// The caller a request's headers name, or why it is refused.
    async fn caller(&self, headers: &axum::http::HeaderMap) -> Result<Caller, ApiError> {
        if !self.config.required() {
            return Ok(Caller::anonymous_admin());
        }
        let api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim);
        if let Some(given) = api_key.or(bearer)
            && let Some(shared) = &self.config.api_key
            && same(given.as_bytes(), shared.as_bytes())
        {
            return Ok(Caller::anonymous_admin());
        }
        if let Some(key) = api_key {
            return self.by_user_key(key);
        }
        match bearer {
            Some(token) if self.config.user_keys && keys::looks_like_key(token) => self.by_user_key(token),
            Some(token) => match &self.jwt {
                Some(verifier) => verifier.verify(token).await,
                None => Err(unauthorized("Invalid API key")),
            },
            None => Err(unauthorized(
                "Missing credentials: send a bearer token as Authorization: Bearer, or an API key as x-api-key",
            )),
        }
    }

    fn by_user_key(&self, key: &str) -> Result<Caller, ApiError> {
        if !self.config.user_keys {
            return Err(unauthorized("Invalid API key"));
        }
        match self.store.find_api_key(&keys::hash(key))? {
            Some(k) if k.revoked_at.is_none() => Ok(Caller {
                user: Some(k.user),
                admin: k.admin,
            }),
            // Unknown and revoked keys are told apart to nobody.
            _ => Err(unauthorized("Invalid API key")),
        }
    }
}

pub(crate) fn unauthorized(detail: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, detail)
}

/// Paths anyone may request, with or without credentials: the health check, the server's
/// description, and the page's static assets (`/` and `/studio/…`). A new open path is added
/// here and nowhere else.
pub(crate) fn is_open(method: &Method, path: &str) -> bool {
    let read = method == Method::GET || method == Method::HEAD;
    matches!(path, "/ok" | "/info") || (read && super::studio::is_page(path))
}

/// Finds the caller of every request (CORS preflights and [`is_open`] paths need none) and
/// hands it to the handlers as a request extension; a request without a valid credential is a
/// 401.
pub(crate) async fn authenticate(State(app): State<super::Shared>, mut request: Request, next: Next) -> Response {
    if request.method() == Method::OPTIONS || is_open(request.method(), request.uri().path()) {
        // Nobody in particular: a handler that needs a caller finds none here, unless the
        // server asks for no credential at all.
        if !app.auth.config.required() {
            request.extensions_mut().insert(Caller::anonymous_admin());
        }
        return next.run(request).await;
    }
    match app.auth.caller(request.headers()).await {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(e) => {
            let mut response = e.into_response();
            if response.status() == StatusCode::UNAUTHORIZED {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}

/// Whether two secrets are equal, in a time that does not tell how much of them matched.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
