#!/usr/bin/env bash
# benches/dns.sh - backends from DNS under load: an SRV record set that changes every $EVERY for
# $DURATION while `pinlb bench` loads pinlb; the bar is 0 failed requests.
#
# Topology (2 cores): pinlb on core 0 (one worker, [runtime] cpus = [0]); three `pinlb backend`
# servers, the DNS server (examples/dns_server.rs, hickory-server on 127.0.0.1) and the load
# generator (`pinlb bench -c $CONNS --cpus 1`) on core 1. pinlb's only backend entry is
# `{ srv = "_http._tcp.app.test" }`, looked up at most every 500 ms (the records' TTL is 1 s),
# with slow_start 1s. Every change of the set removes one backend and brings back the one
# removed before, so every change both drains a backend and adds one.
#
# Prints the bench table, the DNS changes made, the generations pinlb went through, pinlb's
# CPU per request, and exits 1 when any request failed.
#
#   DURATION=60s EVERY=2s CONNS=32 bash benches/dns.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-60s}
EVERY=${EVERY:-2s}
CONNS=${CONNS:-32}
PINLB=${PINLB:-target/release/pinlb}
DNS_SERVER=${DNS_SERVER:-target/release/examples/dns_server}
PORT_BASE=${PORT_BASE:-19300}
KEEP_TMP=${KEEP_TMP:-0}

log() { echo "dns.sh: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=benches/lib.sh
source benches/lib.sh

[[ -x $PINLB ]] || die "$PINLB missing: cargo build --release (or PINLB=target/debug/pinlb)"
[[ -x $DNS_SERVER ]] || die "$DNS_SERVER missing: cargo build --release --example dns_server"

WORK=$(mktemp -d)
PIDS=()
running_pids() { echo "${PIDS[@]}"; }
install_cleanup

ports=()
for _ in 1 2 3; do pick_port; ports+=("$PICKED"); done
pick_port; PROXY=$PICKED
pick_port; ADMIN=$PICKED

taskset -c 1 "$PINLB" backend --cpus 1 --listen "127.0.0.1:${ports[0]}" \
    --listen "127.0.0.1:${ports[1]}" --listen "127.0.0.1:${ports[2]}" >"$WORK/backend.log" 2>&1 &
PIDS+=($!)

# The DNS server runs the whole bench plus a second either side.
secs=${DURATION%s}
taskset -c 1 "$DNS_SERVER" _http._tcp.app.test. "$EVERY" "$((secs + 2))s" "${ports[@]}" \
    >"$WORK/dns.out" 2>"$WORK/dns.log" &
PIDS+=($!)
for ((i = 0; i < 100; i++)); do
    grep -q '^listening on ' "$WORK/dns.out" 2>/dev/null && break
    sleep 0.05
done
DNS=$(sed -n 's/^listening on //p' "$WORK/dns.out")
[[ -n $DNS ]] || die "the DNS server did not start: $(cat "$WORK/dns.log")"

cat >"$WORK/pinlb.toml" <<TOML
[runtime]
cpus = [0]
shutdown_timeout = "5s"

[resolver]
nameservers = ["$DNS"]

[[listener]]
address = "127.0.0.1:$PROXY"
upstream = "app"

[upstream.app]
slow_start = "1s"
backends = [{ srv = "_http._tcp.app.test" }]

[upstream.app.resolve]
interval = "500ms"
min_interval = "100ms"

[admin]
address = "127.0.0.1:$ADMIN"
TOML
"$PINLB" check --strict -c "$WORK/pinlb.toml" >"$WORK/check.out" || die "check failed: $(cat "$WORK/check.out")"
grep '^dns:' "$WORK/check.out" >&2
taskset -c 0 "$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PINLB_PID=$!
PIDS+=("$PINLB_PID")
wait_ready pinlb "$PROXY" "$PINLB_PID" "$WORK/pinlb.log"

t0=$(cpu_ticks "$PINLB_PID")
"$PINLB" bench "dns=http://127.0.0.1:$PROXY/" -c "$CONNS" -d "$DURATION" --warmup 0s \
    --rounds 1 --cpus 1 --json "$WORK/bench.json" | tee "$WORK/bench.out"
t1=$(cpu_ticks "$PINLB_PID")

for ((i = 0; i < 100; i++)); do
    grep -q '^changes ' "$WORK/dns.out" && break
    sleep 0.1
done
changes=$(sed -n 's/^changes //p' "$WORK/dns.out")
generation=$(curl -s "http://127.0.0.1:$ADMIN/metrics" | awk '/^pinlb_config_generation /{print $2}')
read -r responses failed < <(python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))["targets"][0]["requests"]
e = t["errors"]
print(t["responses"], e["connect"] + e["timeout"] + e["read"] + e["non_2xx"] + e["handshake"])
' "$WORK/bench.json")
hz=$(getconf CLK_TCK)
cpu_us=$(python3 -c "print(f'{($t1 - $t0) / $hz * 1e6 / max($responses, 1):.2f}')")
log "record changes: ${changes:-?} (every $EVERY); pinlb generations: ${generation:-?}"
log "responses: $responses; failed: $failed; pinlb CPU per request: $cpu_us µs"
grep -c 'now resolves to' "$WORK/pinlb.log" | xargs -I{} echo "dns.sh: pinlb applied {} changed answers" >&2
((failed == 0)) || die "$failed request(s) failed"
