//! Bearer tokens: JWTs verified by `jsonwebtoken` against the keys of a JWKS (fetched through
//! the product's HTTP client and cached: fetched again when the cache is older than its
//! lifetime, or when a token names a key id the cache does not have — at most once per
//! `jwks_min_refresh`, so tokens with made-up key ids cannot make the server hammer the
//! identity provider) or an HS256 secret. The caller's id is a claim (`sub` by default); an
//! admin is a token whose admin claim (a dotted path, e.g. `role` or `realm_access.roles`)
//! equals, or is a list holding, the admin value.

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation, decode, decode_header};
use serde_json::Value;

use super::{Caller, unauthorized};
use crate::server::http::ApiError;

/// Where a token's signing keys come from.
#[derive(Debug, Clone, PartialEq)]
pub enum JwtKeys {
    /// A JWKS document's URL.
    Jwks(String),
    /// An HS256 shared secret.
    Secret(String),
}

/// How bearer tokens are verified and read.
#[derive(Debug, Clone, PartialEq)]
pub struct JwtConfig {
    pub keys: JwtKeys,
    /// The `iss` a token must carry, when set.
    pub issuer: Option<String>,
    /// The `aud` a token must carry one of, when any.
    pub audience: Vec<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// The claim that holds the user's id.
    pub user_claim: String,
    /// The claim (a dotted path) that marks an admin, and the value that does.
    pub admin_claim: String,
    pub admin_value: String,
    /// How long a fetched JWKS is used before it is fetched again.
    pub jwks_cache: Duration,
    /// The least time between two fetches of the JWKS for an unknown key id.
    pub jwks_min_refresh: Duration,
}

impl JwtConfig {
    /// Keys from `keys`, every other setting its default.
    pub fn new(keys: JwtKeys) -> JwtConfig {
        JwtConfig {
            keys,
            issuer: None,
            audience: Vec::new(),
            leeway: Duration::from_secs(30),
            user_claim: "sub".into(),
            admin_claim: "role".into(),
            admin_value: "admin".into(),
            jwks_cache: Duration::from_secs(300),
            jwks_min_refresh: Duration::from_secs(10),
        }
    }
}

/// The JWKS as last fetched.
#[derive(Default)]
struct Cached {
    keys: Option<JwkSet>,
    fetched: Option<Instant>,
    /// The last fetch, successful or not.
    tried: Option<Instant>,
}

pub(super) struct Verifier {
    config: JwtConfig,
    client: reqwest::Client,
    jwks: tokio::sync::Mutex<Cached>,
}

/// Why a token is refused, told to the client: an expired token is worth a new one; for any
/// other defect (signature, issuer, audience, key, shape) which one failed helps only an
/// attacker.
fn invalid() -> ApiError {
    unauthorized("Invalid token")
}

impl Verifier {
    pub(super) fn new(config: JwtConfig) -> Verifier {
        let client = crate::net::client_builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        Verifier {
            config,
            client,
            jwks: tokio::sync::Mutex::new(Cached::default()),
        }
    }

    pub(super) async fn verify(&self, token: &str) -> Result<Caller, ApiError> {
        let header = decode_header(token).map_err(|_| invalid())?;
        let key = match &self.config.keys {
            JwtKeys::Secret(secret) => {
                if header.alg != Algorithm::HS256 {
                    return Err(invalid());
                }
                DecodingKey::from_secret(secret.as_bytes()).map_err(|_| invalid())?
            }
            JwtKeys::Jwks(url) => self.key(url, header.kid.as_deref()).await?,
        };
        let mut validation = match key.family() {
            // A JWKS's symmetric key would let anyone who read the JWKS sign tokens.
            AlgorithmFamily::Hmac if matches!(self.config.keys, JwtKeys::Jwks(_)) => return Err(invalid()),
            AlgorithmFamily::Hmac => Validation::new(Algorithm::HS256),
            family => Validation::new_for_family(family),
        };
        validation.leeway = self.config.leeway.as_secs();
        validation.validate_nbf = true;
        if let Some(iss) = &self.config.issuer {
            validation.set_issuer(&[iss]);
            validation.required_spec_claims.insert("iss".into());
        }
        if self.config.audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.config.audience);
            validation.required_spec_claims.insert("aud".into());
        }
        let claims = decode::<Value>(token, &key, &validation)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => unauthorized("Token expired"),
                _ => invalid(),
            })?
            .claims;
        let user = match claims.get(&self.config.user_claim) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => return Err(invalid()),
        };
        let admin = match at_path(&claims, &self.config.admin_claim) {
            Some(Value::String(s)) => *s == self.config.admin_value,
            Some(Value::Array(items)) => items.iter().any(|v| v.as_str() == Some(&self.config.admin_value)),
            Some(Value::Bool(b)) => *b && self.config.admin_value == "true",
            _ => false,
        };
        Ok(Caller {
            user: Some(user),
            admin,
        })
    }

    /// The JWKS key a token names, fetching the JWKS when the cache is empty or stale, or
    /// lacks the key (rate limited).
    async fn key(&self, url: &str, kid: Option<&str>) -> Result<DecodingKey, ApiError> {
        let mut cached = self.jwks.lock().await;
        let stale = cached.fetched.is_none_or(|t| t.elapsed() >= self.config.jwks_cache);
        if stale && self.may_fetch(&cached) {
            self.fetch(url, &mut cached).await;
        }
        let mut found = find(cached.keys.as_ref(), kid);
        if found.is_none() && cached.keys.is_some() && self.may_fetch(&cached) {
            // A key rotated in since the last fetch.
            self.fetch(url, &mut cached).await;
            found = find(cached.keys.as_ref(), kid);
        }
        match (found, &cached.keys) {
            (Some(jwk), _) => DecodingKey::from_jwk(&jwk).map_err(|_| invalid()),
            (None, Some(_)) => Err(invalid()),
            (None, None) => Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "Cannot verify tokens now: the identity provider's keys could not be fetched",
            )),
        }
    }

    fn may_fetch(&self, cached: &Cached) -> bool {
        cached.tried.is_none_or(|t| t.elapsed() >= self.config.jwks_min_refresh)
    }

    /// Fetches the JWKS; a failure keeps the keys fetched before, and is logged.
    async fn fetch(&self, url: &str, cached: &mut Cached) {
        cached.tried = Some(Instant::now());
        let fetched = async {
            let response = self.client.get(url).send().await?.error_for_status()?;
            response.json::<JwkSet>().await
        }
        .await;
        match fetched {
            Ok(set) => {
                cached.keys = Some(set);
                cached.fetched = Some(Instant::now());
            }
            Err(e) => tracing::warn!(target: "runner", url, error = %e, "cannot fetch the JWKS"),
        }
    }
}

/// The key a token's `kid` names; a token without one may use a JWKS of one key.
fn find(set: Option<&JwkSet>, kid: Option<&str>) -> Option<jsonwebtoken::jwk::Jwk> {
    let set = set?;
    match kid {
        Some(kid) => set.find(kid).cloned(),
        None if set.keys.len() == 1 => set.keys.first().cloned(),
        None => None,
    }
}

/// The value at a dotted path of the claims.
fn at_path<'a>(claims: &'a Value, path: &str) -> Option<&'a Value> {
    if let Some(v) = claims.get(path) {
        return Some(v);
    }
    path.split('.').try_fold(claims, |v, part| v.get(part))
}
