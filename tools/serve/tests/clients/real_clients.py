"""The official `openai` client and TGI's `text-generation` client against a running
`fastllm serve` (base URL as the only argument): plain and streamed generation, logprobs,
n > 1, TGI details, top tokens, best_of and grammars (JSON, regex), and refusals of
unsupported fields and unknown tools. Exits non-zero on the first failed check."""

import json
import sys

import openai
from openai import OpenAI
from text_generation import Client
from text_generation.errors import BadRequestError
from text_generation.types import Grammar, GrammarType

# bounded, so the tiny model's noise still ends inside its context
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "kind": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "kind"],
    "additionalProperties": False,
}


def pet_ok(text: str) -> None:
    v = json.loads(text)
    assert set(v) == {"name", "age", "kind"}, v
    assert len(v["name"]) <= 10 and 0 <= v["age"] <= 30 and v["kind"] in ("cat", "dog"), v


def tgi_grammar(tgi: Client) -> None:
    """generate (always with details) and generate_stream with top_n_tokens and a JSON grammar;
    a regex."""
    g = Grammar(type=GrammarType.Json, value=PET)
    r = tgi.generate("Pet:", max_new_tokens=80, top_n_tokens=2, grammar=g,
                     do_sample=True, seed=3)
    pet_ok(r.generated_text)
    d = r.details
    assert d.finish_reason == "eos_token", d
    assert d.generated_tokens == len(d.tokens) == len(d.top_tokens) >= 1, d
    assert all(len(t) == 2 for t in d.top_tokens)
    text, last = "", None
    for ev in tgi.generate_stream("Pet:", max_new_tokens=80, top_n_tokens=2, grammar=g,
                                  do_sample=True, seed=3):
        text += ev.token.text
        assert len(ev.top_tokens) == 2, ev
        last = ev
    assert text == last.generated_text == r.generated_text, (text, last, r.generated_text)
    r = tgi.generate("Code:", max_new_tokens=10,
                     grammar=Grammar(type=GrammarType.Regex, value="[A-Z]{2}-[0-9]{3}"))
    t = r.generated_text
    assert len(t) == 6 and t[:2].isupper() and t[2] == "-" and t[3:].isdigit(), t
    try:
        tgi.generate("x", max_new_tokens=4, grammar=Grammar(type=GrammarType.Regex, value="(a"))
        raise AssertionError("an invalid regex was accepted")
    except BadRequestError as e:
        assert "invalid regular expression" in str(e), e


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

    tgi_grammar(tgi)

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
