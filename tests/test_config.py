"""Settings come from SageMaker's and mmserver's variables; flags override them."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmserver.batching import BatchSettings
from mmserver.cli import build_parser, settings_from_args
from mmserver.config import Settings


def test_defaults_follow_sagemaker():
    settings = Settings.from_env({})
    assert settings.port == 8080
    assert settings.multi_model is True
    assert settings.max_payload_bytes == 6 * 1024 * 1024
    assert settings.model_roots == (Path("/opt/ml/models"),)
    assert settings.batch == BatchSettings(16, 0.005, 256, "greedy")


def test_variables_are_read():
    settings = Settings.from_env({
        "SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_MULTI_MODEL": "false",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "1.5", "SAGEMAKER_MODEL_SERVER_TIMEOUT": "7",
        "SAGEMAKER_PROGRAM": "serve.py", "MMSERVER_MAX_BATCH_SIZE": "8",
        "MMSERVER_MAX_WAIT_MS": "12.5", "MMSERVER_MAX_QUEUE_SIZE": "3",
        "MMSERVER_BATCH_POLICY": "timer", "MMSERVER_BATCH_SIZING": "measured",
        "MMSERVER_MEMORY_BUDGET_MB": "100",
        "MMSERVER_MAX_MODELS": "4", "MMSERVER_MODEL_ROOTS": "/a:/b"})
    assert settings.port == 9000 and settings.multi_model is False
    assert settings.max_payload_bytes == int(1.5 * 1024 * 1024)
    assert settings.model_server_timeout_seconds == 7 and settings.program == "serve.py"
    assert settings.batch == BatchSettings(8, 0.0125, 3, "timer", "measured")
    assert settings.memory_budget_bytes == 100 * 1024 * 1024 and settings.max_models == 4
    assert settings.model_roots == (Path("/a"), Path("/b"))


@pytest.mark.parametrize("env", [{"MMSERVER_MAX_BATCH_SIZE": "many"},
                                 {"MMSERVER_MAX_BATCH_SIZE": "0"},
                                 {"MMSERVER_BATCH_POLICY": "fifo"},
                                 {"MMSERVER_BATCH_SIZING": "fastest"},
                                 {"MMSERVER_MAX_WAIT_MS": "-1"},
                                 {"MMSERVER_HTTP_WORKERS": "0"},
                                 {"MMSERVER_HTTP_WORKERS": "two"},
                                 {"MMSERVER_ISOLATION": "thread"}])
def test_bad_variables_are_refused_by_name(env):
    with pytest.raises(ValueError, match=next(iter(env))):
        Settings.from_env(env)


def test_flags_override_the_environment(monkeypatch):
    monkeypatch.setenv("MMSERVER_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("SAGEMAKER_BIND_TO_PORT", "9000")
    args = build_parser().parse_args(["serve", "--max-batch-size", "4", "--max-wait-ms", "0",
                                      "--model-root", "/m", "--preload", "a=x/y"])
    settings = settings_from_args(args)
    assert settings.batch.max_batch_size == 4 and settings.batch.max_wait == 0
    assert settings.port == 9000
    assert settings.model_roots == (Path("/m"),)
    assert settings.preload == (("a", "x/y"),)
    assert settings.http_workers == 1
    assert settings_from_args(build_parser().parse_args(
        ["serve", "--http-workers", "3"])).http_workers == 3
    assert settings.isolation == "none"
    monkeypatch.setenv("MMSERVER_ISOLATION", "process")
    assert settings_from_args(build_parser().parse_args(["serve"])).isolation == "process"
    assert settings_from_args(build_parser().parse_args(
        ["serve", "--isolation", "none"])).isolation == "none"


def test_model_overrides_are_checked():
    base = BatchSettings()
    assert base.overridden({"max_batch_size": 64, "max_wait_ms": 2}) == BatchSettings(
        64, 0.002, 256, "greedy")
    for bad in ({"max_batch": 3}, {"max_batch_size": "3"}, {"max_wait_ms": True},
                {"policy": "fifo"}, {"batch_sizing": "fastest"}):
        with pytest.raises(ValueError):
            base.overridden(bad)


def test_torch_threads_are_divided_among_the_default_instances():
    from mmserver.process import intra_op_threads

    assert intra_op_threads(8, 1) == 8
    assert intra_op_threads(8, 2) == 4
    assert intra_op_threads(2, 3) == 1
    args = build_parser().parse_args(["serve", "--instances", "2"])
    assert settings_from_args(args).batch.instances == 2


def test_sagemaker_model_server_workers_sets_the_default_instances():
    assert Settings.from_env({"SAGEMAKER_MODEL_SERVER_WORKERS": "3"}).batch.instances == 3
    assert Settings.from_env({"SAGEMAKER_MODEL_SERVER_WORKERS": "3",
                              "MMSERVER_INSTANCES": "2"}).batch.instances == 2
    with pytest.raises(ValueError, match="MMSERVER_INSTANCES"):
        Settings.from_env({"MMSERVER_INSTANCES": "0"})


def test_installing_requirements_is_on_unless_turned_off():
    assert Settings.from_env({}).install_requirements is True
    assert Settings.from_env({"MMSERVER_INSTALL_REQUIREMENTS": "0"}).install_requirements is False
    with pytest.raises(ValueError, match="^MMSERVER_INSTALL_REQUIREMENTS must be true or false"):
        Settings.from_env({"MMSERVER_INSTALL_REQUIREMENTS": "maybe"})
