"""An S3-compatible server on 127.0.0.1 for the object-storage tests and the export benchmark: moto's
server mode (`moto[server]`, from PyPI), in its own process, with one change.

moto answers `PutObject` with `If-None-Match: *` (the conditional put delta-rs commits with) by a
412 when the key exists, but it checks and stores in two steps without a lock, and its server handles
requests on threads: two concurrent puts of the same new key could both succeed, which S3, MinIO and
R2 never allow. The WSGI wrapper below serializes conditional requests (If-None-Match / If-Match), so
the server behaves as the real stores do; other requests (data files) run concurrently.

    python -m tests.spark.s3_server --port PORT     (what `S3Server.start` runs)
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ACCESS_KEY = "epochlog-test"
SECRET_KEY = "epochlog-test-secret"
REGION = "us-east-1"
ROOT = Path(__file__).resolve().parents[2]


class _SerializeConditional:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if "HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ:
            with self.lock:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ["MOTO_PORT"] = str(args.port)
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = _SerializeConditional(DomainDispatcherApplication(create_backend_app))
    run_simple("127.0.0.1", args.port, app, threaded=True, request_handler=MotoRequestHandler)


class S3Server:
    """One server process; `env` holds the variables an exporter needs to reach it."""

    def __init__(self, log_path: Path | None = None) -> None:
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = log_path

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
                "AWS_ENDPOINT_URL": self.endpoint}

    def start(self, timeout_s: float = 60.0) -> S3Server:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        argv = [sys.executable, "-m", "tests.spark.s3_server", "--port", str(self.port)]
        if self.log_path is None:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        else:
            with open(self.log_path, "ab") as out:   # the child keeps its own descriptor
                self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the S3 server exited with {self.proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the S3 server did not listen within {timeout_s:.0f} s") from None
                time.sleep(0.1)

    def filesystem(self) -> Any:
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION, scheme="http",
                                 endpoint_override=f"127.0.0.1:{self.port}", allow_bucket_creation=True)

    def create_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


if __name__ == "__main__":
    main()
