//! Rerankers for `retrieve`: `rrf` (the fused rank as it is), `none` (vector similarity
//! order), `{llm: PROFILE}` (a model scores every candidate 0–10 in one call) and `{url: ...}`
//! (a cross-encoder behind a `/rerank` endpoint as text-embeddings-inference, Infinity, Jina
//! and Cohere serve it, reached through the run's web client). A model or endpoint that fails
//! leaves the RRF order, and the failure is returned so the node can report it.

use serde_json::{Value, json};

use super::NodeCtx;
use super::retrieve::{Rerank, RerankName};
use crate::net::{AllowList, FetchOptions, Oversize, Request, Web};
use crate::providers::{ChatRequest, Message, Usage};
use crate::rag::search::{ChunkRow, Hit};

/// A hit in its final order, with the score that ordered it.
#[derive(Debug, Clone)]
pub(super) struct Ranked {
    pub chunk: ChunkRow,
    pub score: f64,
}

/// Largest reranker response read, in bytes.
const MAX_RESPONSE: usize = 4 << 20;
/// Characters of each candidate shown to a model.
const LLM_PASSAGE_CHARS: usize = 1200;

/// Orders `hits`; on a reranker failure, the RRF order and the error.
pub(super) async fn rerank(
    ctx: &NodeCtx<'_>,
    how: &Rerank,
    queries: &[String],
    hits: &[Hit],
    usage: &mut Usage,
) -> (Vec<Ranked>, Option<String>) {
    let by_rrf = || {
        hits.iter()
            .map(|h| Ranked {
                chunk: h.chunk.clone(),
                score: h.rrf,
            })
            .collect::<Vec<_>>()
    };
    if hits.is_empty() {
        return (Vec::new(), None);
    }
    let scores = match how {
        Rerank::Named(RerankName::Rrf) => return (by_rrf(), None),
        Rerank::Named(RerankName::None) => Ok(hits.iter().map(|h| h.cosine).collect()),
        Rerank::Llm { llm } => by_llm(ctx, llm, queries, hits, usage).await,
        Rerank::Http { url, model } => by_endpoint(&ctx.services.web, url, model.as_deref(), queries, hits).await,
    };
    match scores {
        Ok(scores) => {
            let mut ranked: Vec<(usize, Ranked)> = hits
                .iter()
                .zip(scores)
                .enumerate()
                .map(|(i, (h, score))| {
                    let chunk = h.chunk.clone();
                    (i, Ranked { chunk, score })
                })
                .collect();
            // Stable: equal scores keep the RRF order.
            ranked.sort_by(|a, b| b.1.score.total_cmp(&a.1.score).then(a.0.cmp(&b.0)));
            (ranked.into_iter().map(|(_, r)| r).collect(), None)
        }
        Err(e) => (by_rrf(), Some(e)),
    }
}

async fn by_llm(
    ctx: &NodeCtx<'_>,
    profile_name: &str,
    queries: &[String],
    hits: &[Hit],
    usage: &mut Usage,
) -> Result<Vec<f64>, String> {
    let (provider, profile) = ctx
        .services
        .providers
        .get(profile_name)
        .ok_or_else(|| format!("no provider is set up for model profile `{profile_name}`"))?;
    let mut prompt = String::from("Question");
    if queries.len() > 1 {
        prompt.push_str(" (and the ways it was rephrased)");
    }
    prompt.push_str(":\n");
    for q in queries {
        prompt.push_str(&format!("- {q}\n"));
    }
    prompt.push_str("\nPassages:\n");
    for (i, h) in hits.iter().enumerate() {
        let text: String = h.chunk.text.chars().take(LLM_PASSAGE_CHARS).collect();
        prompt.push_str(&format!("[{i}] ({}) {}\n\n", h.chunk.document, text.replace('\n', " ")));
    }
    prompt.push_str(&format!(
        "Score how well each passage helps answer the question, from 0 (useless) to 10 (answers it). \
         Reply with JSON only: {{\"scores\": [{{\"index\": 0, \"score\": 7}}, ...]}} with one entry for each of \
         the {} passages.",
        hits.len()
    ));
    let request = ChatRequest {
        node: ctx.node.name.clone(),
        model: profile.model.clone(),
        messages: vec![
            Message::new(
                "system",
                "You judge the relevance of search results. You reply with JSON only.",
            ),
            Message::new("user", prompt),
        ],
        temperature: Some(0.0),
        max_tokens: Some(64 + 16 * hits.len() as u32),
        ..ChatRequest::default()
    };
    let reply = ctx
        .chat(&*provider, profile_name, profile, request, None)
        .await
        .map_err(|e| format!("llm reranker: {e}"))?;
    usage.add(&reply.usage);
    parse_scores(&reply.text, hits.len()).ok_or_else(|| {
        let shown = crate::secrets::excerpt(&reply.text, 200);
        format!("llm reranker: no scores in the reply {shown:?}")
    })
}

