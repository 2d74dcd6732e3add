#!/usr/bin/env bash
# benches/routes.sh - what routes cost per request: instructions per request (benches/callgrind.sh)
# with no routes, 1 route, 10 routes and 1,000 host+path routes, the request matching the last
# route that can match its host. Issue 18's bar: 1,000 routes at most 1.05x a single route.
#
# The tables:
#   1      host 127.0.0.1, path /               -> app
#   10     host 127.0.0.1, paths /p0/ .. /p8/ (no match) then /      -> app
#   1000   99 other hosts (h0.test .. h98.test) x 10 paths, and the 10 routes above: 100 hosts
#          x 10 paths. The request (wrk: GET / with Host 127.0.0.1:PORT) is looked up by host,
#          then tried against that host's 10 routes, matching the 10th.
# Each table runs twice, interleaved (0, 1, 10, 1000, 0, 1, 10, 1000).
#
# Usage: bash benches/routes.sh [PINLB_BINARY]   (default target/release/pinlb)
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}

# Routes for one host: /p0/ .. /p8/, then / (the one wrk's requests match).
host_routes() {
    local host=$1 j
    for j in 0 1 2 3 4 5 6 7 8; do
        printf '[[listener.route]]\nhost = "%s"\npath = "/p%s/"\nupstream = "app"\n' "$host" "$j"
    done
    printf '[[listener.route]]\nhost = "%s"\npath = "/"\nupstream = "app"\n' "$host"
}

table() {
    case $1 in
    0) ;;
    1) printf '[[listener.route]]\nhost = "127.0.0.1"\npath = "/"\nupstream = "app"\n' ;;
    10) host_routes 127.0.0.1 ;;
    1000)
        for i in $(seq 0 98); do host_routes "h$i.test"; done
        host_routes 127.0.0.1
        ;;
    esac
}

declare -A results
for round in 1 2; do
    for n in 0 1 10 1000; do
        extra=$(table "$n")
        count=$(grep -c '^\[\[listener.route\]\]' <<<"$extra" || true)
        ir=$(EXTRA_TOML="$extra" bash "$ROOT/benches/callgrind.sh" "$PINLB" | awk '/Ir\/req/{print $2}')
        echo "round $round: $count routes: $ir instructions/request" >&2
        results[$n]="${results[$n]:-} $ir"
    done
done
echo
echo "| routes | instructions/request (2 runs) | ÷ 1 route |"
echo "|---:|---|---:|"
one=$(tr ' ' '\n' <<<"${results[1]}" | grep . | sort -n | head -1)
for n in 0 1 10 1000; do
    best=$(tr ' ' '\n' <<<"${results[$n]}" | grep . | sort -n | head -1)
    ratio=$(awk -v a="$best" -v b="$one" 'BEGIN{printf "%.3f", a/b}')
    echo "| $n |${results[$n]} | $ratio |"
done
