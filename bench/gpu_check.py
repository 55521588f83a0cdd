#!/usr/bin/env python3
"""The GPU check (issue 31) in one run, for a lent GPU machine with no network and little time:
scripts/gpu-check.sh calls it with a CUDA bundle (scripts/cuda-build.sh) and, as the peer,
llama.cpp's own server built from the same llama.cpp source for the same device.

Every part is bounded in time and recorded even when another part fails; the results go to
OUT/gpu-check.json and OUT/gpu-check.txt, the servers' logs to OUT/logs.tar.gz.

  1. devices and plans at --device-memory 50% and 90%; a server at each: llama.cpp's device
     buffers after load against the plan's device part, and the device memory the process holds
     (nvidia-smi, against the GPU's use before it started)
  2. the seed's verification: 8 variants x 16 prompts at the plan's full concurrency
     (loadtest --assert-no-oom), device use sampled every 0.2 s against the device budget,
     /ready polled throughout, the log searched for "out of memory"
  3. the prefix store: prompts restored from host memory into device KV give the same greedy
     tokens as a server without the store
  4. the A/B benchmark (8 variants, distinct system prompts, 8 and 16 clients) against the peer
  5. decode tokens/s at 1, 8, 32 and 64 concurrent sequences against the peer
  6. structured outputs (mask time per token, forced share) and a LoRA adapter (scale 0 equals
     the base model; scale 1 against the peer's per-request LoRA)

    python3 bench/gpu_check.py --bin B --model M --out DIR [--peer llama-server] [--lora F]
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_traffic import measure, warm  # noqa: E402

A = None
RESULTS = {}
TEXT = []
LOGS = []


def say(msg):
    print(msg, flush=True)
    TEXT.append(msg)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http(url, body=None, timeout=120):
    """(status, parsed JSON or text)"""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read().decode(), e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def gpu_used_mib():
    """The GPU's memory in use (MiB), 0 where there is no nvidia-smi (a run on a CPU)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except FileNotFoundError:
        return 0
    return int(out.split()[0])


