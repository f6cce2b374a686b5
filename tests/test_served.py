"""Every kind of served model implements the whole ``ServedModel`` protocol, with its
signatures: the service calls the protocol and never asks which kind it holds, so a
method one kind lacks would be an AttributeError (500) on that kind's models only."""

from __future__ import annotations

import inspect

import pytest

from mmserver.engine.isolated import IsolatedModel
from mmserver.loaded_model import LoadedModel
from mmserver.served import ServedModel

KINDS = (LoadedModel, IsolatedModel)
METHODS = sorted(name for name, member in vars(ServedModel).items()
                 if not name.startswith("_") and (callable(member) or isinstance(member, property)))


def test_the_protocol_names_what_the_service_asks():
    assert {"invoke", "describe", "row_codecs", "export_metrics", "exposition", "close"} <= \
        set(METHODS)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.__name__)
@pytest.mark.parametrize("name", METHODS)
def test_each_kind_implements_each_method_with_its_signature(kind, name):
    declared, implemented = vars(ServedModel)[name], getattr(kind, name)
    if isinstance(declared, property):
        assert isinstance(implemented, property)
        return
    assert list(inspect.signature(implemented).parameters) == \
        list(inspect.signature(declared).parameters)
    assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(declared)
