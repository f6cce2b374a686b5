"""Every 503 keeps its reason: one error class per reason, each counted under its own
``reason`` in ``/metrics``.

The servers' own 503s are provoked in the tests of what causes them: a full queue in
``test_server_integration.py``, an isolated model's process loading again in
``test_isolation.py``, a lost engine in ``test_http_workers.py``.
"""

from __future__ import annotations

import inspect

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mmserver import errors
from mmserver.http.errors import V2, domain_error_answer, status_for
from mmserver.metrics import Metrics

DOMAIN_ERRORS = [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
                 if issubclass(cls, errors.MMServerError)]
ANSWERED_503 = [cls for cls in DOMAIN_ERRORS if status_for(cls("x")) == 503]


def test_every_503_has_a_reason_and_every_reason_an_error():
    assert {cls.unavailable for cls in ANSWERED_503} == set(errors.Unavailable)
    assert len({cls.unavailable for cls in ANSWERED_503}) == len(ANSWERED_503), ANSWERED_503
    for cls in DOMAIN_ERRORS:
        assert (cls.unavailable is not None) == (cls in ANSWERED_503), cls


@pytest.mark.parametrize("cls", ANSWERED_503, ids=lambda cls: cls.__name__)
def test_a_503_names_its_reason_by_its_type_on_both_protocols(cls):
    """The load tests tell the reasons apart by the body's ``type``; v2 answers 503 too."""
    answer = domain_error_answer(cls("why"))
    assert (answer.status, answer.body["type"]) == (503, cls.__name__)
    assert status_for(cls("why"), V2) == 503


def test_metrics_count_each_reason_beside_the_status():
    metrics = Metrics()
    # A served model that declares no series of its own (an isolated model's are its process's).
    metrics.model_loaded(type("Isolated", (), {"name": "m", "memory_bytes": 0,
                                               "export_metrics": lambda self, metrics: None})())
    for reason in errors.Unavailable:
        metrics.request_done("m", 503, 0.001, reason)
    metrics.request_done("m", 503, 0.001, errors.Unavailable.QUEUE_FULL)
    metrics.request_done("m", 200, 0.001)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.exposition().decode())
               for s in family.samples}
    by_reason = {dict(labels)["reason"]: value for (name, labels), value in samples.items()
                 if name == "mmserver_requests_unavailable_total"}
    assert by_reason == {reason.value: (2.0 if reason == "queue_full" else 1.0)
                         for reason in errors.Unavailable}
    assert samples[("mmserver_requests_total", (("model", "m"), ("status", "503")))] == \
        sum(by_reason.values())
