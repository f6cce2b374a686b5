"""The Ray Serve and LitServe peers of ``bench/peers.py``, one function each, and the Ray
Serve peer of ``bench/text_batching.py`` (``ray-text``: minilm with a token budget).

``peers.py`` starts ``python bench/peer_servers.py ray|litserve --port PORT --model-dir DIR
--max-batch-size 16 --max-wait-ms 5 --max-queue-size 256`` pinned to the server core with
``OMP_NUM_THREADS=1``; every process either framework starts inherits that pinning. Both
read the same ``.npy`` body as the other peers, call the TorchScript model once per batch
under ``torch.inference_mode()`` and answer one JSON row list per request (``[[10 floats]]``).
Each uses its own batching, at the same settings as the other peers.
"""

import argparse
import importlib.util
import io
import os
import signal
import tempfile
from pathlib import Path
from typing import Annotated

import numpy as np
import torch


def _exit(signum, frame):
    raise SystemExit(0)


def serve_ray(port: int, model_dir: Path, max_batch_size: int, max_wait_ms: float,
              max_queue_size: int) -> None:
    """A single-node Ray cluster of one CPU in this process, Serve's HTTP proxy on ``port``.

    One replica, no autoscaling, ``@serve.batch`` around the model call. The replica's
    ``max_ongoing_requests`` is raised from Serve's default of 5 to ``max_queue_size``:
    with 5, no batch could ever hold more than 5 requests, and mmserver too queues up to
    ``max_queue_size``. Otherwise Ray's defaults, but for three things that are about this
    launcher, not the serving path: the usage-stats report is off (no network), the cluster
    stays on loopback (Ray otherwise advertises the machine's routable address), and the
    workers' logs are not streamed to this driver (a cluster deployed with ``serve deploy``
    has no driver to stream them to); Serve still writes its access logs to files.
    """
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # node address: 127.0.0.1
    import ray
    from ray import serve

    @serve.deployment(num_replicas=1, max_ongoing_requests=max_queue_size,
                      ray_actor_options={"num_cpus": 1})
    class CNN:
        def __init__(self, path: str):
            torch.set_num_threads(1)
            self.model = torch.jit.load(path, map_location="cpu").eval()

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=max_wait_ms / 1000)
        async def predict(self, inputs: list[np.ndarray]) -> list[list]:
            with torch.inference_mode():
                rows = self.model(torch.from_numpy(np.concatenate(inputs))).tolist()
            return [[row] for row in rows]

        async def __call__(self, request) -> list:
            body = await request.body()
            return await self.predict(np.load(io.BytesIO(body), allow_pickle=False))

    with tempfile.TemporaryDirectory(prefix="ray-", ignore_cleanup_errors=True) as tmp:
        ray.init(num_cpus=1, include_dashboard=False, object_store_memory=100 * 2**20,
                 _temp_dir=tmp, log_to_driver=False)
        signal.signal(signal.SIGTERM, _exit)  # after ray.init, which installs its own
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port},
                        proxy_location="HeadOnly")
            serve.run(CNN.bind(str(model_dir / "model.pt")), route_prefix="/")
            signal.pause()
        finally:
            serve.shutdown()
            ray.shutdown()


