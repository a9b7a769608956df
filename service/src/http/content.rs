//! Text from the content shapes the APIs send: a string, null, or a list of
//! typed parts of which Longhaul reads the text ones. Any other part
//! (images, files) is refused by its place and type, never dropped.

use serde_json::Value;

use super::error::{ApiError, ApiResult};

/// The text of `content` at `at` (reported under request field `param`):
/// a string, nothing for null, or the `text` of parts whose type is one of
/// `kinds`, joined.
pub fn text_of(
    content: Option<&Value>,
    kinds: &[&str],
    param: &str,
    at: &str,
) -> ApiResult<String> {
    let bad = |why: String| ApiError::bad_param(param, format!("{at}: {why}"));
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| {
                let kind = p.get("type").and_then(Value::as_str);
                match (kind, p.get("text")) {
                    (Some(k), Some(Value::String(t))) if kinds.contains(&k) => Ok(t.as_str()),
                    _ => Err(bad(format!(
                        "a content part of type `{}` is not supported; Longhaul reads text parts",
                        kind.unwrap_or("(none)")
                    ))),
                }
            })
            .collect::<ApiResult<Vec<_>>>()
            .map(|t| t.concat()),
        Some(other) => Err(bad(format!(
            "content is {other}, not text or a list of parts"
        ))),
    }
}