class Server:
    """abserve or the peer in its own process; stopped by stop()."""

    def __init__(self, name, cmd, timeout=180):
        self.name = name
        self.log_path = Path(A.out) / "logs" / f"{name}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        LOGS.append(self.log_path)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [c.replace("{PORT}", str(self.port)) for c in cmd]
        with open(self.log_path, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
        self.p = subprocess.Popen(cmd, stdout=open(self.log_path, "a"), stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.p.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.p.returncode}: {self.log()[-2000:]}")
            try:
                if http(self.base + "/health", timeout=2)[0] == 200:
                    self.load_s = time.time() - t0
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{name} not healthy in {timeout} s")

    def log(self):
        return self.log_path.read_text(errors="replace")

    def metrics(self):
        raw = urllib.request.urlopen(self.base + "/metrics", timeout=10).read().decode()
        m = {}
        for line in raw.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    m[k] = float(v)
                except ValueError:
                    pass
        return m

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def abserve(name, *extra):
    return Server(name, [A.bin, "serve", "--model", A.model, "--port", "{PORT}", "--model-id", "m",
                         "--data-dir", tempfile.mkdtemp(prefix="abserve-gpu-"), *extra])


def peer(name, parallel, ctx_per_slot, *extra, fa="on"):
    return Server(name, [A.peer, "-m", A.model, "--host", "127.0.0.1", "--port", "{PORT}", "-np", str(parallel),
                         "-c", str(parallel * ctx_per_slot), "-ngl", "999", "-fa", fa, "-t", "2", "--no-ui",
                         *extra])


def step(name, seconds):
    """Runs one part, records its result or its error, and never lets it take the rest down."""
    def wrap(f):
        t0 = time.time()
        say(f"\n## {name}")
        try:
            RESULTS[name] = f()
        except Exception as e:  # noqa: BLE001 - every part is reported, failed or not
            RESULTS[name] = {"error": f"{type(e).__name__}: {e}"}
            say(f"FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
        took = time.time() - t0
        say(f"({name}: {took:.0f} s of a planned {seconds} s)")
        return f
    return wrap


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--peer")
    ap.add_argument("--peer-log", help="the peer's build log, when it is being built beside this run")
    ap.add_argument("--peer-deadline", type=float, default=420,
                    help="seconds from the start to wait at most for the peer's build")
    ap.add_argument("--lora")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="")
    A = ap.parse_args()
    Path(A.out).mkdir(parents=True, exist_ok=True)
    only = set(filter(None, A.only.split(",")))
    t_start = time.time()
    # abserve's parts first; the peer's last, once its build (if one runs beside) is done
    parts = [devices_and_plans, seed_verification, prefix_store, structured, adapters, wait_for_peer,
             ab_benchmark, decode, adapters_peer]
    for part in parts:
        if only and part.__name__ not in only:
            continue
        part(t_start) if part is wait_for_peer else part()
        RESULTS["total_seconds"] = round(time.time() - t_start, 1)
        save()


def save():
    """The results so far, in --out and, on the device machine, in $OUT (what comes back even
    when the call runs out of time)."""
    for d in filter(None, [A.out, os.environ.get("OUT")]):
        Path(d, "gpu-check.json").write_text(json.dumps(RESULTS, indent=1))
        Path(d, "gpu-check.txt").write_text("\n".join(TEXT) + "\n")
        with tarfile.open(Path(d, "logs.tar.gz"), "w:gz") as t:
            for p in LOGS:
                if p.exists():
                    t.add(p, arcname=p.name)


def devices_and_plans():
    @step("devices and plans", 60)
    def run():
        r = {}
        r["nvidia-smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,memory.used,driver_version",
                                          "--format=csv"], capture_output=True, text=True).stdout
        say(r["nvidia-smi"].strip())
        r["devices"] = subprocess.run([A.bin, "devices"], capture_output=True, text=True).stdout
        say(r["devices"].strip())
        for share in ["50%", "90%"]:
            plan = subprocess.run([A.bin, "plan", "--model", A.model, "--context", "2048", "--device-memory", share],
                                  capture_output=True, text=True)
            say(f"### plan --device-memory {share}\n{plan.stdout.strip()}{plan.stderr.strip()}")
            base = gpu_used_mib()
            s = abserve(f"plan-{share[:-1]}", "--context", "2048", "--device-memory", share)
            try:
                time.sleep(1)
                used = gpu_used_mib() - base
                line = [l for l in s.log().splitlines() if "in device buffers" in l]
                ready = http(s.base + "/ready")[1]
            finally:
                s.stop()
            r[share] = {"plan": plan.stdout, "log_line": line, "process_device_mib": used,
                        "ready_device": ready.get("device") if isinstance(ready, dict) else ready,
                        "load_seconds": round(s.load_s, 2)}
            say(f"server at {share}: {line}; the process holds {used} MiB of device memory (nvidia-smi); "
                f"/ready device: {r[share]['ready_device']}")
        return r


