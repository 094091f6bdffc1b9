//! Chat templates: renders a model's own Jinja chat template (minijinja, with Python-style string
//! methods) over a list of messages.

use crate::error::{Error, Result};
use serde::Serialize;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message.
    pub fn new(role: &str, content: &str) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// The template used when a model ships none (ChatML).
pub const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Gemma's turn format, for Gemma models whose file ships no template: BOS, then
/// `<start_of_turn>{role}\n{text}<end_of_turn>\n` per message with the assistant's role named
/// `model` and a system message put at the head of the first user turn, user and assistant
/// turns alternating.
pub const GEMMA: &str = "{{ bos_token }}\
{%- set system = messages[0]['content'] ~ '\\n\\n' if messages and messages[0]['role'] == 'system' else '' -%}\
{%- set turns = messages[1:] if system else messages -%}\
{%- for m in turns -%}\
{%- if (m['role'] == 'user') != loop.index0 is even -%}\
{{ raise_exception('Gemma turns must alternate user, assistant, user, ...') }}\
{%- endif -%}\
{{ '<start_of_turn>' ~ ('model' if m['role'] == 'assistant' else m['role']) ~ '\\n' }}\
{{- system if loop.first else '' }}{{ m['content'] | trim }}{{ '<end_of_turn>\\n' }}\
{%- endfor -%}\
{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif -%}";

/// The template of a model whose file ships none: [`GEMMA`] for the Gemma architectures whose
/// vocabulary has `<start_of_turn>` (`has_token` tells), [`CHATML`] otherwise.
pub fn default_template(architecture: &str, has_token: impl Fn(&str) -> bool) -> &'static str {
    if architecture.starts_with("gemma") && has_token("<start_of_turn>") {
        GEMMA
    } else {
        CHATML
    }
}

/// Renders `template` with `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.
pub fn render(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let mut env = minijinja::Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| Error::invalid(format!("chat template does not parse: {e}")))?;
    let t = env
        .get_template("chat")
        .map_err(|e| Error::invalid(format!("chat template: {e}")))?;
    t.render(minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    })
    .map_err(|e| Error::invalid(format!("chat template failed to render: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml() {
        let m = [ChatMessage::new("user", "Hi")];
        let s = render(CHATML, &m, true, "", "").unwrap();
        assert_eq!(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn gemma_turns() {
        let m = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", " Hi \n"),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("user", "Bye"),
        ];
        let s = render(GEMMA, &m, true, "<bos>", "<eos>").unwrap();
        assert_eq!(
            s,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        let plain = render(GEMMA, &m[1..2], false, "<bos>", "").unwrap();
        assert_eq!(plain, "<bos><start_of_turn>user\nHi<end_of_turn>\n");
        let e = render(GEMMA, &m[2..], true, "", "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("alternate"), "{e}");
        assert_eq!(
            default_template("gemma3", |t| t == "<start_of_turn>"),
            GEMMA
        );
        assert_eq!(default_template("gemma3", |_| false), CHATML);
        assert_eq!(default_template("llama", |_| true), CHATML);
    }

    #[test]
    fn python_methods_and_errors() {
        let t = "{{ messages[0]['content'].strip() }}{% if messages|length > 1 %}{{ raise_exception('only one') }}{% endif %}";
        assert_eq!(
            render(t, &[ChatMessage::new("user", "  x ")], false, "", "").unwrap(),
            "x"
        );
        let two = [ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        assert!(render(t, &two, false, "", "").is_err());
        assert!(render("{% for %}", &two, false, "", "").is_err());
    }
}
