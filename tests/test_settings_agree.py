"""Every server setting gets the same verdict for the same value through its environment
variable, its command-line flag and its Ray application argument.

Parametrised over the declarations (``config.SETTINGS`` and ``batching.KNOBS``), so a
setting added to either is tried here without a line of its own. An empty value is left
out: a variable set to nothing means unset (the default), as a container's ``-e X=`` does.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mmserver.batching import KNOBS
from mmserver.cli import build_parser, settings_from_args
from mmserver.config import SETTINGS, Settings
from mmserver.ray.settings import ARGUMENTS, ClusterSettings

#: Values every declaration is tried with: bounds of counts and sizes, words and choices.
PROBES = ("0", "1", "-1", "2", "1.5", "65536", "65536.5", "1e3", "abc", "true", "off", "nan",
          "inf", " 3 ", "none", "process", "timer", "measured", "/a", f"/a{os.pathsep}/b",
          os.pathsep)
#: Values a YAML file of the Ray application may hold instead of text.
YAML_PROBES = (0, 1, -1, 2.5, True, ["/a"], [])

DECLARED = [(setting.env, setting.flag_name, setting.key if setting.ray else None,
             lambda s, field=setting.field: getattr(s, field)) for setting in SETTINGS] + \
           [(knob.env, knob.flag, knob.key, lambda s: s.batch) for knob in KNOBS]
IDS = [env for env, *_ in DECLARED]


def _verdict(build):
    """What an edge made of the value: ("accepted", the setting) or ("refused",)."""
    try:
        return ("accepted", build())
    except ValueError:
        return ("refused",)
    except SystemExit as exit_:  # argparse refuses a flag's value by exiting with 2
        assert exit_.code == 2
        return ("refused",)


def _through_env(value_of, env, raw):
    return _verdict(lambda: value_of(Settings.from_env({env: raw})))


def _through_flag(value_of, flag, raw):
    return _verdict(lambda: value_of(settings_from_args(
        build_parser().parse_args(["serve", f"{flag}={raw}"]), environ={})))


def _through_ray(value_of, key, raw):
    return _verdict(lambda: value_of(ClusterSettings.from_args({key: raw}, environ={}).server))


@pytest.mark.parametrize("env, flag, key, value_of", DECLARED, ids=IDS)
def test_every_edge_gives_a_value_the_same_verdict(env, flag, key, value_of, capsys):
    """capsys: argparse's refusals go to stderr."""
    for raw in PROBES:
        by_env = _through_env(value_of, env, raw)
        if flag:
            assert _through_flag(value_of, flag, raw) == by_env, (raw, flag)
        if key:
            assert _through_ray(value_of, key, raw) == by_env, (raw, key)


@pytest.mark.parametrize("env, flag, key, value_of",
                         [declared for declared in DECLARED if declared[2]],
                         ids=[key for *_, key, _ in DECLARED if key])
def test_a_yaml_value_gets_the_verdict_of_its_text(env, flag, key, value_of):
    """``deploy/ray_serve.yaml`` may give a number or a list where ``serve run`` gives text:
    a YAML value that is accepted gives what its text gives, and a list of folders the
    verdict of the folders joined (a value of the wrong type, 5 for folders, is refused)."""
    for value in YAML_PROBES:
        as_yaml = _through_ray(value_of, key, value)
        if isinstance(value, list):
            as_text = _through_ray(value_of, key, os.pathsep.join(value)) if value else \
                ("refused",)
        elif isinstance(value, bool):
            continue  # true in YAML is no number; as text it is the word, which may be a choice
        else:
            as_text = _through_ray(value_of, key, str(value))
        if as_yaml[0] == "accepted" or isinstance(value, list):
            assert as_yaml == as_text, (key, value)


def test_max_models_zero_is_refused_everywhere():
    """The case that started this: 0 models was accepted from the variable and refused on Ray."""
    assert _through_env(lambda s: s.max_models, "MMSERVER_MAX_MODELS", "0") == ("refused",)
    assert _through_ray(lambda s: s.max_models, "max_models", "0") == ("refused",)
    assert _through_ray(lambda s: s.max_models, "max_models", 0) == ("refused",)


def test_every_ray_argument_is_declared():
    declared = {setting.key for setting in SETTINGS if setting.ray} | {k.key for k in KNOBS}
    cluster_shape = {"num_replicas", "replica_cpus", "max_ongoing_requests",
                     "max_replicas_per_node"}
    assert set(ARGUMENTS) == declared | cluster_shape


def test_the_readme_lists_every_setting_with_its_flag():
    """The README's settings table is where a user looks a setting up."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("### Settings"):]
    table = table[:table.index("\n\n", table.index("|---|"))]
    rows = {line.split("|")[1].strip(): line.split("|")[2] for line in table.splitlines()
            if line.startswith("| `")}
    for setting in SETTINGS:
        assert f"`{setting.env}`" in rows, setting.env
        if setting.flag:
            assert f"`{setting.flag_name}`" in rows[f"`{setting.env}`"], setting.env
