"""The official `openai` client and TGI's `text-generation` client against a running
`fastllm serve` (base URL as the only argument): plain and streamed generation, logprobs,
n > 1, TGI details, top tokens and best_of, and refusals of unsupported fields
and unknown tools. Exits non-zero on the
first failed check."""

import sys

import openai
from openai import OpenAI
from text_generation import Client
from text_generation.errors import BadRequestError


def main(base: str) -> None:
    tgi = Client(base, timeout=120)
    r = tgi.generate("Hello world", max_new_tokens=8, top_n_tokens=2)
    d = r.details
    assert d.generated_tokens == len(d.tokens) >= 1, d
    assert all(t.logprob is not None and t.logprob <= 0 for t in d.tokens), d.tokens
    assert len(d.top_tokens) == len(d.tokens) and all(len(t) == 2 for t in d.top_tokens)
    assert d.tokens[0].logprob <= d.top_tokens[0][0].logprob + 1e-6
    text, last = "", None
    for ev in tgi.generate_stream("Hello world", max_new_tokens=8):
        text += ev.token.text
        last = ev
    assert last.generated_text == r.generated_text == text, (last, r.generated_text, text)
    assert last.details.generated_tokens == d.generated_tokens
    r = tgi.generate("Hello", max_new_tokens=4, best_of=2, do_sample=True)
    assert len(r.details.best_of_sequences) == 1, r.details
    assert abs(r.details.seed - r.details.best_of_sequences[0].seed) == 1, r.details
    try:
        tgi.generate("Hello", max_new_tokens=2, watermark=True)
        raise AssertionError("watermark was accepted")
    except BadRequestError as e:
        assert "watermark" in str(e), e

    oa = OpenAI(base_url=base + "/v1", api_key="none")
    msgs = [{"role": "user", "content": "Hi there"}]
    c = oa.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
    answer = c.choices[0].message.content
    assert c.usage.completion_tokens >= 1
    s = oa.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=6, temperature=0, stream=True
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices) == answer
    c = oa.chat.completions.create(
        model="tiny",
        messages=msgs,
        max_tokens=5,
        temperature=0.8,
        n=2,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    assert [ch.index for ch in c.choices] == [0, 1]
    for ch in c.choices:
        content = ch.logprobs.content
        assert len(content) == 5 and all(len(e.top_logprobs) == 3 for e in content)
        assert all(e.logprob <= e.top_logprobs[0].logprob + 1e-6 for e in content)
    assert c.model_extra["seed"] is not None
    p = oa.completions.create(model="tiny", prompt="Hello", max_tokens=4, logprobs=2, temperature=0)
    lp = p.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) >= 1
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
    try:
        oa.chat.completions.create(
            model="tiny",
            messages=msgs,
            tools=tools,
            tool_choice={"type": "function", "function": {"name": "g"}},
        )
        raise AssertionError("an unknown tool name was accepted")
    except openai.BadRequestError as e:
        assert "unknown tool 'g'" in str(e), e
    print("real clients: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
