# PyTorch + transformers decode speed on random-init Llama shapes, the peer of docs/benchmarks.md.
# Usage (on the GPU machine): python3 scripts/torch_bench_llama.py llama-3.2-1b llama-3-8b
# PyTorch + transformers decode speed on random-init Llama shapes (fp16, cuda, greedy generate).
import sys, time, json, torch
from transformers import LlamaConfig, LlamaForCausalLM
shapes = {
  "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=False),
  "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072, tie_word_embeddings=True,
                       head_dim=64, rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}
import transformers
print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name(0), flush=True)
for name in sys.argv[1:]:
    cfg = LlamaConfig(**shapes[name], rms_norm_eps=1e-5, eos_token_id=None, bos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = LlamaForCausalLM(cfg).to(torch.float16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 128), device="cuda")
    def gen(n):
        torch.cuda.synchronize(); t = time.perf_counter()
        with torch.no_grad():
            out = m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(ids))
        torch.cuda.synchronize()
        assert out.shape[1] == 128 + n
        return time.perf_counter() - t
    gen(8)
    t1 = min(gen(1) for _ in range(2))
    t128 = min(gen(128) for _ in range(2))
    print("TORCH", json.dumps({"shape": name, "gen128_s": t128, "tok_s_incl_prefill": 128 / t128,
                               "decode_tok_s": 127 / (t128 - t1), "prefill128_s": t1}), flush=True)
    del m; torch.cuda.empty_cache()