/// Scores from a model's reply: `{"scores": [{index, score}]}`, `[{index, score}]`,
/// `[7, 3, ...]` or `{"0": 7, ...}`, possibly inside a code fence or prose. Candidates the
/// reply leaves out score -1 (after every scored one).
pub(super) fn parse_scores(text: &str, n: usize) -> Option<Vec<f64>> {
    let start = text.find(['{', '['])?;
    let end = text.rfind(['}', ']'])?;
    let value: Value = serde_json::from_str(text.get(start..=end)?).ok()?;
    let list = match &value {
        Value::Object(m) => m
            .get("scores")
            .or_else(|| m.get("results"))
            .or_else(|| m.get("rankings"))
            .cloned()
            .unwrap_or_else(|| value.clone()),
        _ => value.clone(),
    };
    let mut scores = vec![-1.0; n];
    let mut any = false;
    let number = |v: &Value| v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()));
    match &list {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let (ix, s) = match item {
                    Value::Object(o) => (
                        o.get("index")
                            .or_else(|| o.get("id"))
                            .and_then(number)
                            .map_or(i, |x| x as usize),
                        o.get("score").or_else(|| o.get("relevance")).and_then(number),
                    ),
                    other => (i, number(other)),
                };
                if let (Some(s), true) = (s, ix < n) {
                    scores[ix] = s;
                    any = true;
                }
            }
        }
        Value::Object(m) => {
            for (k, v) in m {
                if let (Ok(ix), Some(s)) = (k.trim_matches(['[', ']']).parse::<usize>(), number(v))
                    && ix < n
                {
                    scores[ix] = s;
                    any = true;
                }
            }
        }
        _ => {}
    }
    any.then_some(scores)
}

/// POSTs the first query and the candidates to a cross-encoder's rerank endpoint, in one body
/// both dialects read: `texts`, `truncate` and `raw_scores` for text-embeddings-inference;
/// `documents`, `top_n`, `return_documents` (and `model`) for Infinity, Jina and Cohere.
/// Reads `{results: [{index, relevance_score}]}` (Infinity, Jina, Cohere) or `[{index,
/// score}]` (TEI), in any order; a candidate the reply leaves out ranks last.
async fn by_endpoint(
    web: &Web,
    url: &str,
    model: Option<&str>,
    queries: &[String],
    hits: &[Hit],
) -> Result<Vec<f64>, String> {
    let texts: Vec<String> = hits.iter().map(|h| h.chunk.text.clone()).collect();
    let mut body = json!({
        "query": queries.first().cloned().unwrap_or_default(),
        "documents": texts,
        "texts": texts,
        "top_n": hits.len(),
        "return_documents": false,
        "truncate": true,
        "raw_scores": false,
    });
    if let Some(m) = model {
        body["model"] = Value::String(m.to_string());
    }
    // The endpoint is written in the workflow: its host is trusted, as an http node's is.
    let mut allow = AllowList::default();
    if let Some(parsed) = url::Url::parse(url).ok()
        && let (Some(host), Some(port)) = (parsed.host_str(), parsed.port_or_known_default())
    {
        allow
            .add_origin(host, port)
            .map_err(|e| format!("rerank endpoint {url}: {e}"))?;
    }
    let opts = FetchOptions {
        allow,
        timeout: std::time::Duration::from_secs(30),
        max_bytes: MAX_RESPONSE as u64,
        oversize: Oversize::Fail,
        ..FetchOptions::default()
    };
    let request = Request {
        method: "POST".into(),
        url: url.to_string(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: Some(body.to_string().into_bytes()),
        secret_headers: Vec::new(),
    };
    let response = web
        .fetch(request, &opts)
        .await
        .map_err(|e| format!("rerank endpoint {url}: {e}"))?;
    let bytes = response.body;
    if response.status >= 400 {
        // Scrubbed whole, then cut: a secret across the cut leaves no prefix.
        let shown = crate::secrets::excerpt(&String::from_utf8_lossy(&bytes), 200);
        return Err(format!("rerank endpoint {url}: HTTP {}: {shown}", response.status));
    }
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| format!("rerank endpoint {url}: {e}"))?;
    let results = value.get("results").or_else(|| value.get("data")).unwrap_or(&value);
    let Value::Array(items) = results else {
        return Err(format!("rerank endpoint {url}: no `results` list in the response"));
    };
    let mut scores = vec![f64::MIN; hits.len()];
    for item in items {
        let ix = item.get("index").and_then(Value::as_u64);
        let s = item
            .get("relevance_score")
            .or_else(|| item.get("score"))
            .and_then(Value::as_f64);
        if let (Some(ix), Some(s)) = (ix, s)
            && (ix as usize) < hits.len()
        {
            scores[ix as usize] = s;
        }
    }
    Ok(scores)
}

#[cfg(test)]
mod tests {
    use super::parse_scores;

    #[test]
    fn scores_are_read_from_the_shapes_models_reply_with() {
        let fenced =
            "Sure:\n```json\n{\"scores\": [{\"index\": 1, \"score\": 8}, {\"index\": 0, \"score\": \"3\"}]}\n```";
        assert_eq!(parse_scores(fenced, 3), Some(vec![3.0, 8.0, -1.0]));
        assert_eq!(parse_scores("[7, 2.5]", 2), Some(vec![7.0, 2.5]));
        assert_eq!(parse_scores("{\"0\": 1, \"[1]\": 9}", 2), Some(vec![1.0, 9.0]));
        assert_eq!(
            parse_scores("[{\"id\": 5, \"relevance\": 4}, {\"index\": 0, \"score\": 6}]", 2),
            Some(vec![6.0, -1.0])
        );
        assert_eq!(parse_scores("no idea", 2), None);
        assert_eq!(parse_scores("{\"scores\": []}", 2), None);
    }
}