def seed_verification():
    @step("seed verification: 8 variants x 16 prompts at full concurrency", 120)
    def run():
        base_mib = gpu_used_mib()
        s = abserve("seed", "--context", "2048", "--device-memory", "90%")
        samples, readies, stop = [], [], threading.Event()

        def sample():
            while not stop.is_set():
                try:
                    samples.append(gpu_used_mib() - base_mib)
                except Exception:  # noqa: BLE001
                    pass
                time.sleep(0.2)

        def ready():
            while not stop.is_set():
                try:
                    readies.append(http(s.base + "/ready", timeout=30)[0])
                except OSError as e:
                    readies.append(str(e))
                time.sleep(0.5)

        threads = [threading.Thread(target=sample), threading.Thread(target=ready)]
        try:
            ready_body = http(s.base + "/ready")[1]
            slots = (ready_body.get("plan") or {}).get("seq_slots") if isinstance(ready_body, dict) else None
            concurrency = int(slots or 64)
            for t in threads:
                t.start()
            lt = subprocess.run([A.bin, "loadtest", "--url", s.base, "--variants", "8", "--concurrency", str(concurrency),
                                 "--requests", "128", "--prompt-tokens", "64", "--max-tokens", "64", "--ignore-eos",
                                 "--stream", "--assert-no-oom", "--json"], capture_output=True, text=True, timeout=240)
            time.sleep(0.5)
        finally:
            stop.set()
            for t in threads:
                if t.is_alive():
                    t.join()
            s.stop()
        log = s.log()
        oom = [l for l in log.splitlines() if re.search(r"out of memory|cudaMalloc failed|OOM", l, re.I)]
        try:
            report = json.loads(lt.stdout)
        except ValueError:
            report = {"stdout": lt.stdout[-2000:]}
        budget = (ready_body.get("device") or {}).get("budget_bytes") if isinstance(ready_body, dict) else None
        peak = max(samples) if samples else None
        r = {"loadtest_exit": lt.returncode, "loadtest_stderr": lt.stderr[-2000:], "concurrency": concurrency,
             "by_class": report.get("by_class"), "tok_s": report.get("generated_tokens_per_second"),
             "peak_process_device_mib": peak, "device_budget_mib": budget and budget / 2**20, "samples": len(samples),
             "ready_statuses": sorted(set(map(str, readies))), "ready_polls": len(readies), "oom_lines": oom,
             "ready": ready_body}
        say(f"loadtest exit {lt.returncode} (--assert-no-oom), {concurrency} at once: {r['by_class']}, "
            f"{r['tok_s']} tok/s; device use peak {peak} MiB over {len(samples)} samples against a budget of "
            f"{r['device_budget_mib']} MiB; /ready statuses {r['ready_statuses']} over {len(readies)} polls; "
            f"out-of-memory lines: {len(oom)}")
        return r


PREFIX_PROMPTS = [(round_, v) for round_ in (1, 2) for v in range(1, 5)]


def prefix_answers(s):
    out = []
    for round_, v in PREFIX_PROMPTS:
        body = {"model": "m", "max_tokens": 16, "temperature": 0, "messages": [
            {"role": "system", "content": f"You are support agent number {v} of the Acme company. Always answer in one "
                                          f"short sentence, politely, and mention the order number when the customer "
                                          f"gives one. Variant {v}."},
            {"role": "user", "content": f"Where is my order {round_}?"}]}
        status, r = http(s.base + "/v1/chat/completions", body)
        out.append(r["choices"][0]["message"]["content"] if status == 200 else f"HTTP {status}: {r}")
    return out


def prefix_store():
    @step("prefix store on the device", 40)
    def run():
        s = abserve("prefix-store", "--max-sequences", "2", "--context", "512")
        try:
            stored = prefix_answers(s)
            m = s.metrics()
        finally:
            s.stop()
        s = abserve("prefix-none", "--max-sequences", "2", "--context", "512", "--prefix-store", "0")
        try:
            plain = prefix_answers(s)
        finally:
            s.stop()
        restores = m.get("abserve_prefix_restores_total")
        same = sum(a == b for a, b in zip(stored, plain))
        say(f"{restores} prefixes restored from host memory into device KV; {same} of {len(plain)} answers equal to "
            f"the server without the store")
        return {"restores": restores, "equal": same, "of": len(plain), "stored": stored, "plain": plain}


