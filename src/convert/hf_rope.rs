//! The rotary settings of a Hugging Face `config.json`: base, partial rotary factor, scaling
//! (`default`, `linear`, `llama3`, `yarn`, `longrope`, `dynamic`) and Gemma-3's base of its
//! sliding-window layers. Reads the transformers ≥ 5 `rope_parameters` object (one for every
//! layer, or one per layer type: `full_attention` / `sliding_attention`) and the older
//! `rope_theta` / `rope_scaling` / `rope_local_base_freq` keys, resolving the defaults the way
//! transformers' `modeling_rope_utils` does. Other rope types are refused by name.

use crate::error::{Error, Result};
use crate::model::RopeScaling;
use serde_json::Value;

/// The rotary settings of one config.
pub struct HfRope {
    /// Base of every layer (of the full-attention layers when `local_theta` is set).
    pub theta: f32,
    /// Fraction of each head that rotates.
    pub partial: f64,
    /// Scaling of the full-attention layers (of every layer without a local base).
    pub scaling: RopeScaling,
    /// Base of the sliding-window layers (0 = same as the others).
    pub local_theta: f32,
}

/// The rope types this converter knows.
pub const ROPE_TYPES: &str = "default, linear, llama3, yarn, longrope, dynamic";

struct Params<'a> {
    /// The scaling's own object (`rope_parameters` or its `full_attention` entry).
    own: Option<&'a Value>,
    /// The whole config (keys such as `original_max_position_embeddings` live there too).
    top: &'a Value,
    path: &'a str,
    kind: &'a str,
}

impl Params<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.own.and_then(|o| o.get(k)).filter(|v| !v.is_null())
    }
    fn float(&self, k: &str) -> Result<Option<f64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                Error::format(
                    self.path,
                    format!("rope scaling {}: {k} must be a number", self.kind),
                )
            }),
        }
    }
    fn need(&self, k: &str) -> Result<f64> {
        self.float(k)?.ok_or_else(|| {
            Error::format(self.path, format!("rope scaling {} needs {k}", self.kind))
        })
    }
    fn floats(&self, k: &str) -> Result<Vec<f32>> {
        let a = self.get(k).and_then(Value::as_array).ok_or_else(|| {
            Error::format(
                self.path,
                format!("rope scaling {} needs the list {k}", self.kind),
            )
        })?;
        a.iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| Error::format(self.path, format!("{k} must be a list of numbers")))
    }
    /// `original_max_position_embeddings`: the config's own key first (Phi-3 keeps it there),
    /// then the scaling's, then `max_pos`.
    fn original(&self, max_pos: usize) -> Result<u32> {
        let v = self
            .top
            .get("original_max_position_embeddings")
            .filter(|v| !v.is_null())
            .or_else(|| self.get("original_max_position_embeddings"));
        match v {
            None => u32::try_from(max_pos).map_err(|_| self.too_big()),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| {
                    Error::format(
                        self.path,
                        "original_max_position_embeddings must be an integer",
                    )
                }),
        }
    }
    fn too_big(&self) -> Error {
        Error::format(self.path, "max_position_embeddings does not fit in u32")
    }
}

