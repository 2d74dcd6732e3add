#!/usr/bin/env bash
# benches/idle.sh - memory per idle keep-alive client connection: pinlb, nginx and
# HAProxy each hold $CONNS idle client connections (every one has done one request,
# so it is a real keep-alive connection at rest), in one run, interleaved rounds.
#
# Topology (identical for every proxy; meant for a 2-core machine):
#   core 0: the proxy under test, ONE worker (`taskset -c 0`; nginx
#           worker_processes 1, haproxy nbthread 1, pinlb [runtime] cpus = [0]).
#   core 1: the shared backend (nginx, worker_processes 1, `return 200`) and the
#           client, `examples/idle_clients` (one thread), which opens the
#           connections 256 at a time, sends `GET /` on each, reads the response,
#           and then holds them all without sending anything.
#   Every proxy: keep-alive to the backend (64 pooled), client keep-alive and idle
#   timeouts of 300 s, room for $CONNS + 64 client connections (pinlb's
#   limits.max_connections, HAProxy maxconn; nginx's worker_connections, which also
#   count its listening and upstream sockets, get 1024 more: short of them it closes idle
#   keep-alive connections to reuse them).
#   Configs: benches/peers/idle/*, rendered into a mktemp -d dir.
#
# Procedure, for each of $ROUNDS rounds and each proxy in $PEERS order (pinlb,
# nginx, haproxy, pinlb, ...): start the proxy afresh (so that no round reuses
# memory an earlier one left behind), warm it up with 64 connections that do one
# request and close, wait $SETTLE, read the baseline; open $CONNS idle
# connections from a loopback address of the round's own (127.0.0.R), wait
# $SETTLE, read again, count the connections still established (`ss`), then
# close them and stop the proxy.
#
# Measured per round and proxy:
#   RSS          VmRSS summed over the proxy's processes (nginx: master +
#                worker) from /proc/PID/status
#   per conn     (RSS with the idle connections - baseline RSS) / connections
#                established at that moment, in bytes
# Summary: per proxy the median over rounds of bytes per connection, and pinlb
# ÷ the leaner peer (target: ≤ 1). Printed as Markdown and written to $OUT_MD.
#
# Usage (from anywhere; the hard fd limit must allow 2 × $CONNS + 192 for HAProxy):
#   bash benches/idle.sh
#   CONNS=2000 ROUNDS=1 bash benches/idle.sh
# Environment:
#   ROUNDS=3            rounds per proxy
#   CONNS=10000         idle client connections per proxy
#   SETTLE=2            seconds to wait before each RSS reading
#   PEERS="pinlb nginx haproxy"   proxies to run, in this order
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   CLIENTS=target/debug/examples/idle_clients   the client (built by cargo test,
#                       or: cargo build --example idle_clients)
#   OUT_MD=/tmp/pinlb-idle.md     where the Markdown report is written
#   PORT_BASE=28280     ports: the first free loopback ports >= PORT_BASE, a new one for
#                       each proxy start (another program may take a port between rounds)
#   KEEP_TMP=0          1 = keep the temp dir (configs, logs)
# Needs: nginx, haproxy, curl, taskset, ss, awk.

set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR="$ROOT/benches/peers/idle"
CMDLINE="bash $0${*:+ $*}"

ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-10000}
SETTLE=${SETTLE:-2}
PEERS=${PEERS:-pinlb nginx haproxy}
PINLB=${PINLB:-target/release/pinlb}
CLIENTS=${CLIENTS:-target/debug/examples/idle_clients}
OUT_MD=${OUT_MD:-/tmp/pinlb-idle.md}
PORT_BASE=${PORT_BASE:-28280}
KEEP_TMP=${KEEP_TMP:-0}