def ab_benchmark():
    @step("A/B benchmark against llama.cpp's server", 150)
    def run():
        if not A.peer:
            raise RuntimeError("no peer binary")
        r = {}
        for case, clients in [("ab8", 8), ("ab16", 16)]:
            xs = {"abserve": [], "llama.cpp": []}
            for run_ in range(A.runs):
                for name in ["abserve", "llama.cpp"]:
                    s = (abserve(f"{case}-{run_}", "--max-sequences", "8", "--context", "512", "--queue-timeout", "300",
                                 "--threads", "2") if name == "abserve" else peer(f"{case}-{run_}-peer", 8, 512))
                    try:
                        warm(s.base, "ab")
                        xs[name].append(measure(s.base, "ab", clients))
                    finally:
                        s.stop()
                    say(f"run {run_} {case} {name}: {xs[name][-1][0]:.1f} tok/s, p50 {xs[name][-1][1]:.3f} s")
            ratios = [a[0] / b[0] for a, b in zip(xs["abserve"], xs["llama.cpp"])]
            r[case] = {"abserve_tok_s": statistics.median(x[0] for x in xs["abserve"]),
                       "peer_tok_s": statistics.median(x[0] for x in xs["llama.cpp"]),
                       "ratio_median": statistics.median(ratios), "ratios": ratios, "raw": xs}
            say(f"{case}: abserve {r[case]['abserve_tok_s']:.1f} tok/s, llama.cpp {r[case]['peer_tok_s']:.1f} tok/s, "
                f"ratio median {r[case]['ratio_median']:.2f} (runs {', '.join(f'{x:.2f}' for x in ratios)})")
        return r


