#!/usr/bin/env bash
# Soak test (not in CI): `abserve serve` with a small budget under 1.5x its capacity for
# MINUTES (default 10) with `abserve loadtest --assert-no-oom`, then the resident-memory growth
# after warm-up (goal: under 2%) and every error class. Writes soak-out/report.json.
#   bash scripts/soak.sh [MINUTES]      (SOAK_SERVE_ARGS adds serve flags, e.g. --max-itl-ms 0)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-10}"
bash scripts/setup.sh >/dev/null
cargo build --release --bin abserve
mkdir -p soak-out
log=soak-out/serve.log
./target/release/abserve serve --port 0 --memory-budget 520MiB --context 512 --threads 2 \
    --data-dir soak-out/data ${SOAK_SERVE_ARGS:-} > "$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1 || true)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "soak: server did not start"; cat "$log"; exit 1; }
capacity=$(curl -s "$url/ready" | python3 -c 'import json,sys; print(json.load(sys.stdin)["plan"]["full_context_sequences"])')
clients=$(( capacity * 3 / 2 ))
echo "soak: $url, capacity $capacity sequences, $clients clients for $minutes min"
status=0
./target/release/abserve loadtest --url "$url/v1" --variants 8 --concurrency "$clients" \
    --duration $(( minutes * 60 )) --prompt-tokens uniform:16-300 --max-tokens uniform:16-128 \
    --stream --ignore-eos --assert-no-oom --timeout 300 --json > soak-out/report.json || status=$?
python3 - "$minutes" <<'PY'
import json, sys
r = json.load(open("soak-out/report.json"))
s = r["memory"]["samples"]
minutes = float(sys.argv[1])
warm = 60.0 if minutes >= 5 else minutes * 60 * 0.2
after_warm = [x for x in s if x["t"] >= warm]
base = after_warm[0]["rss_bytes"]
end_load = [x for x in after_warm if x["t"] <= r["load_seconds"]]
end = end_load[-1]["rss_bytes"]
peak = max(x["rss_bytes"] for x in after_warm)
print(f"soak: {r['sent']} requests in {r['load_seconds']:.0f} s; outcome {dict((k, v) for k, v in r['by_class'].items() if v)}")
print(f"soak: {r['generated_tokens_per_second']:.1f} generated tok/s; latency p50 {r['latency_ms']['p50']/1e3:.1f} s p99 {r['latency_ms']['p99']/1e3:.1f} s")
itl = r.get("inter_token_ms") or {}
print(f"soak: inter-token p50 {itl.get('p50', float('nan')):.0f} ms p99 {itl.get('p99', float('nan')):.0f} ms; TTFT p50 {r['ttft_ms']['p50']/1e3:.2f} s")
print(f"soak: RSS after {warm:.0f} s warm-up {base/1e6:.1f} MB, at the end of the load {end/1e6:.1f} MB "
      f"({(end - base) / base * 100:+.2f}%), peak {peak/1e6:.1f} MB; plan {r['memory']['planned_bytes']/1e6:.1f} MB")
print(f"soak: after the load: KV cells {r['memory']['final_kv_cells']:.0f}, running {r['memory']['final_running']:.0f}, RSS {r['memory']['final_rss_bytes']/1e6:.1f} MB")
for f in r["failures"]:
    print("soak: FAILED:", f)
PY
exit $status
