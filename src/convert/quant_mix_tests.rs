//! Tests of the llama.cpp mixes: roles from the architecture table, `use_more_bits`, the
//! per-role choices on a SmolLM2-shaped model in GGUF file order, fallbacks, and the
//! already-quantized error.

use super::*;
use crate::model::arch::lookup;

fn t(name: &str, dims: &[usize]) -> MixTensor {
    MixTensor {
        name: name.into(),
        dims: dims.to_vec(),
        quantized_source: None,
    }
}

#[test]
fn more_bits_layers_match_llama_cpp() {
    // 32 layers: 0-3, 28-31, and every third from 6 → 16 layers
    let picked: Vec<usize> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
    assert_eq!(
        picked,
        [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    );
    assert_eq!((0..30).filter(|&i| use_more_bits(i, 30)).count(), 14);
}

#[test]
fn roles_from_the_architecture_table() {
    let llama = lookup("llama").unwrap();
    let r = |n: &str, d: &[usize]| role(llama, n, d);
    assert_eq!(r("lm_head.weight", &[8, 64]), Role::Output);
    assert_eq!(r("model.embed_tokens.weight", &[8, 64]), Role::TokenEmbd);
    assert_eq!(
        r("model.layers.3.self_attn.v_proj.weight", &[8, 64]),
        Role::AttnV(3)
    );
    assert_eq!(
        r("model.layers.3.self_attn.k_proj.weight", &[8, 64]),
        Role::AttnK
    );
    assert_eq!(
        r("model.layers.3.self_attn.o_proj.weight", &[8, 64]),
        Role::AttnOutput
    );
    assert_eq!(
        r("model.layers.7.mlp.down_proj.weight", &[8, 64]),
        Role::FfnDown(7)
    );
    assert_eq!(
        r("model.layers.7.mlp.up_proj.weight", &[8, 64]),
        Role::Plain
    );
    assert_eq!(
        r("model.layers.7.input_layernorm.weight", &[64]),
        Role::Float
    );
    assert_eq!(
        r("model.layers.7.self_attn.q_proj.bias", &[64]),
        Role::Float
    );
    let mixtral = lookup("mixtral").unwrap();
    let m = |n: &str| role(mixtral, n, &[8, 64]);
    assert_eq!(
        m("model.layers.1.block_sparse_moe.gate.weight"),
        Role::Float
    );
    assert_eq!(
        m("model.layers.1.block_sparse_moe.experts.5.w2.weight"),
        Role::FfnDown(1)
    );
    assert_eq!(
        m("model.layers.1.block_sparse_moe.experts.5.w1.weight"),
        Role::Plain
    );
    assert_eq!(
        role(
            lookup("phi3").unwrap(),
            "model.layers.0.self_attn.qkv_proj.weight",
            &[8, 64]
        ),
        Role::AttnV(0)
    );
    let ds = lookup("deepseek_v3").unwrap();
    let kv_b = "model.layers.2.self_attn.kv_b_proj.weight";
    assert_eq!(role(ds, kv_b, &[8, 64]), Role::AttnV(2));
    let gpt2 = lookup("gpt2").unwrap();
    assert_eq!(role(gpt2, "transformer.wpe.weight", &[8, 64]), Role::Float);
    assert_eq!(
        role(gpt2, "transformer.h.0.mlp.c_proj.weight", &[8, 64]),
        Role::FfnDown(0)
    );
}

/// SmolLM2-135M's shapes (hidden 576, ffn 1536, 30 layers, tied embeddings) in its GGUF's
/// order (layers sorted as strings: 0, 1, 10, 11, …).
fn smollm2() -> Vec<MixTensor> {
    let mut layers: Vec<String> = (0..30).map(|i| i.to_string()).collect();
    layers.sort();
    let mut v = vec![t("model.embed_tokens.weight", &[49152, 576])];
    for l in &layers {
        let p = format!("model.layers.{l}.");
        v.push(t(&format!("{p}input_layernorm.weight"), &[576]));
        v.push(t(&format!("{p}mlp.down_proj.weight"), &[576, 1536]));
        v.push(t(&format!("{p}mlp.gate_proj.weight"), &[1536, 576]));
        v.push(t(&format!("{p}self_attn.v_proj.weight"), &[192, 576]));
    }
    v
}

#[test]
fn smollm2_q4_k_m_follows_llama_cpp() {
    let ts = smollm2();
    let got = plan(QuantMix::Q4KM, lookup("llama").unwrap(), (30, 0), &ts).unwrap();
    let of = |n: &str| got[ts.iter().position(|t| t.name == n).unwrap()];
    // tied embedding of 576 columns: not a multiple of 256 → Q8_0
    assert_eq!(of("model.embed_tokens.weight"), DataType::Q8_0);
    assert_eq!(of("model.layers.4.input_layernorm.weight"), DataType::F32);
    // 576-column tensors fall back: Q4_K → Q5_0, Q6_K → Q8_0
    assert_eq!(of("model.layers.4.mlp.gate_proj.weight"), DataType::Q5_0);
    // ffn_down (1536 columns) and attn_v are numbered by layer, whatever the file's order
    for layer in 0..30 {
        let more = use_more_bits(layer, 30);
        let down = of(&format!("model.layers.{layer}.mlp.down_proj.weight"));
        assert_eq!(
            down,
            if more { DataType::Q6K } else { DataType::Q4K },
            "{layer}"
        );
        let v = of(&format!("model.layers.{layer}.self_attn.v_proj.weight"));
        assert_eq!(
            v,
            if more { DataType::Q8_0 } else { DataType::Q5_0 },
            "{layer}"
        );
    }
    // what llama-quantize chose for SmolLM2's f16 GGUF
    assert_eq!(of("model.layers.2.mlp.down_proj.weight"), DataType::Q6K);
    assert_eq!(of("model.layers.10.mlp.down_proj.weight"), DataType::Q4K);
    assert_eq!(
        of("model.layers.23.self_attn.v_proj.weight"),
        DataType::Q8_0
    );
    assert_eq!(
        of("model.layers.24.self_attn.v_proj.weight"),
        DataType::Q5_0
    );
}

#[test]
fn output_types_and_fallbacks() {
    let llama = lookup("llama").unwrap();
    let ts = vec![
        t("model.embed_tokens.weight", &[512, 256]),
        t("lm_head.weight", &[512, 256]),
        t("model.layers.0.mlp.up_proj.weight", &[64, 48]),
        t("model.layers.0.mlp.gate_proj.weight", &[64, 512]),
    ];
    let p = |mix| plan(mix, llama, (1, 0), &ts).unwrap();
    // untied: the embedding takes the default type, the head Q6_K; 48 columns → F16
    assert_eq!(
        p(QuantMix::Q4KM),
        [DataType::Q4K, DataType::Q6K, DataType::F16, DataType::Q4K]
    );
    assert_eq!(
        p(QuantMix::Q4_0),
        [DataType::Q4_0, DataType::Q6K, DataType::F16, DataType::Q4_0]
    );
    assert_eq!(
        p(QuantMix::Q8_0),
        [
            DataType::Q8_0,
            DataType::Q8_0,
            DataType::F16,
            DataType::Q8_0
        ]
    );
    assert_eq!(
        p(QuantMix::Q5KM),
        [DataType::Q5K, DataType::Q6K, DataType::F16, DataType::Q5K]
    );
    let odd = [t("model.layers.0.mlp.up_proj.weight", &[64, 96])];
    let q = |mix| plan(mix, llama, (1, 0), &odd).unwrap()[0];
    assert_eq!(q(QuantMix::Q4KM), DataType::Q5_0);
    assert_eq!(q(QuantMix::Q5KM), DataType::Q8_0);
    assert_eq!(q(QuantMix::Q6K), DataType::Q8_0);
}

#[test]
fn mixtral_rules_and_requantize_error() {
    let mixtral = lookup("mixtral").unwrap();
    let ts = vec![
        t("model.layers.0.self_attn.k_proj.weight", &[256, 256]),
        t("model.layers.0.self_attn.v_proj.weight", &[256, 256]),
        t("model.layers.0.self_attn.o_proj.weight", &[256, 256]),
        t("model.layers.0.block_sparse_moe.gate.weight", &[8, 256]),
    ];
    let got = plan(QuantMix::Q4KM, mixtral, (1, 8), &ts).unwrap();
    assert_eq!(
        got,
        [DataType::Q8_0, DataType::Q8_0, DataType::Q5K, DataType::F32]
    );
    let mut bad = ts.clone();
    bad[2].quantized_source = Some("q4_1".into());
    let e = plan(QuantMix::Q4KM, mixtral, (1, 8), &bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model.layers.0.self_attn.o_proj.weight") && e.contains("q4_1"),
        "{e}"
    );
    // a norm of a quantized source is not quantized: no error
    bad[2] = t("model.layers.0.input_layernorm.weight", &[256]);
    bad[2].quantized_source = Some("q4_1".into());
    assert!(plan(QuantMix::Q4KM, mixtral, (1, 8), &bad).is_ok());
}
