#!/usr/bin/env python3
"""Eval throughput through the RabbitMQ job queue with 1, 2 and 3 local workers, against the
same eval in process, on this machine (2 cores: the workers share them, so no gain is expected
here; on separate GPUs each worker adds its own model and its own compute).

Workloads (3 variants, temperature 0): "answers", 40 rows x 3 variants, max_tokens 24; and
"overhead", the same jobs with max_tokens 1, where the queue's cost per job dominates. Fresh
workers for every run (a warm worker would answer repeated prompts from its prompt cache, which
the in-process eval, a fresh engine per run, cannot), started and their model loaded before the
eval starts; the figure is the eval's own wall time (summary.json `wall_seconds`: publishing,
waiting, scoring, writing). Threads: the in-process eval
and a single worker use 2; with 2 or 3 workers each uses 1 (3 workers oversubscribe 2 cores).

Needs RabbitMQ on 127.0.0.1:5672 (scripts/services.sh) and rabbitmqctl for clean-up.

    .venv/bin/python bench/queue_eval.py [--runs 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
ABSERVE = ROOT / "target" / "release" / "abserve"
AMQP = os.environ.get("ABSERVE_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2f")
MODEL_FLAGS = ["--model", str(MODEL), "--memory-budget", "1GiB", "--context", "512"]


def experiment(max_tokens):
    parts = []
    for vid, system in [("a", "Answer briefly."), ("b", "Answer in one sentence."), ("c", "You are a careful assistant.")]:
        parts.append(f'[[experiment.variants]]\nid = "{vid}"\nsystem = "{system}"\ntemperature = 0.0\nmax_tokens = {max_tokens}\n')
    return '[[experiment]]\nname = "bench"\n' + "".join(parts) + '[[scorer]]\ntype = "length"\n'


def dataset(path, rows):
    with open(path, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": f"r{i}", "input": f"Question {i}: what is {i} times {i + 1}, and why?"}) + "\n")


def run_eval(tmp, exp, rows, extra):
    out = Path(tempfile.mkdtemp(dir=tmp))
    subprocess.run([ABSERVE, "eval", exp, "--dataset", rows, "--out", out, *extra], check=True, capture_output=True)
    s = json.loads((out / "summary.json").read_text())
    assert sum(v["answered"] for v in s["variants"]) == 3 * 40, s
    return s["wall_seconds"]


def start_workers(n, queue):
    threads = "2" if n == 1 else "1"
    procs = []
    for _ in range(n):
        p = subprocess.Popen([ABSERVE, "worker", "--amqp", AMQP, "--queue", queue, "--threads", threads, *MODEL_FLAGS],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(p)
    for p in procs:  # wait until each has loaded its model and consumes
        for line in p.stderr:
            if "consuming" in line:
                break
    return procs


def stop(procs, queue):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=60)
    for q in [queue, queue + ".dead"]:
        subprocess.run(["rabbitmqctl", "-q", "delete_queue", q], capture_output=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="abserve-queue-bench-")
    rows = Path(tmp) / "rows.jsonl"
    dataset(rows, 40)
    table = {}
    for name, max_tokens in [("answers", 24), ("overhead", 1)]:
        exp = Path(tmp) / f"{name}.toml"
        exp.write_text(experiment(max_tokens))
        walls = {"in process": [run_eval(tmp, exp, rows, [*MODEL_FLAGS, "--threads", "2"]) for _ in range(args.runs)]}
        for n in [1, 2, 3]:
            runs = []
            for r in range(args.runs):
                queue = f"bench.{os.getpid()}.{name}.{n}.{r}"
                procs = start_workers(n, queue)
                try:
                    runs.append(run_eval(tmp, exp, rows, ["--amqp", AMQP, "--queue", queue]))
                finally:
                    stop(procs, queue)
            walls[f"{n} worker{'s' if n > 1 else ''}"] = runs
        table[name] = {k: statistics.median(v) for k, v in walls.items()}
        print(name, json.dumps(walls), flush=True)
    print("\n| workload | setup | eval wall (median) | jobs/s | vs in process |")
    print("|---|---|---:|---:|---:|")
    for name, walls in table.items():
        base = walls["in process"]
        for setup, w in walls.items():
            print(f"| {name} | {setup} | {w:.2f} s | {120 / w:.1f} | {base / w:.2f}x |")
    over = table["overhead"]
    print(f"\nqueue overhead per job (overhead workload, 1 worker vs in process): "
          f"{(over['1 worker'] - over['in process']) / 120 * 1000:.1f} ms")


if __name__ == "__main__":
    main()
