"""One status enum everywhere: every status has a v2 repository state, every Ray
registration state is one of them, and the published description lists them all."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest

from mmserver.http.v2 import STATES, _indexed
from mmserver.loaded_model import ModelInfo
from mmserver.ray import registrations
from mmserver.status import ModelStatus


@pytest.mark.parametrize("status", list(ModelStatus))
def test_every_status_is_a_repository_state(status):
    """v2's index answers a state and a reason for any status a model can have, not a 500."""
    entry = _indexed(ModelInfo("m", "/models/m", status))
    assert entry["state"] in {"READY", "LOADING", "UNLOADING", "UNAVAILABLE"}
    assert isinstance(entry["reason"], str)
    assert ("version" in entry) == (status != ModelStatus.NOT_LOADED)
    assert STATES[status][0] == entry["state"]


def test_every_registration_state_is_a_model_status():
    """A cluster's registrations speak the same enum: what describe and v2 read off them."""
    assert all(isinstance(state, ModelStatus) for state in registrations.STATES)
    assert set(registrations._DESCRIBED) == set(registrations.STATES)
    assert registrations.Registration("m", "/models/m", 1).state is ModelStatus.LOADING


def test_the_published_description_lists_every_status():
    document = json.loads(files("mmserver.http").joinpath("openapi.json").read_text())
    listed = document["components"]["schemas"]["ModelDescription"]["properties"]["status"]["enum"]
    assert sorted(listed) == sorted(status.value for status in ModelStatus)