/// YaRN's default attention factor (HF `get_mscale`).
fn mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// Reads the rotary settings of config `v` (`path` names it in errors); `max_pos` is its
/// `max_position_embeddings`.
pub fn hf_rope(v: &Value, path: &str, max_pos: usize) -> Result<HfRope> {
    let rp = v
        .get("rope_parameters")
        .filter(|r| r.is_object())
        .or_else(|| v.get("rope_scaling").filter(|r| r.is_object()));
    let per_type = |t: &str| rp.and_then(|r| r.get(t)).filter(|x| x.is_object());
    let (own, local) = match (per_type("full_attention"), per_type("sliding_attention")) {
        (None, None) => (rp, None),
        (full, sliding) => (full, sliding),
    };
    let theta_of = |o: Option<&Value>| o.and_then(|o| o.get("rope_theta")).and_then(Value::as_f64);
    let theta = theta_of(own)
        .or_else(|| v.get("rope_theta").and_then(Value::as_f64))
        .unwrap_or(10000.0) as f32;
    let partial = own
        .and_then(|o| o.get("partial_rotary_factor"))
        .and_then(Value::as_f64)
        .or_else(|| v.get("partial_rotary_factor").and_then(Value::as_f64))
        .unwrap_or(1.0);
    let kind_of = |o: Option<&Value>| {
        o.and_then(|o| o.get("rope_type").or_else(|| o.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string()
    };
    let local_theta = match local {
        Some(l) => {
            let kind = kind_of(Some(l));
            if kind != "default" {
                return Err(Error::Unsupported(format!(
                    "{path}: rope scaling {kind:?} on the sliding-window layers (they rotate unscaled)"
                )));
            }
            theta_of(Some(l)).unwrap_or(10000.0) as f32
        }
        None => v
            .get("rope_local_base_freq")
            .and_then(Value::as_f64)
            .unwrap_or(0.0) as f32,
    };
    let kind = kind_of(own);
    let p = Params {
        own,
        top: v,
        path,
        kind: &kind,
    };
    let scaling = scaling(&p, max_pos)?;
    Ok(HfRope {
        theta,
        partial,
        scaling,
        local_theta,
    })
}

fn scaling(p: &Params<'_>, max_pos: usize) -> Result<RopeScaling> {
    let max = max_pos as f64;
    Ok(match p.kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: p.need("factor")? as f32,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: p.need("factor")? as f32,
            low_freq_factor: p.need("low_freq_factor")? as f32,
            high_freq_factor: p.need("high_freq_factor")? as f32,
            original_context_length: match p.get("original_max_position_embeddings") {
                Some(_) => p.original(max_pos)?,
                None => {
                    return Err(Error::format(
                        p.path,
                        "llama3 rope scaling needs original_max_position_embeddings",
                    ))
                }
            },
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: p.need("factor")? as f32,
            original_context_length: u32::try_from(max_pos).map_err(|_| p.too_big())?,
        },
        "yarn" => {
            let orig = p.original(max_pos)?;
            let factor = p.float("factor")?.unwrap_or(max / orig as f64);
            let attention = match p.float("attention_factor")? {
                Some(a) => a,
                None => match (p.float("mscale")?, p.float("mscale_all_dim")?) {
                    (Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        mscale(factor, m) / mscale(factor, all)
                    }
                    _ => mscale(factor, 1.0),
                },
            };
            RopeScaling::Yarn {
                factor: factor as f32,
                original_context_length: orig,
                beta_fast: p.float("beta_fast")?.filter(|b| *b != 0.0).unwrap_or(32.0) as f32,
                beta_slow: p.float("beta_slow")?.filter(|b| *b != 0.0).unwrap_or(1.0) as f32,
                attention_factor: attention as f32,
                truncate: p.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            }
        }
        "longrope" | "su" => {
            let orig = p.original(max_pos)?;
            let factor = p.float("factor")?.unwrap_or(max / orig as f64);
            let attention = match p.float("attention_factor")? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (orig as f64).ln()).sqrt(),
            };
            RopeScaling::LongRope {
                original_context_length: orig,
                attention_factor: attention as f32,
                short_factor: p.floats("short_factor")?,
                long_factor: p.floats("long_factor")?,
            }
        }
        other => {
            return Err(Error::Unsupported(format!(
                "{}: rope scaling type {other:?} (supported: {ROPE_TYPES})",
                p.path
            )))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<HfRope> {
        hf_rope(&serde_json::from_str(json).unwrap(), "c.json", 512)
    }

    #[test]
    fn per_layer_type_parameters_give_a_local_base() {
        let r = parse(
            r#"{"rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "linear", "factor": 8},
                 "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}}"#,
        )
        .unwrap();
        assert_eq!((r.theta, r.local_theta), (1e6, 1e4));
        assert_eq!(r.scaling, RopeScaling::Linear { factor: 8.0 });
        let old = parse(r#"{"rope_theta": 1e6, "rope_local_base_freq": 1e4}"#).unwrap();
        assert_eq!((old.theta, old.local_theta), (1e6, 1e4));
        let e = parse(
            r#"{"rope_parameters": {"full_attention": {"rope_theta": 1e6},
                 "sliding_attention": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 2}}}"#,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("sliding-window") && e.contains("yarn"), "{e}");
    }

    #[test]
    fn yarn_and_longrope_defaults() {
        let y = parse(r#"{"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 32}}"#)
            .unwrap();
        let RopeScaling::Yarn {
            factor,
            original_context_length,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } = y.scaling
        else {
            panic!("{:?}", y.scaling)
        };
        assert_eq!(
            (
                factor,
                original_context_length,
                beta_fast,
                beta_slow,
                truncate
            ),
            (4.0, 32, 32.0, 1.0, true)
        );
        assert!((attention_factor as f64 - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-6);
        // longrope: factor = max_position_embeddings / original when not given
        let l = parse(
            r#"{"original_max_position_embeddings": 32, "rope_scaling": {"type": "longrope",
                "short_factor": [1, 1], "long_factor": [2, 3]}}"#,
        )
        .unwrap();
        let RopeScaling::LongRope {
            attention_factor,
            long_factor,
            ..
        } = l.scaling
        else {
            panic!()
        };
        assert_eq!(long_factor, [2.0, 3.0]);
        let want = (1.0 + 16f64.ln() / 32f64.ln()).sqrt();
        assert!((attention_factor as f64 - want).abs() < 1e-6);
    }

    #[test]
    fn unknown_types_and_missing_keys_are_named() {
        let e = parse(r#"{"rope_scaling": {"type": "ntk-by-parts", "factor": 2}}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("ntk-by-parts") && e.contains("longrope"), "{e}");
        let e = parse(r#"{"rope_scaling": {"type": "longrope", "short_factor": [1]}}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("long_factor"), "{e}");
        let e = parse(r#"{"rope_scaling": {"rope_type": "dynamic"}}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("dynamic") && e.contains("factor"), "{e}");
    }
}