def serve_ray_text(port: int, model_dir: Path, max_batch_tokens: int, max_wait_ms: float,
                   max_queue_size: int) -> None:
    """The minilm example folder behind Ray Serve, its batches bounded by padded tokens.

    As ``serve_ray``, but each request is a JSON list of strings, tokenized in the request's
    handler with the folder's own tokenizer (as mmserver tokenizes in its decode step), and
    ``@serve.batch`` counts a batch's size with ``batch_size_fn``: rows × the longest row,
    the padded tokens of the call, at most ``max_batch_tokens``. Serve's batch has no second
    bound on rows, so unlike mmserver's ``max_batch_size`` of 64 nothing caps them but the
    budget. The call pads to the batch's longest and runs the folder's ``predict_fn``.
    """
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import json

    import ray
    from ray import serve

    from mmserver.batching.sequences import collate
    from mmserver.text import TextCodec

    def padded_tokens(items: list) -> int:
        return len(items) * max(item.longest for item in items)

    @serve.deployment(num_replicas=1, max_ongoing_requests=max_queue_size,
                      ray_actor_options={"num_cpus": 1})
    class Text:
        def __init__(self, folder: str):
            torch.set_num_threads(1)
            spec = importlib.util.spec_from_file_location(
                "minilm_code", Path(folder) / "code" / "inference.py")
            self.code = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(self.code)
            self.model = self.code.model_fn(folder)
            settings = json.loads((Path(folder) / "mmserver.json").read_text())
            self.codec = TextCodec.declared(settings["text"], Path(folder))

        @serve.batch(max_batch_size=max_batch_tokens, batch_wait_timeout_s=max_wait_ms / 1000,
                     batch_size_fn=padded_tokens)
        async def embed(self, requests: list) -> list[list]:
            with torch.inference_mode():
                vectors = self.code.predict_fn(collate(requests), self.model).tolist()
            answers, start = [], 0
            for request in requests:
                answers.append(vectors[start:start + len(request)])
                start += len(request)
            return answers

        async def __call__(self, request) -> list:
            return await self.embed(self.codec.tokenized(json.loads(await request.body())))

    with tempfile.TemporaryDirectory(prefix="ray-", ignore_cleanup_errors=True) as tmp:
        ray.init(num_cpus=1, include_dashboard=False, object_store_memory=100 * 2**20,
                 _temp_dir=tmp, log_to_driver=False)
        signal.signal(signal.SIGTERM, _exit)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port},
                        proxy_location="HeadOnly")
            serve.run(Text.bind(str(model_dir)), route_prefix="/")
            signal.pause()
        finally:
            serve.shutdown()
            ray.shutdown()


if importlib.util.find_spec("litserve") is not None:
    import litserve
    from fastapi import Body

    class LitCNN(litserve.LitAPI):
        """LitServe's API for the CNN; at module level because LitServe spawns its worker
        and hands it this object by pickling, which finds the class by name.

        The ``bytes`` annotation of ``decode_request`` is what LitServe hands to FastAPI:
        a non-JSON body arrives as its raw bytes (by default LitServe parses JSON).
        """

        def __init__(self, model_path: str, **kwargs):
            super().__init__(**kwargs)
            self.model_path = model_path

        def setup(self, device):
            torch.set_num_threads(1)
            self.model = torch.jit.load(self.model_path, map_location="cpu").eval()

        def decode_request(self, request: Annotated[bytes, Body()]) -> np.ndarray:
            return np.load(io.BytesIO(request), allow_pickle=False)

        def batch(self, inputs: list[np.ndarray]) -> torch.Tensor:
            return torch.from_numpy(np.concatenate(inputs))

        def predict(self, x: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                return self.model(x)

        def unbatch(self, output: torch.Tensor) -> list:
            return output.tolist()

        def encode_response(self, row: list):
            return [row]


def serve_litserve(port: int, model_dir: Path, max_batch_size: int, max_wait_ms: float,
                   max_queue_size: int) -> None:
    """LitServe with one inference worker on the CPU and one API server (its default for one
    worker), its own batching at ``max_batch_size``/``max_wait_ms``, its default queues.

    LitServe has no bound on its queue, so ``max_queue_size`` is unused.
    """
    api = LitCNN(str(model_dir / "model.pt"), max_batch_size=max_batch_size,
                 batch_timeout=max_wait_ms / 1000)
    server = litserve.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1,
                                healthcheck_path="/ping")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # LitServe's graceful shutdown
    server.run(host="127.0.0.1", port=port, log_level="warning", generate_client_file=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=("ray", "litserve", "ray-text"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--max-batch-size", type=int, required=True,
                        help="rows; for ray-text, padded tokens (max_batch_tokens)")
    parser.add_argument("--max-wait-ms", type=float, required=True)
    parser.add_argument("--max-queue-size", type=int, required=True)
    args = parser.parse_args()
    serve = {"ray": serve_ray, "litserve": serve_litserve, "ray-text": serve_ray_text}[args.peer]
    serve(args.port, args.model_dir, args.max_batch_size, args.max_wait_ms, args.max_queue_size)


if __name__ == "__main__":
    main()
