#!/usr/bin/env bash
# benches/grpc.sh - gRPC unary calls direct to a tonic server and through pinlb (h2c listener ->
# h2c upstream): the p50 and p99 of each, and what pinlb adds (issue 16's gRPC bar).
#
# Topology (as benches/h2.sh): pinlb on core 0 with one worker; the tonic echo server and the
# tonic client (examples/grpc_latency.rs, one single-threaded runtime each) on core 1. The client
# keeps CONC unary calls in flight on one HTTP/2 connection for DURATION seconds after a 1 s
# warm-up; a call that ends in any gRPC status but OK, or with the wrong reply, is an error and
# fails the script.
#
# Rounds are interleaved (direct, proxied, direct, ...), pinlb started once. Prints each run's
# p50/p99, then the medians of each target's p50 and p99 over the rounds, and the added p50 and
# p99: the median over rounds of (proxied - direct), paired within each round.
#
# Usage: bash benches/grpc.sh
#   ROUNDS=5 DURATION=5 CONC=1 PINLB=target/release/pinlb
#   CLIENT=target/release/examples/grpc_latency
# Build first: cargo build --release --bin pinlb --example grpc_latency
# Needs: taskset.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${PINLB:-$ROOT/target/release/pinlb}
CLIENT=${CLIENT:-$ROOT/target/release/examples/grpc_latency}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CONC=${CONC:-1}
BACKEND_PORT=${BACKEND_PORT:-18480}
PORT=${PORT:-18481}
WORK=$(mktemp -d)
PIDS=()
grpc_cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
log() { echo "grpc.sh: $*" >&2; }
die() { log "$*"; exit 1; }
trap grpc_cleanup EXIT
command -v taskset >/dev/null || die "needs taskset (util-linux)"
[[ -x $PINLB && -x $CLIENT ]] ||
    die "build first: cargo build --release --bin pinlb --example grpc_latency"

taskset -c 1 "$CLIENT" serve "127.0.0.1:$BACKEND_PORT" >"$WORK/backend.log" 2>&1 &
PIDS+=($!)
cat >"$WORK/pinlb.toml" <<TOML
[runtime]
cpus = [0]

[[listener]]
address = "127.0.0.1:$PORT"
upstream = "grpc"
h2c = true

[upstream.grpc]
protocol = "h2c"
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]
TOML
"$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PIDS+=($!)

# Ready when one short call succeeds each way (bounded: 50 tries, 0.1 s apart).
for target in "http://127.0.0.1:$BACKEND_PORT" "http://127.0.0.1:$PORT"; do
    for ((i = 0; i < 50; i++)); do
        if "$CLIENT" call "$target" 1 0.05 0 >/dev/null 2>&1; then continue 2; fi
        sleep 0.1
    done
    cat "$WORK/backend.log" "$WORK/pinlb.log" >&2
    die "no gRPC answer from $target"
done

printf '%-8s %5s %8s %10s %10s\n' target round "calls/s" "p50 µs" "p99 µs" | tee "$WORK/results"
for ((round = 1; round <= ROUNDS; round++)); do
    for name in direct proxied; do
        if [[ $name == direct ]]; then url="http://127.0.0.1:$BACKEND_PORT"; else url="http://127.0.0.1:$PORT"; fi
        out=$(taskset -c 1 "$CLIENT" call "$url" "$CONC" "$DURATION" 1) || die "$name: $out"
        # calls N errors E rate R p50_us X p90_us Y p99_us Z max_us W
        read -r _ _ _ errors _ rate _ p50 _ _ _ p99 _ _ <<<"$out"
        [[ $errors == 0 ]] || die "$name: $errors calls failed: $out"
        printf '%-8s %5d %8.0f %10.1f %10.1f\n' "$name" "$round" "$rate" "$p50" "$p99" |
            tee -a "$WORK/results"
    done
done

echo
echo "medians over $ROUNDS rounds of ${DURATION}s, $CONC call(s) in flight on one connection:"
awk '
    function med(a, k,   i, j, t) {
        for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return (k % 2) ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
    }
    NR > 1 { r[$1, $2] = $3; p50[$1, $2] = $4; p99[$1, $2] = $5; if ($2 > n) n = $2 }
    END {
        for (i = 1; i <= n; i++) {
            d50[i] = p50["direct", i]; d99[i] = p99["direct", i]; dr[i] = r["direct", i]
            x50[i] = p50["proxied", i]; x99[i] = p99["proxied", i]; xr[i] = r["proxied", i]
            a50[i] = x50[i] - d50[i]; a99[i] = x99[i] - d99[i]
        }
        printf "direct   calls/s %.0f  p50 %.1f µs  p99 %.1f µs\n", med(dr, n), med(d50, n), med(d99, n)
        printf "proxied  calls/s %.0f  p50 %.1f µs  p99 %.1f µs\n", med(xr, n), med(x50, n), med(x99, n)
        printf "added by pinlb: p50 %+.1f µs  p99 %+.1f µs (median of per-round differences)\n", med(a50, n), med(a99, n)
    }' "$WORK/results"
