"""Scenario 5: sentences of mixed lengths to the text model.

``SentencesUser``
    closed loop on the ``minilm`` example: each request carries one text drawn
    from ``loadtests.texts``' mix (``--mm-long-fraction`` of them long, 100-180
    words; the rest short, 5-20 words), waits for its vector, pauses
    ``--mm-think-ms`` and sends the next. Its rows in locust's statistics are
    named by the text's length, ``invoke minilm (short)`` and
    ``invoke minilm (long)``: a short text that shares a call with a long one
    pays for the long one's padded tokens, and the two rows show what each
    length waits. A 503 is a failure, as in the steady scenario.

The model's ``max_batch_tokens`` (its ``mmserver.json``) bounds each call's padded
tokens; describe (``GET /models/minilm``) reports the run's padding efficiency.

    locust -f loadtests --headless -u 16 -r 16 -t 30s --mm-think-ms 0 SentencesUser
"""

import json
import random

import _repo_path  # noqa: F401 (before any loadtests import)
from locust import task

from loadtests import texts
from loadtests._common import InvokeUser, option

MODEL = "minilm"
#: Texts drawn per user: enough that a run rarely sends one text twice in a row.
POOL_SIZE = 256
JSON_HEADERS = {"Content-Type": "application/json"}


class SentencesUser(InvokeUser):
    """Closed loop on minilm, one text of the mix per request, rows named by its length."""

    @classmethod
    def required_models(cls, options):
        return {MODEL: MODEL}

    def on_start(self):
        fraction = float(option(self.environment, "mm_long_fraction", 0.2))
        self.pool = texts.texts(POOL_SIZE, fraction, seed=random.randrange(2**32))

    @task
    def invoke_text(self):
        text = random.choice(self.pool)
        long = len(text.split()) >= texts.LONG_WORDS[0]
        self.invoke(MODEL, MODEL, label=f"{MODEL} ({'long' if long else 'short'})",
                    body=json.dumps([text]).encode(), headers=JSON_HEADERS)
