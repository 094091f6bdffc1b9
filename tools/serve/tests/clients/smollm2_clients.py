"""The official `openai` client against `fastllm serve` running SmolLM2 (base URL as the only
argument): structured output under a JSON schema for 20 different prompts (each answer must
parse and validate against the schema), a refused invalid schema, and a tool-call round trip
(a forced call, its result sent back, a text answer; also streamed). Exits non-zero on the
first failed check."""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
from openai import OpenAI

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "category": {"enum": ["animal", "food", "place", "tool", "person", "other"]},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {
            "type": "array",
            "items": {"type": "string", "maxLength": 20},
            "maxItems": 3,
        },
    },
    "required": ["name", "category", "rating", "tags"],
    "additionalProperties": False,
}

TOPICS = [
    "a cat", "Paris", "a hammer", "pizza", "Albert Einstein", "the ocean", "a violin",
    "sushi", "Mount Everest", "a bicycle", "an elephant", "Tokyo", "a screwdriver",
    "chocolate cake", "Marie Curie", "a rainforest", "a laptop", "a penguin", "Rome",
    "a garden",
]


def structured(oa: OpenAI, topic: str) -> None:
    c = oa.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": f"Describe {topic} as a JSON record."}],
        max_tokens=200,
        temperature=0.7,
        seed=len(topic),
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "record", "schema": SCHEMA, "strict": True},
        },
    )
    ch = c.choices[0]
    assert ch.finish_reason == "stop", (topic, ch)
    value = json.loads(ch.message.content)
    jsonschema.validate(value, SCHEMA)


WEATHER = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}]


def tool_round_trip(oa: OpenAI) -> None:
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    c = oa.chat.completions.create(
        model="smollm2", messages=msgs, tools=WEATHER, tool_choice="required",
        temperature=0, max_tokens=80,
    )
    ch = c.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    call = ch.message.tool_calls[0]
    assert call.function.name == "get_weather", call
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str), args
    # the same call, streamed: the deltas assemble to it
    s = oa.chat.completions.create(
        model="smollm2", messages=msgs, tools=WEATHER,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0, max_tokens=80, stream=True,
    )
    name, streamed_args, reason = "", "", None
    for chunk in s:
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            name += d.function.name or ""
            streamed_args += d.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    assert (name, reason) == ("get_weather", "tool_calls"), (name, reason)
    assert json.loads(streamed_args) == args, (streamed_args, args)
    msgs.append(ch.message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"})
    c = oa.chat.completions.create(
        model="smollm2", messages=msgs, tools=WEATHER, temperature=0, max_tokens=40
    )
    answer = c.choices[0].message
    assert c.choices[0].finish_reason in ("stop", "length"), c
    assert answer.content and not answer.tool_calls, answer


def main(base: str) -> None:
    oa = OpenAI(base_url=base + "/v1", api_key="none", timeout=600)
    assert len(set(TOPICS)) == 20
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda t: structured(oa, t), TOPICS))
    try:
        oa.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Hi"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "bad", "schema": {"type": "objekt"}},
            },
        )
        raise AssertionError("an invalid schema was accepted")
    except openai.BadRequestError as e:
        assert "invalid JSON schema" in str(e) and "objekt" in str(e), e
    tool_round_trip(oa)
    print("smollm2 clients: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
