"""schemathesis against GET /openapi.json of a real server: property-based requests to every
operation (positive and negative data, fixed seed, bounded examples); no 5xx, no response that
violates its documented schema, status or content type."""
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import Server

HERE = Path(__file__).resolve().parent

EXPERIMENTS = """
[[experiment]]
name = "fuzz"
[[experiment.variants]]
id = "a"
max_tokens = 4
[[experiment.variants]]
id = "b"
max_tokens = 4
"""


def test_schemathesis_finds_no_server_error_and_no_answer_off_its_schema():
    f = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
    f.write(EXPERIMENTS)
    f.close()
    # a short context keeps every generation the fuzzer gets through short
    s = Server("--experiments", f.name, context=64)
    try:
        cli = Path(sys.executable).parent / "schemathesis"
        r = subprocess.run(
            [str(cli), "--config-file", str(HERE / "schemathesis.toml"), "run", s.base + "/openapi.json", "--max-examples", "25"],
            capture_output=True, text=True, timeout=900,
        )
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-6000:]
        assert "generated" in out and " 0 passed" not in out, out[-3000:]
    finally:
        s.stop()
