"""Structured outputs through the official `openai` client: `response_format` with a JSON
schema yields JSON valid for it (checked with `jsonschema`), streamed and not, on chat and
completions; malformed or unenforceable formats are a 400 that names the field."""

import json

import jsonschema
import openai
import pytest

MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]


def obj(properties, required=None):
    """A closed object, as OpenAI's strict mode asks for."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


NAME = {"type": "string", "maxLength": 12}
SHORT = {"type": "string", "maxLength": 6}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}

# Twenty shapes; strings and arrays are bounded so that a small token budget completes them.
SCHEMAS = [
    obj({"name": NAME}),
    obj({"age": AGE}),
    obj({"ok": {"type": "boolean"}}),
    obj({"ratio": {"type": "number", "minimum": 0, "maximum": 1}}),
    obj({"score": {"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5}}),
    obj({"color": {"enum": ["red", "green", "blue"]}}),
    obj({"level": {"enum": [1, 2, 3]}, "flag": {"const": "on"}}),
    obj({"name": NAME, "age": AGE, "email": SHORT}, required=["name"]),
    obj({"tags": {"type": "array", "items": SHORT, "maxItems": 3}}),
    obj({"ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 4}}),
    obj({"point": obj({"x": AGE, "y": AGE})}),
    obj({"user": obj({"name": NAME, "address": obj({"city": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})}),
    obj({"items": {"type": "array", "items": obj({"sku": SHORT, "qty": {"type": "integer", "minimum": 1, "maximum": 9}}), "maxItems": 2}}),
    obj({"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]}}),
    obj({"kind": {"type": ["string", "null"], "maxLength": 5}}),
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 5},
    {"type": "array", "prefixItems": [NAME, AGE], "items": False},
    obj({"first": NAME, "last": NAME, "nick": SHORT, "age": AGE}, required=["first", "last"]),
    {
        "$defs": {"pet": obj({"name": NAME, "legs": {"type": "integer", "minimum": 0, "maximum": 8}})},
        **obj({"pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}, "maxItems": 2}}),
    },
    obj({"matrix": {"type": "array", "items": {"type": "array", "items": {"enum": [0, 1]}, "maxItems": 3}, "maxItems": 2}, "done": {"type": "boolean"}}),
]


def response_format(i, schema):
    return {"type": "json_schema", "json_schema": {"name": f"shape_{i}", "schema": schema, "strict": True}}


def streamed_text(stream):
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += (c.delta.content or "") if hasattr(c, "delta") else (c.text or "")
            finish = c.finish_reason or finish
    return text, finish


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_json_schema_responses_validate(client, model, i):
    schema = SCHEMAS[i]
    args = dict(model=model, max_tokens=128, temperature=0, response_format=response_format(i, schema))
    if i % 4 == 3:
        # The legacy endpoint takes the same field.
        full = client.completions.create(prompt="A record as JSON:", extra_body={"response_format": args.pop("response_format")}, **args)
        text, finish = full.choices[0].text, full.choices[0].finish_reason
        streamed, streamed_finish = streamed_text(
            client.completions.create(prompt="A record as JSON:", stream=True, extra_body={"response_format": response_format(i, schema)}, **args)
        )
    else:
        full = client.chat.completions.create(messages=MESSAGES, **args)
        text, finish = full.choices[0].message.content, full.choices[0].finish_reason
        streamed, streamed_finish = streamed_text(client.chat.completions.create(messages=MESSAGES, stream=True, **args))
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), schema)
    assert (streamed, streamed_finish) == (text, finish)


def test_sampled_json_schema_and_json_object(client, model):
    schema = SCHEMAS[12]
    r = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=128, temperature=1.0, seed=7, n=3,
        response_format=response_format(12, schema),
    )
    for c in r.choices:
        jsonschema.validate(json.loads(c.message.content), schema)
    r = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=128, temperature=0, response_format={"type": "json_object"}
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


GOOD = {"type": "object"}
MALFORMED = [
    ("json", "response_format"),
    ({"type": "yaml"}, "response_format.type"),
    ({"json_schema": {"name": "a", "schema": GOOD}}, "response_format.type"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": GOOD}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "has space", "schema": GOOD}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "a"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": GOOD, "strict": "yes"}}, "response_format.json_schema.strict"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": GOOD, "schemas": {}}}, "response_format.json_schema.schemas"),
]


@pytest.mark.parametrize("fmt,param", MALFORMED)
def test_malformed_response_format_is_a_400_naming_the_field(client, model, fmt, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, response_format=fmt)
    assert e.value.body["param"] == param, e.value.body


@pytest.mark.parametrize(
    "schema,keyword",
    [
        ({"type": "object", "not": {"required": ["a"]}}, "not"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
        ({"$ref": "#/$defs/nowhere"}, "nowhere"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum"),
    ],
)
def test_unenforceable_schema_is_a_400_naming_it(client, model, schema, keyword):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=4, response_format=response_format(0, schema)
        )
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert keyword in e.value.body["message"], e.value.body
