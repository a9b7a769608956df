//! Chat templates: the Jinja programs that Hugging Face checkpoints ship to
//! turn a conversation into prompt text.
//!
//! A template comes with a downloaded model, so it is treated as untrusted:
//! no loader (no file access, no includes), no network, and a fuel budget
//! that bounds the work — and so the output — of any template.
//!
//! It renders as transformers renders it (`render_jinja_template`): Python's
//! `str` for printed values and `json.dumps` for `tojson` ([`super::python`]),
//! `strftime_now(format)` on one fixed instant per prompt (a resumed job sees
//! the prompt it started with), `raise_exception`, `dict(...)`, and lists
//! that cannot be changed (transformers' immutable sandbox refuses `append`
//! with a SecurityError; so does this, by name).

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Serde, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind, State, Value};
use serde::{Deserialize, Serialize};

use super::python;

/// Instructions a template may execute. minijinja also charges a unit of
/// fuel per 64 bytes a string operation makes, so this bounds memory too:
/// at 50,000,000 a template doubling a string reached 3.2 GB before fuel
/// ran out; at this, 512 MiB. Every fixture's template renders a
/// 1,000-message conversation with room to spare (`engine/tests/templates.rs`).
const TEMPLATE_FUEL: u64 = 8_000_000;
/// Largest prompt text a template may produce.
const MAX_RENDERED_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ts_rs::TS)]
pub struct ChatMessage {
    pub role: String,
    /// Absent or null (an assistant turn that only called tools) reads as
    /// empty.
    #[serde(default, deserialize_with = "nullable_string")]
    pub content: String,
    /// The rest of the message as its sender wrote it (`tool_calls`,
    /// `tool_call_id`, `name`, `reasoning_content`, …), as templates and
    /// prompt encoders read it.
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            extra: serde_json::Map::new(),
        }
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// A field beside role and content, if the message has it.
    pub fn field(&self, key: &str) -> Option<&serde_json::Value> {
        self.extra.get(key).filter(|v| !v.is_null())
    }
}

fn nullable_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template: {0}")]
    Render(String),
    #[error("chat template produced more than {MAX_RENDERED_BYTES} bytes")]
    TooLarge,
}

/// What a template sees besides the messages.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    pub add_generation_prompt: bool,
    /// Variables the template reads as switches (`enable_thinking`,
    /// `thinking`, `reasoning_effort`): transformers' `chat_template_kwargs`.
    pub args: serde_json::Map<String, serde_json::Value>,
    /// The instant `strftime_now` formats, in seconds since the epoch;
    /// `None` is now.
    pub now: Option<i64>,
}

impl ChatOptions {
    pub fn generation() -> Self {
        Self {
            add_generation_prompt: true,
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
}

/// Methods that change a list, which transformers' sandbox refuses.
const LIST_CHANGES: &[&str] = &[
    "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
];

impl ChatTemplate {
    pub fn new(source: String) -> Self {
        Self { source }
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String, TemplateError> {
        let mut env = Environment::new();
        // Hugging Face renders with trim_blocks and lstrip_blocks on.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(list_methods);
        env.set_formatter(|out, _state, value| {
            out.write_str(&python::py_str(value))
                .map_err(|_| JinjaError::new(ErrorKind::WriteFailure, "writing the prompt failed"))
        });
        env.add_filter("tojson", python::tojson);
        env.add_function("raise_exception", raise_exception);
        let now = options
            .now
            .unwrap_or_else(|| chrono::Utc::now().timestamp());
        env.add_function("strftime_now", move |format: String| strftime(now, &format));
        env.add_function("dict", dict);
        let describe = |e: JinjaError| TemplateError::Render(describe_error(&e));
        env.add_template("chat", &self.source).map_err(describe)?;
        let template = env.get_template("chat").map_err(describe)?;
        // The caller's switches first, as transformers passes them; the
        // variables it always sets win over them.
        let mut vars: std::collections::BTreeMap<String, Value> = options
            .args
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(Serde(v))))
            .collect();
        vars.insert("messages".into(), Value::from(Serde(messages)));
        vars.insert(
            "add_generation_prompt".into(),
            Value::from(options.add_generation_prompt),
        );
        vars.entry("tools".into()).or_insert(Value::from(()));
        vars.entry("documents".into()).or_insert(Value::from(()));
        vars.insert("bos_token".into(), Value::from(bos_token.unwrap_or("")));
        vars.insert("eos_token".into(), Value::from(eos_token.unwrap_or("")));
        let text = template.render(vars).map_err(describe)?;
        if text.len() > MAX_RENDERED_BYTES {
            return Err(TemplateError::TooLarge);
        }
        Ok(text)
    }
}

fn describe_error(e: &JinjaError) -> String {
    match e.line() {
        Some(line) => format!("line {line}: {e}"),
        None => e.to_string(),
    }
}

fn raise_exception(message: String) -> Result<String, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

/// `datetime.now().strftime(format)` at the prompt's instant, in local time.
fn strftime(now: i64, format: &str) -> Result<String, JinjaError> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(JinjaError::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: `{format}` is not a strftime format"),
        ));
    }
    let at = chrono::DateTime::from_timestamp(now, 0)
        .ok_or_else(|| JinjaError::new(ErrorKind::InvalidOperation, "strftime_now: no such time"))?
        .with_timezone(&chrono::Local);
    Ok(at.format_with_items(items.into_iter()).to_string())
}

