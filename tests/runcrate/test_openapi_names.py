"""Every schema in the OpenAPI document is one Schema class. django-ninja files each component
under its class's bare name, so two classes of the same name (a `MachineOut` in two apps) are
silently merged into whichever was generated last, and every answer of the other one then
violates its documented schema. These tests walk the classes the operations really use and
compare them with the components the document publishes."""

import typing
from collections import defaultdict

import pytest
from pydantic import BaseModel

import config.urls  # noqa: F401  (mounts every app's router on the api)
from runcrate.api import api

REF = "#/components/schemas/{model}"


def _models_in(annotation: object) -> typing.Iterator[type[BaseModel]]:
    """The pydantic models an annotation names: itself, or inside list[…], X | None, dict[…]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for argument in typing.get_args(annotation):
        yield from _models_in(argument)


def _used_models() -> dict[str, set[type[BaseModel]]]:
    """Class name -> every class of that name reachable from an operation's input or answer."""
    seen: set[type[BaseModel]] = set()
    by_name: dict[str, set[type[BaseModel]]] = defaultdict(set)

    def visit(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        by_name[model.__name__].add(model)
        for field in model.model_fields.values():
            for inner in _models_in(field.annotation):
                visit(inner)

    for _prefix, router in api._routers:
        for path_view in router.path_operations.values():
            for operation in path_view.operations:
                for model in [*operation.models, *operation.response_models.values()]:
                    for inner in _models_in(model):
                        visit(inner)
    return by_name


@pytest.fixture(scope="module")
def components() -> dict[str, dict]:
    return api.get_openapi_schema()["components"]["schemas"]


def test_no_two_schema_classes_share_a_component_name(components):
    by_name = _used_models()

    shared = {
        name: sorted(f"{model.__module__}.{model.__qualname__}" for model in models)
        for name, models in by_name.items()
        if name in components and len(models) > 1
    }

    assert shared == {}, f"one OpenAPI component for several classes: {shared}"


def test_each_component_is_the_class_of_its_name(components):
    classes = {
        name: next(iter(models)) for name, models in _used_models().items() if name in components
    }
    # The walk reaches the document's schemas: the cluster's and the usage's machines included.
    assert {"ClusterOut", "ClusterUsageOut"} <= set(classes)

    for name, model in classes.items():
        own = model.model_json_schema(ref_template=REF)
        published = components[name]
        assert set(published.get("properties", {})) == set(own.get("properties", {})), name
        assert set(published.get("required", [])) == set(own.get("required", [])), name


def test_the_usage_machines_are_not_the_cluster_machines(components):
    cluster_machine = components["ClusterOut"]["properties"]["machines"]["items"]["$ref"]
    usage_machine = components["ClusterUsageOut"]["properties"]["machines"]["items"]["$ref"]

    assert cluster_machine != usage_machine
    assert "private_ip" in components[cluster_machine.rsplit("/", 1)[1]]["properties"]
    assert "cost" in components[usage_machine.rsplit("/", 1)[1]]["properties"]
