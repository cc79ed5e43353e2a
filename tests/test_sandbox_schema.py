"""The sandbox server restates the action schema (it runs without trouper's models, for
the container images to come): this test holds the two copies equal."""

from __future__ import annotations

import typing
from types import NoneType, UnionType

from pydantic import BaseModel

from trouper.messages.actions import RUNTIME_KINDS, RuntimeAction
from trouper.runtimes.sandbox import requests

_JSON_TYPES = {str: {str}, bool: {bool}, int: {int}, float: {int, float}, NoneType: {NoneType}}
"""A model's annotation -> the Python types its JSON value may arrive as."""


def _models() -> dict[str, type]:
    union = typing.get_args(RuntimeAction)[0]
    return {model.model_fields["kind"].default: model for model in typing.get_args(union)}


def _accepted(annotation: object) -> set[type]:
    parts = typing.get_args(annotation) if isinstance(annotation, UnionType) else (annotation,)
    return set().union(*(_json_types(part) for part in parts))


def _json_types(part: object) -> set[type]:
    """A JSON object for a mapping or a model, an array for a tuple or a list."""
    origin = typing.get_origin(part) or part
    if origin is dict or (isinstance(origin, type) and issubclass(origin, BaseModel)):
        return {dict}
    if origin in (tuple, list):
        return {list}
    return _JSON_TYPES[part]  # type: ignore[index]


def test_the_sandbox_knows_exactly_the_runtime_actions():
    assert set(_models()) == set(RUNTIME_KINDS) == set(requests.FIELDS) == set(requests.REQUIRED)


def test_each_field_has_the_same_name_type_and_requiredness():
    for kind, model in _models().items():
        fields = {name: info for name, info in model.model_fields.items() if name != "kind"}
        assert set(fields) == set(requests.FIELDS[kind]), kind
        required = {name for name, info in fields.items() if info.is_required()}
        assert required == set(requests.REQUIRED[kind]), kind
        for name, info in fields.items():
            assert _accepted(info.annotation) == set(requests.FIELDS[kind][name]), (kind, name)
