"""Scenario 2: many models, Zipf-popular traffic, and churn.

``--mm-models`` N copies of one small example (``--mm-many-example``,
default ``tabular``) are loaded as ``<example>-0`` ... ``<example>-<N-1>``
(several names may load the same url).

``ManyModelsUser``
    closed loop; each request picks model ``k`` (rank k+1) with probability
    proportional to 1 / (k+1)^s, s = ``--mm-zipf-s`` (1.2), so a few models
    take most of the traffic, as on a real multi-model endpoint.
``ChurnUser``
    one background user (``fixed_count = 1``) that, every
    ``--mm-churn-interval`` seconds, unloads one of the unpopular half of the
    models and loads it again, as SageMaker does when it makes room. It only
    touches models this run loaded itself.

A request that finds its model unloaded by the churn (404 ModelNotFound or
RunnerClosed) is counted as ``invoke <example>-* (model unloaded)``, a
success: it is the expected price of churn, not a server fault. A 404 for a
popular model, which is never churned, is a failure.

    locust -f loadtests --headless -u 8 -r 8 -t 30s ManyModelsUser ChurnUser
"""

import random

import _repo_path  # noqa: F401 (before any loadtests import)
import gevent
from locust import task

from loadtests._common import STATE, InvokeUser, example_url, zipf_weights


def model_names(options) -> list[str]:
    return [f"{options.mm_many_example}-{i}" for i in range(max(1, options.mm_models))]


def churned_names(options) -> list[str]:
    """The unpopular half (by Zipf rank): the only models the churn user touches."""
    names = model_names(options)
    return names[(len(names) + 1) // 2:]


class _ManyModels(InvokeUser):
    abstract = True

    @classmethod
    def required_models(cls, options):
        return {name: options.mm_many_example for name in model_names(options)}


class ManyModelsUser(_ManyModels):
    def on_start(self):
        super().on_start()
        options = self.environment.parsed_options
        self.names = model_names(options)
        self.weights = zipf_weights(len(self.names), options.mm_zipf_s)
        self.churned = set(churned_names(options))

    @task
    def invoke_popular(self):
        name = random.choices(self.names, self.weights)[0]
        self.invoke(name, self.environment.parsed_options.mm_many_example,
                    churned=name in self.churned,
                    label=f"{self.environment.parsed_options.mm_many_example}-*")


class ChurnUser(_ManyModels):
    fixed_count = 1
    #: how long a model stays unloaded before it is loaded again, s
    unloaded_for = 0.2

    def wait_time(self):
        return float(self.environment.parsed_options.mm_churn_interval)

    @task
    def churn(self):
        options = self.environment.parsed_options
        candidates = [n for n in churned_names(options) if n in STATE.owned]
        if not candidates:
            return  # every unpopular name was loaded before this run: not ours to unload
        name = random.choice(candidates)
        url = example_url(self.environment, options.mm_many_example)
        with self.client.delete(f"/models/{name}", name="churn: unload",
                                catch_response=True) as response:
            if response.status_code not in (200, 404, 409):  # 409: still loading
                response.failure(f"HTTP {response.status_code}: {response.content[:200]!r}")
                return
            response.success()
        gevent.sleep(self.unloaded_for)
        with self.client.post("/models", json={"model_name": name, "url": url},
                              name="churn: load", catch_response=True) as response:
            if response.status_code in (200, 409):
                response.success()
            else:
                response.failure(f"HTTP {response.status_code}: {response.content[:200]!r}")