/// `dict(a=1)`, `dict(other)`: transformers' `TemplateDict`. A key given
/// again keeps its place and takes the new value, as in Python.
fn dict(args: Rest<Value>, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let mut pairs: Vec<(Value, Value)> = Vec::new();
    let mut put = |k: Value, v: Value| match pairs.iter_mut().find(|(key, _)| *key == k) {
        Some(slot) => slot.1 = v,
        None => pairs.push((k, v)),
    };
    match args.as_slice() {
        [] => {}
        [from] if from.kind() == ValueKind::Map => {
            for k in from.try_iter()? {
                let v = from.get_item(&k)?;
                put(k, v);
            }
        }
        _ => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                "dict() takes a mapping and keyword arguments",
            ));
        }
    }
    for name in kwargs.args() {
        put(Value::from(name), kwargs.get::<Value>(name)?);
    }
    Ok(Value::from_pairs(pairs))
}

/// Python's methods on values (pycompat's), plus `list.index` and
/// `list.copy`; a method that would change a list is refused by name.
fn list_methods(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, JinjaError> {
    if value.kind() == ValueKind::Seq {
        if LIST_CHANGES.contains(&method) {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                format!(
                    "access to attribute `{method}` of a list is unsafe: chat templates cannot change lists (transformers refuses it too)"
                ),
            ));
        }
        match (method, args) {
            ("copy", []) => return Ok(Value::from(value.try_iter()?.collect::<Vec<_>>())),
            ("index", [want]) => {
                return value
                    .try_iter()?
                    .position(|v| v == *want)
                    .map(Value::from)
                    .ok_or_else(|| {
                        JinjaError::new(ErrorKind::InvalidOperation, "list.index(x): x not in list")
                    });
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn renders_chatml_with_python_string_methods() {
        let t = ChatTemplate::new(CHATML.to_string());
        let out = t
            .render(
                &[ChatMessage::user("  hi  ")],
                &ChatOptions::generation(),
                None,
                None,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t =
            ChatTemplate::new("{{ raise_exception('only user and assistant roles') }}".to_string());
        let err = t
            .render(&[], &ChatOptions::default(), None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("only user and assistant roles"), "{err}");
    }

    #[test]
    fn runaway_templates_run_out_of_fuel() {
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
                .to_string(),
        );
        assert!(t.render(&[], &ChatOptions::default(), None, None).is_err());
    }

    #[test]
    fn templates_cannot_include_files() {
        let t = ChatTemplate::new("{% include '/etc/passwd' %}".to_string());
        assert!(t.render(&[], &ChatOptions::default(), None, None).is_err());
    }
}
