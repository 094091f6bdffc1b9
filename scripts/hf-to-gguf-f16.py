#!/usr/bin/env python3
"""Writes an F16 GGUF of a small Hugging Face checkpoint (f32/f16/bf16 safetensors, one file or an
index of shards) as llama.cpp's converter lays it out: llama.cpp tensor names, llama's q/k rows
permuted, Gemma-3's norms stored as 1 + w, MoE experts stacked into `ffn_*_exps`, 2-D weights in
F16 (routers and 1-D tensors in F32), and the tokenizer as `tokenizer.ggml.*` metadata. It is the common
f16 source for comparing `convert-weights --dtype q4_k_m` with `llama-quantize` on the tiny test
fixtures (docs/benchmarks.md); it covers their llama, mistral, mixtral, qwen2, qwen3, qwen3_moe,
phi3 and gemma3 configurations (no rope scaling), not every checkpoint.

    python3 scripts/hf-to-gguf-f16.py HF_DIR OUT.gguf     # needs the `gguf` and `numpy` packages
"""
import json
import os
import re
import struct
import sys

import gguf
import numpy as np

ARCH = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2",
        "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "phi3": "phi3", "gemma3_text": "gemma3"}
LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "self_attn.qkv_proj": "attn_qkv",
         "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.gate_up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
         "block_sparse_moe.gate": "ffn_gate_inp"}
GEMMA3 = {"post_attention_layernorm": "post_attention_norm",
          "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
EXPERT = {"w1": "gate", "w2": "down", "w3": "up", "gate_proj": "gate", "up_proj": "up",
          "down_proj": "down"}
DTYPES = {"F32": np.float32, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, z = t["data_offsets"]
        if t["dtype"] == "BF16":
            w = (np.frombuffer(data[a:z], np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            w = np.frombuffer(data[a:z], DTYPES[t["dtype"]])
        out[name] = w.reshape(t["shape"])
    return out


def read_weights(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values()))
             if os.path.exists(index) else ["model.safetensors"])
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(d, f)))
    return {k: v.astype(np.float32) for k, v in out.items()}


def permute(w, heads):
    """llama.cpp's row order for llama's q/k: each head's halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensors(c, arch, weights):
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    experts = {}
    for name, w in sorted(weights.items()):
        if name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            g = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}[name]
        else:
            m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
            layer, part, suffix = m.groups()
            e = re.fullmatch(r"(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)", part)
            if e:
                key = f"blk.{layer}.ffn_{EXPERT[e.group(2)]}_exps.{suffix}"
                experts.setdefault(key, []).append((int(e.group(1)), w))
                continue
            g = GEMMA3.get(part) if arch == "gemma3" else None
            g = f"blk.{layer}.{g or LAYER[part]}.{suffix}"
            if arch == "llama" and part in ("self_attn.q_proj", "self_attn.k_proj"):
                w = permute(w, heads if part == "self_attn.q_proj" else kv)
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w + 1.0
        yield g, w
    for key, parts in sorted(experts.items()):
        yield key, np.stack([w for _, w in sorted(parts, key=lambda p: p[0])])


def add_config(wr, c, arch):
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    rope = c.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    wr.add_context_length(c["max_position_embeddings"])
    wr.add_embedding_length(c["hidden_size"])
    wr.add_block_count(c["num_hidden_layers"])
    wr.add_feed_forward_length(c["intermediate_size"])
    wr.add_head_count(heads)
    wr.add_head_count_kv(c.get("num_key_value_heads", heads))
    wr.add_key_length(head_dim)
    wr.add_value_length(head_dim)
    wr.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    wr.add_rope_freq_base(rope.get("rope_theta", c.get("rope_theta", 10000.0)))
    wr.add_layer_norm_rms_eps(c["rms_norm_eps"])
    wr.add_vocab_size(c["vocab_size"])
    n_exp = c.get("num_local_experts") or c.get("num_experts")
    if n_exp:
        wr.add_expert_count(n_exp)
        wr.add_expert_used_count(c["num_experts_per_tok"])
    if c.get("moe_intermediate_size"):
        wr.add_expert_feed_forward_length(c["moe_intermediate_size"])
    if arch == "gemma3":
        wr.add_sliding_window(c["sliding_window"])
        wr.add_key_value(f"{arch}.attention.sliding_window_pattern",
                         [t == "sliding_attention" for t in c["layer_types"]],
                         gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.BOOL)
        local = (c.get("rope_parameters") or {}).get("sliding_attention", {})
        wr.add_key_value(f"{arch}.rope.freq_base_swa", float(local.get("rope_theta", 10000.0)),
                         gguf.GGUFValueType.FLOAT32)


def add_tokenizer(wr, d):
    t = json.load(open(os.path.join(d, "tokenizer.json")))
    vocab = dict(t["model"]["vocab"])
    special = {a["id"] for a in t["added_tokens"] if a.get("special")}
    vocab.update({a["content"]: a["id"] for a in t["added_tokens"]})
    tokens = [tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    spm = t["model"].get("byte_fallback", False)
    types = [6 if spm and re.fullmatch(r"<0x[0-9A-F]{2}>", s) else 3 if i in special else 1
             for i, s in enumerate(tokens)]
    wr.add_tokenizer_model("llama" if spm else "gpt2")
    if not spm:
        wr.add_tokenizer_pre("gpt-2")
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    wr.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]])
    ids = {a["content"]: a["id"] for a in t["added_tokens"]}
    for name, key in (("bos", "<s>"), ("eos", "</s>"), ("unk", "<unk>")):
        if key in ids:
            getattr(wr, f"add_{name}_token_id")(ids[key])
    if not spm:
        wr.add_eos_token_id(ids["<|endoftext|>"])
    wr.add_add_bos_token(spm)


def main(src, dst):
    c = json.load(open(os.path.join(src, "config.json")))
    arch = ARCH[c["model_type"]]
    wr = gguf.GGUFWriter(dst, arch)
    wr.add_name(os.path.basename(os.path.normpath(src)))
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_config(wr, c, arch)
    add_tokenizer(wr, src)
    for name, w in tensors(c, arch, read_weights(src)):
        half = w.ndim >= 2 and "ffn_gate_inp" not in name  # routers stay F32, as llama.cpp's
        wr.add_tensor(name, w.astype(np.float16 if half else np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
