"""Starts real `abserve serve` processes on 127.0.0.1 with ports the OS picks."""
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# ABSERVE_BIN: another build to test (e.g. an older one, to see a new test fail on it)
BINARY = Path(os.environ.get("ABSERVE_BIN", ROOT / "target" / "release" / "abserve"))
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "smol"


class Server:
    def __init__(self, *extra, context=512, model=MODEL, defaults=False, log=None):
        """`defaults`: abserve's own memory budget, context and KV cells instead of the tests'
        small ones; `log`: a file for its log (stderr)."""
        assert BINARY.exists(), "build first: cargo build --release"
        self.data_dir = tempfile.mkdtemp(prefix="abserve-py-")
        sizes = [] if defaults else ["--memory-budget", "1GiB", "--context", str(context), "--kv-cells", "4096"]
        args = [
            str(BINARY), "serve", "--model", str(model), "--model-id", MODEL_ID, "--port", "0",
            "--threads", "2", *sizes, "--data-dir", self.data_dir, *extra,
        ]
        err = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
        self.base = None
        ready = threading.Event()

        def read():
            for line in self.proc.stdout:
                if line.startswith("abserve: listening on "):
                    self.base = line.split()[-1]
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60):
            self.proc.kill()
            raise RuntimeError("abserve serve did not start")
        assert self.base.startswith("http://127.0.0.1:")
        self.url = self.base + "/v1"

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def keyed_server():
    s = Server("--api-key", "test-key")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tiny_server():
    s = Server("--max-queue", "1", "--max-sequences", "2")
    yield s
    s.stop()
