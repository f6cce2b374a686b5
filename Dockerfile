# mmserver as an Amazon SageMaker multi-model serving container.
#
#   docker build -t mmserver .
#   docker run -p 8080:8080 -v "$PWD/models:/opt/ml/models" mmserver serve
#
# Build arguments:
#   BASE_IMAGE       any Debian-like image with Python 3.11 (python3 -m venv) and useradd.
#   TORCH_INDEX_URL  where torch and torchvision come from, which decides the build:
#                      https://download.pytorch.org/whl/cpu     CPU only (default, smallest)
#                      https://download.pytorch.org/whl/cu130   CUDA 13.0
#                      "" (empty)                               pip's own configured index;
#                                                               with pip's defaults, torch's
#                                                               plain Linux build (CUDA 13,
#                                                               nvidia-* wheels, several GB)
#                    The versions are always the pins in pyproject.toml.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first, from pyproject.toml alone, so that editing mmserver/ does not
# reinstall torch. torch and torchvision come from TORCH_INDEX_URL only (no silent
# fallback to another build), everything else from pip's configured index; an empty
# TORCH_INDEX_URL means that index for torch too.
COPY pyproject.toml docker/requirements.py /tmp/mmserver/
RUN python3 -m venv "$VIRTUAL_ENV" \
    && python /tmp/mmserver/requirements.py /tmp/mmserver/pyproject.toml --torch > /tmp/torch.txt \
    && python /tmp/mmserver/requirements.py /tmp/mmserver/pyproject.toml > /tmp/requirements.txt \
    && pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} -r /tmp/torch.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && python -c "import torch, torchvision; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__)" \
    && rm -rf /tmp/torch.txt /tmp/requirements.txt /tmp/mmserver

COPY pyproject.toml README.md /tmp/mmserver/
COPY mmserver /tmp/mmserver/mmserver
RUN pip install --no-cache-dir --no-deps /tmp/mmserver \
    && pip check \
    && rm -rf /tmp/mmserver

COPY docker/entrypoint.sh /usr/local/bin/mmserver-entrypoint
COPY docker/healthcheck.py /usr/local/lib/mmserver/healthcheck.py

# SageMaker puts (multi-model) or unpacks (single model) the artifacts here.
RUN useradd --create-home --uid 1000 --user-group mmserver \
    && mkdir -p /opt/ml/models /opt/ml/model

LABEL com.amazonaws.sagemaker.capabilities.multi-models=true \
      com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true \
      org.opencontainers.image.title=mmserver \
      org.opencontainers.image.description="Request-batching PyTorch server behind SageMaker's multi-model contract"

# Inside a container the server must listen on every interface, not 127.0.0.1.
ENV MMSERVER_HOST=0.0.0.0 \
    MMSERVER_MODEL_ROOTS=/opt/ml/models

# 8081: the v2 protocol over gRPC (MMSERVER_GRPC_PORT; 0 turns it off).
EXPOSE 8080 8081
USER 1000:1000
WORKDIR /home/mmserver

HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/usr/local/lib/mmserver/healthcheck.py"]

# SIGTERM drains accepted requests (25 s at most); give `docker stop -t 30`, as SageMaker does.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/mmserver-entrypoint"]
CMD ["serve"]
