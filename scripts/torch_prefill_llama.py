# PyTorch + transformers prefill speed (one forward over N random tokens, fp16, sdpa attention,
# logits of the last position only) on random-init Llama shapes, the peer of docs/benchmarks.md.
# Usage (on the GPU machine): python3 scripts/torch_prefill_llama.py llama-3-8b 2048
import sys, time, json, torch
from transformers import LlamaConfig, LlamaForCausalLM

shapes = {
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192,
                       tie_word_embeddings=False),
}
name, n = sys.argv[1], int(sys.argv[2])
cfg = LlamaConfig(**shapes[name], rms_norm_eps=1e-5, eos_token_id=None, bos_token_id=None, pad_token_id=0)
torch.manual_seed(0)
with torch.device("cuda"):
    m = LlamaForCausalLM(cfg).to(torch.float16).eval()
ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
def run():
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad():
        m(ids, logits_to_keep=1, use_cache=False)
    torch.cuda.synchronize()
    return time.perf_counter() - t
run()
best = min(run() for _ in range(3))
print("TORCH_PREFILL", json.dumps({"shape": name, "tokens": n, "s": best, "tok_s": n / best,
                                   "attn": m.config._attn_implementation}), flush=True)
