//! Chat templates: the Jinja programs that Hugging Face checkpoints ship to
//! turn a conversation into prompt text.
//!
//! A template comes with a downloaded model, so it is treated as untrusted:
//! no loader (no file access, no includes), no network, and a fuel budget
//! that bounds the work — and so the output — of any template.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};

/// Instructions a template may execute; generous for real templates
/// (thousands of messages), fatal for runaway loops.
const TEMPLATE_FUEL: u64 = 50_000_000;
/// Largest prompt text a template may produce.
const MAX_RENDERED_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".to_string(),
            content: content.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template: {0}")]
    Render(String),
    #[error("chat template produced more than {MAX_RENDERED_BYTES} bytes")]
    TooLarge,
}

#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
}

impl ChatTemplate {
    pub fn new(source: String) -> Self {
        Self { source }
    }

    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
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
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let describe = |e: JinjaError| TemplateError::Render(describe_error(&e));
        env.add_template("chat", &self.source).map_err(describe)?;
        let template = env.get_template("chat").map_err(describe)?;
        let text = template
            .render(context! {
                messages => Value::from(Serde(messages)),
                add_generation_prompt => add_generation_prompt,
                bos_token => bos_token.unwrap_or(""),
                eos_token => eos_token.unwrap_or(""),
            })
            .map_err(describe)?;
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

/// Templates that stamp the date get a fixed one: rendering must be
/// reproducible for a resumed job to see the same prompt.
fn strftime_now(_format: String) -> String {
    "2026-01-01".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'].strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn renders_chatml_with_python_string_methods() {
        let t = ChatTemplate::new(CHATML.to_string());
        let out = t
            .render(&[ChatMessage::user("  hi  ")], true, None, None)
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
        let err = t.render(&[], false, None, None).unwrap_err().to_string();
        assert!(err.contains("only user and assistant roles"), "{err}");
    }

    #[test]
    fn runaway_templates_run_out_of_fuel() {
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
                .to_string(),
        );
        assert!(t.render(&[], false, None, None).is_err());
    }

    #[test]
    fn templates_cannot_include_files() {
        let t = ChatTemplate::new("{% include '/etc/passwd' %}".to_string());
        assert!(t.render(&[], false, None, None).is_err());
    }
}
