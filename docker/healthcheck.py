"""The image's HEALTHCHECK: exit 0 when GET /ping answers 200, else 1.

Slim Python images have no curl; the standard library is enough. Proxies from
the environment are ignored: the server is on this container's loopback.
"""

import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("SAGEMAKER_BIND_TO_PORT") or "8080"
    host = os.environ.get("MMSERVER_HOST") or "0.0.0.0"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{host}:{port}/ping", timeout=4) as response:
            status = response.status
    except OSError as error:
        print(f"unhealthy: {error}", file=sys.stderr)
        return 1
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