case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
case $CLIENTS in /*) ;; *) CLIENTS="$ROOT/$CLIENTS" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[idle] %s\n' "$*" >&2; }
die() { printf '[idle] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer (got '$ROUNDS')"
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "CONNS must be a positive integer (got '$CONNS')"
[[ $SETTLE =~ ^[0-9]+$ ]] || die "SETTLE must be whole seconds (got '$SETTLE')"
((ROUNDS <= 200)) || die "ROUNDS must be at most 200 (one loopback address per round)"
read -r -a PEER_LIST <<<"$PEERS"
((${#PEER_LIST[@]} > 0)) || die "PEERS is empty"
for p in "${PEER_LIST[@]}"; do
    case $p in pinlb | nginx | haproxy) ;; *) die "unknown peer '$p' (known: pinlb nginx haproxy)" ;; esac
done
for t in nginx haproxy curl taskset ss awk sort; do
    command -v "$t" >/dev/null 2>&1 || die "required tool '$t' not found"
done
[[ -x $CLIENTS ]] || die "client not found at $CLIENTS (cargo build --example idle_clients, or set CLIENTS=...)"
if [[ " ${PEER_LIST[*]} " == *" pinlb "* ]]; then
    [[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (cargo build --release, or set PINLB=...)"
fi

# The client holds $CONNS sockets and so does the proxy, plus its backend connections.
# Children inherit the limit. HAProxy reserves two fds per connection it may take (maxsock =
# 2 x maxconn + a few) and refuses to start without them.
MAXCONN=$((CONNS + 64))
NOFILE=$((MAXCONN * 2 + 4096))
ulimit -n "$NOFILE" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
NOFILE=$(ulimit -n)
((NOFILE >= CONNS + 4096)) || die "open-file limit $NOFILE is below the $((CONNS + 4096)) CONNS=$CONNS needs (raise the hard limit)"
if [[ " ${PEER_LIST[*]} " == *" haproxy "* ]] && ((MAXCONN * 2 + 64 > NOFILE)); then
    die "HAProxy needs 2 fds per connection: CONNS=$CONNS needs an open-file limit of $((MAXCONN * 2 + 64)), this one is $NOFILE; lower CONNS to $(((NOFILE - 64) / 2 - 64)) or raise the hard limit"
fi

# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-idle.XXXXXX")
chmod 755 "$WORK"
PIDS=()
CLIENT_PID=""
PROXY_PID=""

running_pids() { echo "$CLIENT_PID" "$PROXY_PID" "${PIDS[@]}"; }

# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_cleanup

render() { # TEMPLATE DEST PORT DIR
    sed -e "s|@DIR@|$4|g" -e "s|@PORT@|$3|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" \
        -e "s|@MAXCONN@|$MAXCONN|g" -e "s|@WORKER_CONNS@|$((MAXCONN + 1024))|g" \
        -e "s|@NOFILE@|$NOFILE|g" "$1" >"$2"
}

# rss_kib PID...: VmRSS summed over the pids and their children, in KiB.
rss_kib() {
    local pid total=0 v
    for pid in "$@"; do
        while read -r p; do
            v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null) || v=0
            total=$((total + ${v:-0}))
        done < <(proc_tree "$pid")
    done
    echo "$total"
}

# hold_clients N FROM OUTFILE: starts the client on core 1 and waits (bounded, 120 s)
# until it prints "ready OPEN FAILED"; sets CLIENT_PID and FAILED.
hold_clients() {
    local i line
    taskset -c 1 "$CLIENTS" "127.0.0.1:${PORT[$p]}" "$1" "$2" >"$3" 2>"$3.err" &
    CLIENT_PID=$!
    for ((i = 0; i < 1200; i++)); do
        if line=$(grep -m1 '^ready ' "$3" 2>/dev/null); then
            read -r _ _ FAILED <<<"$line"
            return 0
        fi
        kill -0 "$CLIENT_PID" 2>/dev/null || {
            cat "$3.err" >&2
            die "idle_clients exited before it was ready"
        }
        sleep 0.1
    done
    die "idle_clients not ready after 120 s"
}

release_clients() {
    stop_all "$CLIENT_PID"
    wait "$CLIENT_PID" 2>/dev/null || true
    CLIENT_PID=""
}

# ---------------------------------------------------------------- start
# shellcheck disable=SC2034 # LOGF is start_peer's
declare -A PORT PID_OF VERSION LOGF
pick_port
BACKEND_PORT=$PICKED

log "work dir $WORK; backend port $BACKEND_PORT; open-file limit $NOFILE"
mkdir -p "$WORK/backend"
nginx_temp_paths "$WORK/backend"
render "$ROOT/benches/peers/backend-nginx.conf" "$WORK/backend/nginx.conf" "" "$WORK/backend"
taskset -c 1 nginx -p "$WORK/backend" -c "$WORK/backend/nginx.conf" -e "$WORK/backend/error.log" \
    >"$WORK/backend/stdout.log" 2>&1 &
BACKEND_PID=$!
PIDS+=("$BACKEND_PID")
wait_ready backend "$BACKEND_PORT" "$BACKEND_PID" "$WORK/backend/error.log"

host_facts
ENV_LINE="ROUNDS=$ROUNDS CONNS=$CONNS SETTLE=$SETTLE PEERS=\"$PEERS\""
echo "== idle keep-alive connections: memory per connection =="
echo "command: $ENV_LINE $CMDLINE"

RAW="$WORK/raw.tsv" # round proxy base_kib loaded_kib established failed bytes_per_conn
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
    from="127.0.0.$((r + 10))"
    for p in "${PEER_LIST[@]}"; do
        pick_port
        PORT[$p]=$PICKED
        PIDS_BEFORE=${#PIDS[@]}
        start_peer "$p" "$PEERS_DIR/pinlb.toml"
        PROXY_PID=${PID_OF[$p]}
        # start_peer added the proxy to PIDS; this loop stops it itself.
        PIDS=("${PIDS[@]:0:PIDS_BEFORE}")
        hold_clients 64 "$from" "$WORK/warm.$r.$p"
        release_clients
        sleep "$SETTLE"
        base=$(rss_kib "$PROXY_PID")
        hold_clients "$CONNS" "$from" "$WORK/idle.$r.$p"
        sleep "$SETTLE"
        loaded=$(rss_kib "$PROXY_PID")
        est=$(ss -tnH state established "( sport = :${PORT[$p]} )" | wc -l)
        release_clients
        stop_all "$PROXY_PID"
        wait "$PROXY_PID" 2>/dev/null || true
        PROXY_PID=""
        per=$(awk -v a="$loaded" -v b="$base" -v n="$est" 'BEGIN { if (n > 0) printf "%.0f", (a - b) * 1024 / n; else print "nan" }')
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$base" "$loaded" "$est" "$FAILED" "$per" >>"$RAW"
        log "round $r $p: baseline ${base} KiB, with $est idle connections ${loaded} KiB: $per bytes each ($FAILED failed to open)"
    done
done

# ---------------------------------------------------------------- summary
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.0f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
declare -A MED
for p in "${PEER_LIST[@]}"; do
    MED[$p]=$(awk -F'\t' -v p="$p" '$2 == p { print $7 }' "$RAW" | median)
done
MD="$WORK/report.md"
{
    echo "### Idle keep-alive connections: memory per connection ($(date -u +%Y-%m-%d), commit $COMMIT)"
    echo
    echo "- Command: \`$ENV_LINE $CMDLINE\`"
    echo "- Host: nproc=$(nproc), $CPU_MODEL, $(uname -sr)"
    echo "- Topology: proxy under test pinned to core 0 with one worker; backend nginx (1 worker) and \`examples/idle_clients\` on core 1. Each proxy started afresh per round, warmed with 64 short connections, then $CONNS idle keep-alive client connections (one \`GET /\` each, then nothing) held for ${SETTLE} s. Client keep-alive timeouts 300 s."
    echo "- Bytes per connection = (VmRSS with the connections − VmRSS before) ÷ connections established at that moment; medians over $ROUNDS interleaved rounds."
    echo
    echo "| proxy | version | bytes per idle connection (median) |"
    echo "|---|---|---:|"
    for p in "${PEER_LIST[@]}"; do
        printf '| %s | %s | %s |\n' "$p" "${VERSION[$p]}" "${MED[$p]}"
    done
    lean="" lean_p=""
    for p in "${PEER_LIST[@]}"; do
        [[ $p == pinlb ]] && continue
        if [[ -z $lean ]] || ((MED[$p] < lean)); then lean=${MED[$p]} lean_p=$p; fi
    done
    if [[ -n $lean && -n ${MED[pinlb]:-} ]]; then
        echo
        echo "pinlb ÷ the leaner peer ($lean_p): **$(awk -v a="${MED[pinlb]}" -v b="$lean" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')** (target ≤ 1)"
    fi
    short=$(awk -F'\t' -v n="$CONNS" '$5 + $6 < n { c++ } END { print c + 0 }' "$RAW")
    if ((short > 0)); then
        echo
        echo "**Warning:** in $short round(s) fewer connections were still established than were opened: the proxy closed some, and those rounds measure fewer."
    fi
    echo
    echo "<details><summary>per-round results</summary>"
    echo
    echo "| round | proxy | RSS before (KiB) | RSS with the connections (KiB) | established | failed to open | bytes per connection |"
    echo "|---:|---|---:|---:|---:|---:|---:|"
    awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }' "$RAW"
    echo
    echo "</details>"
} >"$MD"

publish_report "$MD"
