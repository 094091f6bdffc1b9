//! The request fields that constrain output: OpenAI's `response_format` (`text`,
//! `json_object`, `json_schema`) and TGI's `parameters.grammar` (`json`/`json_schema` with a
//! schema, `regex`), read into a [`GrammarSpec`] and compiled ([`crate::grammar`]). A malformed
//! field or a grammar that does not compile is a 400 naming the field and saying why.

use super::{bad, ApiError, AppState};
use crate::grammar::{Constraint, GrammarSpec};
use fastllm::generate::Llm;
use serde_json::Value;
use std::sync::Arc;

/// The grammar of OpenAI's `response_format` (None: plain text).
pub fn response_format(v: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("response_format must be an object with a string 'type'"))?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let js = v.get("json_schema").ok_or_else(|| {
                bad("response_format of type json_schema needs a 'json_schema' object")
            })?;
            let schema = js.get("schema").ok_or_else(|| {
                bad("response_format.json_schema needs a 'schema' (the JSON schema)")
            })?;
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(bad(
                    "response_format.json_schema.schema must be a JSON schema object",
                ));
            }
            Ok(Some(GrammarSpec::JsonSchema(schema.clone())))
        }
        other => Err(bad(format!(
            "response_format type '{other}' is not supported (text, json_object, json_schema)"
        ))),
    }
}

/// The grammar of TGI's `parameters.grammar` (None: unconstrained).
pub fn tgi_grammar(v: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("grammar must be an object with a string 'type'"))?;
    let value = v
        .get("value")
        .ok_or_else(|| bad("grammar needs a 'value' (the schema or regular expression)"))?;
    match kind {
        "json" | "json_schema" => {
            // TGI's client sends the schema as an object; a JSON string holding one is read too
            let schema = match value {
                Value::String(s) => serde_json::from_str(s)
                    .map_err(|e| bad(format!("grammar value is not a JSON schema: {e}")))?,
                other => other.clone(),
            };
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(bad("grammar value must be a JSON schema object"));
            }
            Ok(Some(GrammarSpec::JsonSchema(schema)))
        }
        "regex" => match value {
            Value::String(r) => Ok(Some(GrammarSpec::Regex(r.clone()))),
            _ => Err(bad("grammar of type regex needs a string value")),
        },
        other => Err(bad(format!(
            "grammar type '{other}' is not supported (json, json_schema, regex)"
        ))),
    }
}

/// Compiles `spec` for `llm`; `field` names the request field in errors.
pub fn compile(
    st: &AppState,
    llm: &Arc<Llm>,
    spec: &GrammarSpec,
    field: &str,
) -> Result<Constraint, ApiError> {
    let g = st.grammars(llm).map_err(bad)?;
    g.compile(spec).map_err(|e| {
        let what = match spec {
            GrammarSpec::JsonObject | GrammarSpec::JsonSchema(_) => "invalid JSON schema",
            GrammarSpec::Regex(_) => "invalid regular expression",
            GrammarSpec::Lark(_) => "invalid grammar",
        };
        bad(format!("{field}: {what}: {e}"))
    })
}

/// The compiled constraint of an optional spec.
pub fn compile_opt(
    st: &AppState,
    llm: &Arc<Llm>,
    spec: Option<GrammarSpec>,
    field: &str,
) -> Result<Option<Constraint>, ApiError> {
    spec.map(|s| compile(st, llm, &s, field)).transpose()
}
