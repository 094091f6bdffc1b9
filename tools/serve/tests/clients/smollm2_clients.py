"""The official `openai` client against `fastllm serve` running SmolLM2 (base URL as the only
argument): structured output under a JSON schema for 20 different prompts (each answer must
parse and validate against the schema) and a refused invalid schema. Exits non-zero on the
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
    print("smollm2 clients: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
