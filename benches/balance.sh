#!/usr/bin/env bash
# benches/balance.sh - one slow backend among four: the p99 of round_robin, least_conn,
# random_two and ewma side by side, in one run (issue 18's bar: ewma's p99 at most 0.5x
# round_robin's).
#
# Topology (meant for a 2-core machine):
#   core 0: pinlb, ONE worker, four listeners, one upstream per algorithm, each over the same
#           four backends (each upstream has its own in-flight counts and averages).
#   core 1: `pinlb backend`: three fast backends in one process and one slow backend in another
#           (`--delay $DELAY`, waiting without CPU, like a slow database call), AND the load
#           generator (`pinlb bench`, one thread).
# `pinlb bench` runs the four targets in interleaved rounds (rr, lc, r2, ewma, rr, ...), each
# with $CONNS keep-alive connections for $DURATION after a warm-up; the table it prints has
# every percentile. Summary: median over rounds of each target's p99, and ewma ÷ round_robin.
#
# Usage: bash benches/balance.sh
# Environment:
#   PINLB=target/release/pinlb   ROUNDS=5   DURATION=5s   CONNS=32   DELAY=5ms
#   OUT_JSON=/tmp/pinlb-balance.json
set -euo pipefail
cd "$(dirname "$0")/.."

PINLB=${PINLB:-target/release/pinlb}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5s}
CONNS=${CONNS:-32}
DELAY=${DELAY:-5ms}
OUT_JSON=${OUT_JSON:-/tmp/pinlb-balance.json}
PORT_BASE=${PORT_BASE:-23100}

log() { echo "balance.sh: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=benches/lib.sh
source benches/lib.sh

[[ -x $PINLB ]] || die "no pinlb binary at $PINLB (cargo build --release)"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fast=()
for _ in 1 2 3; do pick_port; fast+=("$PICKED"); done
pick_port; slow=$PICKED
listen=()
for p in "${fast[@]}"; do listen+=(--listen "127.0.0.1:$p"); done
"$PINLB" backend --cpus 1 "${listen[@]}" >"$tmp/fast.log" 2>&1 &
pids+=($!)
"$PINLB" backend --cpus 1 --delay "$DELAY" --listen "127.0.0.1:$slow" >"$tmp/slow.log" 2>&1 &
pids+=($!)

algorithms=(round_robin least_conn random_two ewma)
{
  echo '[runtime]'
  echo 'cpus = [0]'
  for a in "${algorithms[@]}"; do
    pick_port
    echo "$a $PICKED" >>"$tmp/ports"
    printf '[[listener]]\naddress = "127.0.0.1:%s"\nupstream = "%s"\n' "$PICKED" "$a"
  done
  for a in "${algorithms[@]}"; do
    printf '[upstream.%s]\nalgorithm = "%s"\nbackends = [\n' "$a" "$a"
    for p in "${fast[@]}" "$slow"; do printf '  { address = "127.0.0.1:%s", cpus = [1] },\n' "$p"; done
    printf ']\n'
  done
} >"$tmp/pinlb.toml"
"$PINLB" check -c "$tmp/pinlb.toml" >/dev/null || die "the generated config does not check: $tmp/pinlb.toml"
taskset -c 0 "$PINLB" serve -c "$tmp/pinlb.toml" >"$tmp/pinlb.log" 2>&1 &
pids+=($!)

targets=()
while read -r a p; do
  for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$p/" >/dev/null && break; sleep 0.1; done
  curl -fs "http://127.0.0.1:$p/" >/dev/null || die "pinlb does not answer on $p ($a)"
  targets+=("$a=http://127.0.0.1:$p/")
done <"$tmp/ports"

cmd=("$PINLB" bench --cpus 1 -t 1 -c "$CONNS" -d "$DURATION" --rounds "$ROUNDS" --json "$OUT_JSON" "${targets[@]}")
log "${cmd[*]}"
"${cmd[@]}"

python3 - "$OUT_JSON" "$DELAY" <<'PY'
import json, statistics, sys
report = json.load(open(sys.argv[1]))
p99 = {t["name"]: statistics.median(r["latency"]["p99_us"] for r in t["rounds"]) for t in report["targets"]}
rps = {t["name"]: t["requests_per_sec"]["median"] for t in report["targets"]}
print(f"\none slow backend ({sys.argv[2]}) of four, median of {len(report['targets'][0]['rounds'])} rounds:\n")
print("| algorithm | p99 µs | ÷ round_robin | req/s |")
print("|---|---:|---:|---:|")
for name, v in p99.items():
    print(f"| {name} | {v:,.0f} | {v / p99['round_robin']:.2f} | {rps[name]:,.0f} |")
ratio = p99["ewma"] / p99["round_robin"]
print(f"\newma p99 / round_robin p99 = {ratio:.2f} (bar: at most 0.50): {'met' if ratio <= 0.5 else 'NOT met'}")
PY
