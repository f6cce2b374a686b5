#!/bin/sh
# The image's entrypoint. SageMaker starts a serving container as
# `docker run IMAGE serve`; `serve` becomes `mmserver serve`, which reads the
# SAGEMAKER_* and MMSERVER_* variables (README, DESIGN.md section 7).
#
# `exec` replaces this shell, so mmserver is PID 1 and receives SIGTERM itself:
# it stops accepting connections, answers every accepted request and exits
# (within 25 s; SageMaker sends SIGKILL 30 s after SIGTERM).
set -eu
if [ "$#" -eq 0 ]; then
    set -- serve
fi
case "$1" in
    serve | examples) exec mmserver "$@" ;;
    -*) exec mmserver serve "$@" ;;   # flags alone: `docker run IMAGE --max-batch-size 32`
    train)
        echo "mmserver: this image serves models; it has no 'train' command" >&2
        exit 2 ;;
    *) exec "$@" ;;                   # anything else, e.g. `docker run IMAGE python -V`
esac