def decode_round(base, n):
    bodies = [{"model": "m", "max_tokens": 128, "temperature": 0, "ignore_eos": True,
               "messages": [{"role": "user", "content": f"Write story number {i} about a lighthouse keeper."}]}
              for i in range(n)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as ex:
        rs = list(ex.map(lambda b: http(base + "/v1/chat/completions", b, timeout=300), bodies))
    wall = time.perf_counter() - t0
    assert all(st == 200 for st, _ in rs), [st for st, _ in rs]
    return sum(r["usage"]["completion_tokens"] for _, r in rs) / wall


def decode():
    @step("decode tokens/s at 1, 8, 32, 64 sequences", 90)
    def run():
        if not A.peer:
            raise RuntimeError("no peer binary")
        r = {}
        for name in ["abserve", "llama.cpp"]:
            s = (abserve("decode", "--max-sequences", "64", "--context", "512", "--threads", "2") if name == "abserve"
                 else peer("decode-peer", 64, 512))
            try:
                decode_round(s.base, 8)
                for n in [1, 8, 32, 64]:
                    r.setdefault(n, {})[name] = [decode_round(s.base, n) for _ in range(A.runs)]
            finally:
                s.stop()
        for n, x in r.items():
            a, b = statistics.median(x["abserve"]), statistics.median(x["llama.cpp"])
            x["ratio"] = a / b
            say(f"decode, {n} concurrent: abserve {a:.0f} tok/s, llama.cpp {b:.0f} tok/s, {a / b:.2f}x")
        return r


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags", "address"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
                         "address": {"type": "object", "additionalProperties": False, "required": ["city", "zip"],
                                     "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}


def structured():
    @step("structured outputs on the device", 40)
    def run():
        s = abserve("structured", "--max-sequences", "16", "--context", "1024")
        try:
            body = {"model": "m", "max_tokens": 160, "temperature": 0,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}
            bodies = [dict(body, messages=[{"role": "user", "content": f"Describe person number {i} as JSON."}])
                      for i in range(16)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=16) as ex:
                rs = list(ex.map(lambda b: http(s.base + "/v1/chat/completions", b), bodies))
            wall = time.perf_counter() - t0
            m = s.metrics()
        finally:
            s.stop()
        ok = [r for st, r in rs if st == 200]
        parsed = 0
        for r in ok:
            try:
                json.loads(r["choices"][0]["message"]["content"])
                parsed += 1
            except (ValueError, KeyError):
                pass
        toks = sum(r["usage"]["completion_tokens"] for r in ok)
        masks, mask_s = m.get("abserve_grammar_masks_total", 0), m.get("abserve_grammar_mask_seconds_total", 0)
        forced = m.get("abserve_forced_tokens_total", 0)
        r = {"answers": len(ok), "parsed": parsed, "tokens": toks, "tok_s": toks / wall,
             "mask_us_per_token": 1e6 * mask_s / masks if masks else None, "masks": masks,
             "forced_share": forced / toks if toks else None}
        say(f"16 JSON-schema requests at once: {parsed} of {len(ok)} answers parse; {r['tok_s']:.0f} tok/s; "
            f"mask {r['mask_us_per_token']} us per masked token over {masks:.0f} masks; forced share {r['forced_share']}")
        return r


def wait_for_peer(t_start):
    @step("the peer's build", 300)
    def run():
        t0 = time.time()
        while A.peer and not os.access(A.peer, os.X_OK) and time.time() - t_start < A.peer_deadline:
            log = Path(A.peer_log).read_text(errors="replace") if A.peer_log and Path(A.peer_log).exists() else ""
            if "Error" in log and "gpu-peer:" not in log and not building():
                break
            time.sleep(2)
        tail = Path(A.peer_log).read_text(errors="replace")[-3000:] if A.peer_log and Path(A.peer_log).exists() else ""
        if A.peer_log and Path(A.peer_log).exists():
            LOGS.append(Path(A.peer_log))
        if not (A.peer and os.access(A.peer, os.X_OK)):
            A.peer = None
            raise RuntimeError(f"no peer binary after {time.time() - t0:.0f} s of waiting; its build log ends: {tail[-800:]}")
        say(f"peer ready after {time.time() - t0:.0f} s of waiting: {A.peer}")
        return {"waited_s": round(time.time() - t0, 1)}


def building():
    out = subprocess.run(["pgrep", "-f", "gpu-peer.sh build"], capture_output=True, text=True).stdout
    return bool(out.strip())


LORA_PROMPT = "The capital of France is"


def adapters():
    @step("a LoRA adapter on the device", 60)
    def run():
        if not A.lora:
            raise RuntimeError("no adapter file")
        # plain attention on both sides for the comparison with the peer: the two llama.cpp
        # versions' flash-attention kernels round differently, and the random adapter leaves
        # near-ties that such rounding flips (measured on the CPU: docs/adapters.md)
        s = abserve("lora", "--max-sequences", "4", "--context", "512", "--lora", A.lora, "--flash-attn", "off")
        try:
            def ask(adapters):
                body = {"model": "m", "max_tokens": 24, "temperature": 0, "prompt": LORA_PROMPT}
                if adapters is not None:
                    body["adapters"] = adapters
                st, r = http(s.base + "/v1/completions", body)
                return r["choices"][0]["text"] if st == 200 else f"HTTP {st}: {r}"
            base = ask(None)
            zero = ask([{"path": A.lora, "scale": 0.0}])
            one = ask([{"path": A.lora, "scale": 1.0}])
        finally:
            s.stop()
        r = {"base": base, "scale0": zero, "scale1": one}
        RESULTS["_lora_scale1"] = one
        say(f"scale 0 equals the base model: {zero == base}; scale 1 differs from it: {one != base}")
        return r


def adapters_peer():
    @step("the LoRA adapter on llama.cpp's server", 30)
    def run():
        if not (A.peer and A.lora):
            raise RuntimeError("no peer binary or no adapter")
        p = peer("lora-peer", 1, 512, "--lora", A.lora, fa="off")
        try:
            body = {"model": "m", "max_tokens": 24, "temperature": 0, "prompt": LORA_PROMPT,
                    "lora": [{"id": 0, "scale": 1.0}]}
            st, pr = http(p.base + "/v1/completions", body)
            theirs = pr["choices"][0]["text"] if st == 200 else f"HTTP {st}: {pr}"
        finally:
            p.stop()
        ours = RESULTS.get("_lora_scale1") or ""
        same = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y), min(len(ours), len(theirs)))
        say(f"scale 1 on abserve equals llama.cpp's server with the adapter: {ours == theirs}; the first "
            f"{same} characters agree (abserve {ours!r}, llama.cpp {theirs!r})")
        return {"abserve": ours, "peer": theirs}


if __name__ == "__main__":
    main()
