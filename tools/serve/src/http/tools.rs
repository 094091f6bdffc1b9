//! Tool calling on the chat endpoint: the request's `tools` and `tool_choice` (checked; an
//! unknown tool name is a 400), the messages handed to the chat template (tool calls'
//! arguments as objects; a template that knows no tools gets them described in a system
//! message and calls written in the Hermes form), the grammar that enforces `required` or a
//! named tool, and the calls parsed back from the answer in the model family's form — Hermes /
//! Qwen `<tool_call>{json}</tool_call>`, Llama 3.x `{"name": …, "parameters": …}`, Mistral
//! `[TOOL_CALLS][{…}]` — as OpenAI `tool_calls`, streamed too ([`ToolStream`]).

use super::{bad, ApiError};
use crate::grammar::{json_options, GrammarSpec};
use serde_json::{json, Map, Value};

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` (Hermes, Qwen; also used
    /// for templates that know no tools).
    Hermes,
    /// A bare `{"name": …, "parameters": …}` object, after `<|python_tag|>` or not (Llama 3.x).
    Llama3,
    /// `[TOOL_CALLS]` then a JSON list of `{"name": …, "arguments": …}` (Mistral).
    Mistral,
}

impl ToolFormat {
    /// The format a chat template uses, and whether it renders `tools` itself.
    pub fn of_template(template: &str) -> (ToolFormat, bool) {
        let format = if template.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if template.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if template.contains("<|python_tag|>") || template.contains("ipython") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Hermes
        };
        (format, template.contains("tools"))
    }
}

/// One offered function.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// The JSON schema of its arguments.
    pub parameters: Value,
}

/// What `tool_choice` asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// No tool calls (`none`, or no tools).
    None,
    /// The model decides (`auto`, the default with tools).
    Auto,
    /// At least one call (`required`).
    Required,
    /// A call of this tool.
    Named(String),
}

/// The request's tools, checked: each `{"type": "function", "function": {"name", …}}` with
/// a unique name and an object (or absent: no arguments) `parameters` schema.
pub fn parse_tools(v: Option<&Value>) -> Result<Vec<Tool>, ApiError> {
    let Some(list) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list = list.as_array().ok_or_else(|| bad("tools must be a list"))?;
    let mut out: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(format!(
                "tools[{i}]: only type 'function' is supported"
            )));
        }
        let f = t
            .get("function")
            .ok_or_else(|| bad(format!("tools[{i}] has no 'function'")))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad(format!("tools[{i}].function needs a non-empty 'name'")))?;
        if out.iter().any(|o| o.name == name) {
            return Err(bad(format!("tools: the name '{name}' is given twice")));
        }
        let parameters = match f.get("parameters") {
            // a function without parameters takes none
            None | Some(Value::Null) => {
                json!({"type": "object", "properties": {}, "additionalProperties": false})
            }
            Some(p) if p.is_object() => p.clone(),
            Some(_) => {
                return Err(bad(format!(
                    "tools[{i}].function.parameters must be a JSON schema object"
                )))
            }
        };
        out.push(Tool {
            name: name.to_string(),
            parameters,
        });
    }
    Ok(out)
}

/// The request's `tool_choice` for `tools`; a name not among them is a 400.
pub fn parse_choice(v: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    let choice = match v {
        None | Some(Value::Null) => {
            if tools.is_empty() {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "tool_choice '{other}' is not one of none, auto, required or a named function"
                )))
            }
        },
        Some(o) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad("tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": …}}")
                })?;
            ToolChoice::Named(name.to_string())
        }
    };
    match &choice {
        ToolChoice::Named(n) if !tools.iter().any(|t| &t.name == n) => {
            Err(bad(format!("tool_choice names the unknown tool '{n}'")))
        }
        ToolChoice::Required | ToolChoice::Named(_) if tools.is_empty() => Err(bad(
            "tool_choice asks for a tool call but no tools are given",
        )),
        _ => Ok(choice),
    }
}

/// The JSON schema of one call of `tools` in `format` (`arguments` or, for Llama 3,
/// `parameters`).
fn call_schema(format: ToolFormat, tools: &[&Tool]) -> Value {
    let key = if format == ToolFormat::Llama3 {
        "parameters"
    } else {
        "arguments"
    };
    let one: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({"type": "object", "properties": {"name": {"const": t.name}, key: t.parameters},
                   "required": ["name", key], "additionalProperties": false})
        })
        .collect();
    if one.len() == 1 {
        one[0].clone()
    } else {
        json!({"anyOf": one})
    }
}

/// The grammar that forces a tool call (`required`: one of `tools`; named: that one), in
/// `format`; None when the choice forces nothing. `single` (`parallel_tool_calls: false`)
/// allows one call in the forms that list calls (Mistral's), the others write one anyway.
pub fn grammar(
    format: ToolFormat,
    tools: &[Tool],
    choice: &ToolChoice,
    single: bool,
) -> Option<GrammarSpec> {
    let chosen: Vec<&Tool> = match choice {
        ToolChoice::None | ToolChoice::Auto => return None,
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(n) => tools.iter().filter(|t| &t.name == n).collect(),
    };
    let schema = json_options(call_schema(format, &chosen)).to_string();
    let lark = match format {
        ToolFormat::Hermes => {
            format!("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}")
        }
        ToolFormat::Llama3 => format!("start: call\ncall: %json {schema}"),
        ToolFormat::Mistral => {
            let mut list = json!({"type": "array", "items": call_schema(format, &chosen),
                                  "minItems": 1});
            if single {
                list["maxItems"] = json!(1);
            }
            let list = json_options(list);
            format!("start: \"[TOOL_CALLS]\" calls\ncalls: %json {list}")
        }
    };
    Some(GrammarSpec::Lark(lark))
}

/// The system message that describes `tools` to a model whose template knows none, and asks
/// for calls in the Hermes form.
pub fn describe_tools(raw: &Value) -> String {
    let list: Vec<String> = raw
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["function"].to_string())
        .collect();
    format!(
        "Functions:\n<tools>\n{}\n</tools>\nTo call one, reply only with <tool_call>\n\
         {{\"name\": ..., \"arguments\": {{...}}}}\n</tool_call>",
        list.join("\n")
    )
}

/// The messages as the chat template gets them: tool calls' `arguments` as objects (OpenAI
/// sends JSON strings). With `inline` (a template that knows no tools), the tool
/// descriptions become a system message, assistant calls become Hermes `<tool_call>` text and
/// tool results become user messages in `<tool_response>` blocks.
pub fn template_messages(msgs: &[Value], inline: Option<String>) -> Value {
    let mut out: Vec<Value> = Vec::with_capacity(msgs.len() + 1);
    if let Some(desc) = &inline {
        out.push(json!({"role": "system", "content": desc}));
    }
    for m in msgs {
        let mut m = m.clone();
        if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
            for c in calls.iter_mut() {
                if let Some(a) = c.pointer_mut("/function/arguments") {
                    if let Some(v) = a.as_str().and_then(|s| serde_json::from_str(s).ok()) {
                        *a = v;
                    }
                }
            }
        }
        if inline.is_some() {
            m = inline_message(m);
        }
        // a system message after the tools' one joins it
        let joins = inline.is_some() && out.len() == 1 && m["role"] == "system";
        match joins {
            true => {
                let s = format!(
                    "{}\n\n{}",
                    m["content"].as_str().unwrap_or(""),
                    out[0]["content"].as_str().unwrap_or("")
                );
                out[0]["content"] = json!(s);
            }
            false => out.push(m),
        }
    }
    Value::Array(out)
}

/// Mistral's templates accept only tool-call ids of nine letters and digits: every other id in
/// the messages (a call's `id`, a result's `tool_call_id`) becomes nine such characters
/// derived from it, the same for the same id, so a client can send back the ids it was given.
pub fn mistral_ids(msgs: &mut Value) {
    fn nine(id: &str) -> String {
        if id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return id.to_string();
        }
        // FNV-1a, written in base 62
        let mut h = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
        const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
        (0..9)
            .map(|_| {
                let c = DIGITS[(h % 62) as usize] as char;
                h /= 62;
                c
            })
            .collect()
    }
    let fix = |v: &mut Value| {
        if let Some(id) = v.as_str() {
            *v = json!(nine(id));
        }
    };
    for m in msgs.as_array_mut().into_iter().flatten() {
        if let Some(v) = m.get_mut("tool_call_id") {
            fix(v);
        }
        if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
            for c in calls.iter_mut().filter_map(|c| c.get_mut("id")) {
                fix(c);
            }
        }
    }
}

/// A message in the Hermes form for a template that knows no tools.
fn inline_message(m: Value) -> Value {
    let text = m.get("content").and_then(Value::as_str).unwrap_or("");
    match m["role"].as_str() {
        Some("tool") => {
            json!({"role": "user", "content": format!("<tool_response>\n{text}\n</tool_response>")})
        }
        Some("assistant") if m.get("tool_calls").is_some_and(Value::is_array) => {
            let mut s = text.to_string();
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                let name = c.pointer("/function/name").cloned().unwrap_or(Value::Null);
                let args = c
                    .pointer("/function/arguments")
                    .cloned()
                    .unwrap_or(json!({}));
                s.push_str(&format!(
                    "<tool_call>\n{{\"name\": {name}, \"arguments\": {args}}}\n</tool_call>"
                ));
            }
            json!({"role": "assistant", "content": s})
        }
        _ => m,
    }
}

/// A parsed call: the function's name and its arguments as a JSON string.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments (JSON text).
    pub arguments: String,
}

fn call_of(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or(json!({}));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// Splits an answer into its content and its tool calls in `format`. Text that does not
/// parse as calls stays content.
pub fn parse_calls(format: ToolFormat, text: &str) -> (String, Vec<ToolCall>) {
    let mut calls = Vec::new();
    let mut content = String::new();
    if format == ToolFormat::Hermes || text.contains("<tool_call>") {
        let mut rest = text;
        while let Some(start) = rest.find("<tool_call>") {
            content.push_str(&rest[..start]);
            let body = &rest[start + "<tool_call>".len()..];
            let (inner, after) = match body.find("</tool_call>") {
                Some(e) => (&body[..e], &body[e + "</tool_call>".len()..]),
                None => (body, ""),
            };
            match serde_json::from_str::<Value>(inner.trim())
                .ok()
                .as_ref()
                .and_then(call_of)
            {
                Some(c) => calls.push(c),
                None => content.push_str(&rest[start..rest.len() - after.len()]),
            }
            rest = after;
        }
        content.push_str(rest);
        return (content.trim().to_string(), calls);
    }
    let body = text.trim_start();
    let body = body
        .strip_prefix("[TOOL_CALLS]")
        .or_else(|| body.strip_prefix("<|python_tag|>"))
        .unwrap_or(body)
        .trim();
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Array(a)) if !a.is_empty() => {
            let cs: Option<Vec<ToolCall>> = a.iter().map(call_of).collect();
            match cs {
                Some(cs) => (String::new(), cs),
                None => (text.to_string(), Vec::new()),
            }
        }
        Ok(v @ Value::Object(_)) => match call_of(&v) {
            Some(c) => (String::new(), vec![c]),
            None => (text.to_string(), Vec::new()),
        },
        _ => (text.to_string(), Vec::new()),
    }
}

/// OpenAI's `tool_calls` list of `calls`, ids unique to this answer.
pub fn openai_calls(calls: &[ToolCall], id_prefix: &str) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({"id": format!("call_{id_prefix}_{i}"), "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect(),
    )
}

/// The streamed deltas of `calls` (each call whole, with its index).
pub fn call_deltas(calls: &[ToolCall], id_prefix: &str) -> Vec<Value> {
    let Value::Array(list) = openai_calls(calls, id_prefix) else {
        return Vec::new();
    };
    list.into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            if let Some(o) = c.as_object_mut() {
                o.insert("index".into(), json!(i));
            }
            let mut d = Map::new();
            d.insert("tool_calls".into(), json!([c]));
            Value::Object(d)
        })
        .collect()
}

/// A streamed answer's content with tool calls held back: text streams as content until it may
/// start a call (Hermes: `<tool_call>`, held back while a prefix of it could still be forming;
/// Llama 3 / Mistral: an answer opening with `{`, `[` or `[TOOL_CALLS]`); from there on it is
/// kept and parsed when the answer ends.
pub struct ToolStream {
    format: ToolFormat,
    held: String,
    capturing: bool,
    started: bool,
}

impl ToolStream {
    /// A stream for `format`.
    pub fn new(format: ToolFormat) -> ToolStream {
        ToolStream {
            format,
            held: String::new(),
            capturing: false,
            started: false,
        }
    }

    /// The content of `text` that can be streamed now.
    pub fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.capturing {
            return String::new();
        }
        if self.format != ToolFormat::Hermes && !self.started {
            let t = self.held.trim_start();
            if t.is_empty() {
                return String::new();
            }
            self.started = true;
            if t.starts_with('{') || t.starts_with('[') || t.starts_with("<|python_tag|>") {
                self.capturing = true;
                return String::new();
            }
        }
        let marker = "<tool_call>";
        if let Some(p) = self.held.find(marker) {
            self.capturing = true;
            let out: String = self.held[..p].to_string();
            self.held.drain(..p);
            return out;
        }
        // keep a tail that could begin the marker
        let mut keep = 0;
        for k in (1..marker.len()).rev() {
            if self.held.len() >= k
                && self.held.is_char_boundary(self.held.len() - k)
                && marker.starts_with(&self.held[self.held.len() - k..])
            {
                keep = k;
                break;
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// At the end: the content still held and the calls.
    pub fn finish(&mut self) -> (String, Vec<ToolCall>) {
        let held = std::mem::take(&mut self.held);
        if !self.capturing {
            return (held, Vec::new());
        }
        parse_calls(self.format, &held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Tool> {
        parse_tools(Some(&json!([
            {"type": "function", "function": {"name": "weather", "parameters":
                {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "time"}}])))
        .unwrap()
    }

    #[test]
    fn tools_and_choices_are_checked() {
        let t = tools();
        assert_eq!(t[1].parameters["additionalProperties"], json!(false));
        assert_eq!(parse_choice(None, &t).unwrap(), ToolChoice::Auto);
        assert_eq!(parse_choice(None, &[]).unwrap(), ToolChoice::None);
        assert_eq!(
            parse_choice(Some(&json!("required")), &t).unwrap(),
            ToolChoice::Required
        );
        let named = json!({"type": "function", "function": {"name": "time"}});
        assert_eq!(
            parse_choice(Some(&named), &t).unwrap(),
            ToolChoice::Named("time".into())
        );
        let e = parse_choice(
            Some(&json!({"type": "function", "function": {"name": "nope"}})),
            &t,
        )
        .unwrap_err();
        assert!(e.1.contains("unknown tool 'nope'"), "{}", e.1);
        assert!(parse_choice(Some(&json!("sometimes")), &t).is_err());
        assert!(parse_choice(Some(&json!("required")), &[]).is_err());
        for bad_tools in [
            json!([{"type": "retrieval"}]),
            json!([{"type": "function", "function": {}}]),
            json!([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]),
            json!([{"type": "function", "function": {"name": "a", "parameters": 3}}]),
            json!({"a": 1}),
        ] {
            assert!(parse_tools(Some(&bad_tools)).is_err(), "{bad_tools}");
        }
    }

    #[test]
    fn calls_parse_back_in_each_family() {
        let (c, calls) = parse_calls(
            ToolFormat::Hermes,
            "Let me check.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>{\"name\": \"time\", \"arguments\": {}}</tool_call>",
        );
        assert_eq!(c, "Let me check.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            json!({"city": "Oslo"})
        );
        let (c, calls) = parse_calls(
            ToolFormat::Llama3,
            "<|python_tag|>{\"name\": \"weather\", \"parameters\": {\"city\": \"Rome\"}}",
        );
        assert_eq!((c.as_str(), calls[0].name.as_str()), ("", "weather"));
        assert_eq!(calls[0].arguments, "{\"city\":\"Rome\"}");
        let (_, calls) = parse_calls(ToolFormat::Mistral, "[TOOL_CALLS] [{\"name\": \"time\", \"arguments\": {}}, {\"name\": \"weather\", \"arguments\": {\"city\": \"X\"}}]");
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["time", "weather"]
        );
        // not a call: stays content
        for (f, t) in [
            (ToolFormat::Hermes, "plain answer"),
            (ToolFormat::Llama3, "{\"a\": 1}"),
            (ToolFormat::Mistral, "[1, 2]"),
            (ToolFormat::Hermes, "<tool_call>oops</tool_call>"),
        ] {
            let (c, calls) = parse_calls(f, t);
            assert!(calls.is_empty() && c == t, "{t}");
        }
    }

    #[test]
    fn streams_hold_back_calls_in_any_pieces() {
        let text = "Sure. <tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>";
        for step in [1, 2, 5, 100] {
            let mut s = ToolStream::new(ToolFormat::Hermes);
            let mut streamed = String::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(step) {
                streamed.push_str(&s.push(&piece.iter().collect::<String>()));
            }
            let (rest, calls) = s.finish();
            assert_eq!(format!("{streamed}{rest}").trim(), "Sure.", "step {step}");
            assert_eq!(calls.len(), 1);
            assert!(!streamed.contains('<'), "{streamed}");
        }
        let mut s = ToolStream::new(ToolFormat::Hermes);
        assert_eq!(s.push("a <tool"), "a ");
        assert_eq!(s.push("box> b"), "<toolbox> b");
        assert_eq!(s.finish(), (String::new(), vec![]));
        let mut s = ToolStream::new(ToolFormat::Llama3);
        assert_eq!(s.push("  "), "");
        assert_eq!(s.push("{\"name\": \"time\", "), "");
        assert_eq!(s.push("\"parameters\": {}}"), "");
        assert_eq!(s.finish().1[0].name, "time");
        let mut s = ToolStream::new(ToolFormat::Llama3);
        assert_eq!(s.push("Hello"), "Hello");
    }

    #[test]
    fn mistral_ids_are_nine_letters_and_digits_the_same_for_the_same_id() {
        let mut m = json!([
            {"role": "assistant", "tool_calls": [{"id": "call_x_0_0"}, {"id": "abc123XYZ"}]},
            {"role": "tool", "tool_call_id": "call_x_0_0", "content": "1"},
            {"role": "tool", "tool_call_id": "abc123XYZ", "content": "2"}]);
        mistral_ids(&mut m);
        let id = m[0]["tool_calls"][0]["id"].as_str().unwrap();
        assert!(
            id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()),
            "{id}"
        );
        assert_eq!(m[1]["tool_call_id"], id);
        assert_eq!(m[0]["tool_calls"][1]["id"], "abc123XYZ");
        assert_eq!(m[2]["tool_call_id"], "abc123XYZ");
    }

    #[test]
    fn template_messages_inline_tools_for_plain_templates() {
        let msgs = vec![
            json!({"role": "system", "content": "Be kind."}),
            json!({"role": "user", "content": "Weather in Oslo?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                   "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "c", "content": "sunny"}),
        ];
        let v = template_messages(&msgs, None);
        assert_eq!(
            v[2]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Oslo"})
        );
        let v = template_messages(&msgs, Some("TOOLS".into()));
        let v = v.as_array().unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v[0]["content"], "Be kind.\n\nTOOLS");
        assert_eq!(v[2]["content"], "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>");
        assert_eq!(
            v[3],
            json!({"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"})
        );
    }
}
