#!/usr/bin/env bash
# benches/websocket.sh - compare pinlb with nginx as WebSocket proxies, in one run, with
# interleaved rounds, using `pinlb bench --ws` against `pinlb backend`'s echo; then the
# memory each holds per idle tunnel.
#
# Topology (identical for every proxy; meant for a 2-core machine, as benches/compare.sh):
#   core 0: the proxy under test, ONE worker (`taskset -c 0`; nginx worker_processes 1,
#           pinlb [runtime] cpus = [0]).
#   core 1: the echo backend (`pinlb backend --cpus 1`: every WebSocket message comes back as
#           it went) AND the load generator (`taskset -c 1 pinlb bench --ws --cpus 1`:
#           $CONNS connections, each upgraded once when it opens, then a $SIZE-byte binary
#           message and a wait for its echo, over and over).
#   nginx: `proxy_http_version 1.1`, `Upgrade $http_upgrade`, `Connection "upgrade"`, read and
#   send timeouts of an hour; pinlb: its default tunnelling. No logs.
#   Configs: benches/peers/websocket/*, rendered into a mktemp -d dir.
#
# Procedure:
#  1. Throughput: the backend and every proxy in $PEERS are started ONCE, each on its own
#     loopback port, and polled until they answer. Then, for each of $ROUNDS rounds, each proxy
#     in $PEERS order gets one `pinlb bench --ws` run ($WARMUP unrecorded, then $DURATION
#     recorded, on the same connections), so rounds interleave: pinlb, nginx, pinlb, ...
#  2. Idle tunnels (IDLE > 0): the proxies are stopped; for each of $IDLE_ROUNDS rounds and each
#     proxy, it is started afresh, warmed with 64 tunnels that open, echo once and close, and
#     after $SETTLE s its RSS is read; then `examples/idle_clients --ws` opens $IDLE tunnels
#     (each upgraded, one 64-byte echo, then nothing) from a loopback address of the round's
#     own, and after $SETTLE s the RSS is read again and the established client connections
#     counted (`ss`). As benches/idle.sh does for idle keep-alive connections.
#
# Measured per round and proxy:
#   msg/s        `pinlb bench` messages/s of the recorded window (its JSON: requests_per_sec)
#   p99          its p99 latency, from a message's write to the end of its echo, in µs
#   errors       its errors of every kind (connect, handshake, timeout, read), both phases
#   CPU us/msg   (utime+stime) delta of ALL the proxy's processes (nginx: master+worker) from
#                /proc/PID/stat fields 14+15, over the whole bench run, divided by the echoes
#                of both phases (the upgrades are in the CPU too: $CONNS of them, against
#                hundreds of thousands of messages)
#   core busy    % busy of cores 0 and 1, and core 0's busy % NOT spent in the proxy; rounds
#                where that exceeds 10% (another program running) are flagged
#   per tunnel   (VmRSS with the idle tunnels - VmRSS before) / tunnels established, in bytes
# Summary: per proxy the median over rounds; pinlb against nginx: throughput (ratio of
# medians, and paired per round), p99, CPU per message, memory per idle tunnel. Printed as
# Markdown and written to $OUT_MD.
#
# Usage (from the repository root or anywhere; after `cargo build --release` and
# `cargo build --example idle_clients`):
#   bash benches/websocket.sh
#   PEERS=nginx ROUNDS=3 DURATION=5s IDLE=2000 bash benches/websocket.sh
# Environment:
#   ROUNDS=5            recorded rounds per proxy
#   DURATION=10s        recorded window of each bench run
#   WARMUP=1s           unrecorded load before it, on the same connections
#   CONNS=256           WebSocket connections of the load generator
#   SIZE=64             bytes per message
#   PEERS="pinlb nginx" proxies to run, in this order
#   IDLE=5000           idle tunnels per proxy for the memory measurement; 0 = skip it
#   IDLE_ROUNDS=3       rounds of that measurement
#   SETTLE=2            seconds to wait before each RSS reading
#   PINLB=target/release/pinlb    pinlb binary: the backend and the load generator, and the
#                       proxy when PEERS has pinlb (relative to the repo root)
#   CLIENTS=target/debug/examples/idle_clients   the idle client, run with --ws for tunnels
#   OUT_MD=/tmp/pinlb-websocket.md  where the Markdown report is written
#   PORT_BASE=19080     ports: the first free loopback ports >= PORT_BASE, below the
#                       ephemeral range (a tunnel's outgoing connections never take one)
#   KEEP_TMP=0          1 = keep the temp dir (configs, logs, bench JSON)
# Needs: nginx, jq, curl, taskset, ss, awk, getconf.
#
# Don't run it while something else is busy on the machine (e.g. cargo build): both cores are
# part of the measurement.

set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR="$ROOT/benches/peers/websocket"
CMDLINE="bash $0${*:+ $*}"

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
CONNS=${CONNS:-256}
SIZE=${SIZE:-64}
PEERS=${PEERS:-pinlb nginx}
IDLE=${IDLE:-5000}
IDLE_ROUNDS=${IDLE_ROUNDS:-3}
SETTLE=${SETTLE:-2}
PINLB=${PINLB:-target/release/pinlb}
CLIENTS=${CLIENTS:-target/debug/examples/idle_clients}
OUT_MD=${OUT_MD:-/tmp/pinlb-websocket.md}
PORT_BASE=${PORT_BASE:-19080}
KEEP_TMP=${KEEP_TMP:-0}

case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
case $CLIENTS in /*) ;; *) CLIENTS="$ROOT/$CLIENTS" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[websocket] %s\n' "$*" >&2; }
die() { printf '[websocket] ERROR: %s\n' "$*" >&2; exit 1; }

for v in ROUNDS CONNS SIZE; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ $IDLE =~ ^[0-9]+$ ]] || die "IDLE must be a number (got '$IDLE')"
[[ $IDLE_ROUNDS =~ ^[1-9][0-9]*$ ]] || die "IDLE_ROUNDS must be a positive integer (got '$IDLE_ROUNDS')"
((IDLE_ROUNDS <= 200)) || die "IDLE_ROUNDS must be at most 200 (one loopback address per round)"
[[ $SETTLE =~ ^[0-9]+$ ]] || die "SETTLE must be whole seconds (got '$SETTLE')"
read -r -a PEER_LIST <<<"$PEERS"
((${#PEER_LIST[@]} > 0)) || die "PEERS is empty"
for p in "${PEER_LIST[@]}"; do
    case $p in pinlb | nginx) ;; *) die "unknown peer '$p' (known: pinlb nginx)" ;; esac
done

# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nginx-light jq" nginx jq
require nginx jq curl taskset ss awk getconf sort
[[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (cargo build --release, or set PINLB=...); it is the backend and the load generator even without pinlb in PEERS"
"$PINLB" bench --help 2>/dev/null | grep -q -- '--ws' || die "$PINLB has no 'bench --ws'; build this branch"
if ((IDLE > 0)); then
    [[ -x $CLIENTS ]] || die "client not found at $CLIENTS (cargo build --example idle_clients, or set CLIENTS=..., or IDLE=0)"
fi

NCPU=$(nproc)
CLK_TCK=$(getconf CLK_TCK)
((NCPU >= 2)) || die "need at least 2 cores (0 and 1); nproc=$NCPU"

# Room for the idle tunnels: the client holds IDLE sockets, the backend IDLE, the proxy twice
# that (client and backend side of each tunnel). Children inherit the limit.
MAXCONN=$(((IDLE > CONNS ? IDLE : CONNS) + 64))
NOFILE=$((MAXCONN * 2 + 4096))
ulimit -n "$NOFILE" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
NOFILE=$(ulimit -n)
((NOFILE >= MAXCONN * 2 + 256)) || die "open-file limit $NOFILE is below the $((MAXCONN * 2 + 256)) IDLE=$IDLE needs (raise the hard limit or lower IDLE)"

# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-websocket.XXXXXX")
chmod 755 "$WORK" # nginx workers may run as an unprivileged user when root
PIDS=()
BENCH_PID=""
CLIENT_PID=""
PROXY_PID=""
running_pids() { echo "$BENCH_PID" "$CLIENT_PID" "$PROXY_PID" "${PIDS[@]}"; }
install_cleanup

# render TEMPLATE DEST PORT DIR (start_peer calls it)
render() {
    sed -e "s|@DIR@|$4|g" -e "s|@PORT@|$3|g" -e "s|@BACKEND_PORT@|$BACKEND_PORT|g" \
        -e "s|@MAXCONN@|$MAXCONN|g" -e "s|@WORKER_CONNS@|$((MAXCONN * 2 + 1024))|g" \
        -e "s|@NOFILE@|$NOFILE|g" "$1" >"$2"
}

# rss_kib PID: VmRSS of the pid and its children, in KiB.
rss_kib() {
    local p total=0 v
    while read -r p; do
        v=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null) || v=0
        total=$((total + ${v:-0}))
    done < <(proc_tree "$1")
    echo "$total"
}

# ---------------------------------------------------------------- start
read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)

# shellcheck disable=SC2034 # LOGF is start_peer's
declare -A PORT PID_OF VERSION LOGF
pick_port
BACKEND_PORT=$PICKED
for p in "${PEER_LIST[@]}"; do
    pick_port
    PORT[$p]=$PICKED
done

log "work dir $WORK; backend port $BACKEND_PORT; open-file limit $NOFILE"
mkdir -p "$WORK/backend"
RUST_LOG=warn taskset -c 1 "$PINLB" backend --listen "127.0.0.1:$BACKEND_PORT" --cpus 1 \
    >"$WORK/backend/stdout.log" 2>&1 &
BACKEND_PID=$!
PIDS+=("$BACKEND_PID")
wait_ready backend "$BACKEND_PORT" "$BACKEND_PID" "$WORK/backend/stdout.log"

for p in "${PEER_LIST[@]}"; do
    start_peer "$p" "$PEERS_DIR/pinlb.toml"
done

host_facts
ENV_LINE="ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP CONNS=$CONNS SIZE=$SIZE PEERS=\"$PEERS\" IDLE=$IDLE IDLE_ROUNDS=$IDLE_ROUNDS SETTLE=$SETTLE"
echo "== pinlb WebSocket comparison =="
echo "command:   $ENV_LINE $CMDLINE"
echo "nproc:     $NCPU ($CPU_MODEL), CLK_TCK=$CLK_TCK; before start: core0 ${IDLE_BUSY0}% busy, core1 ${IDLE_BUSY1}% busy"
echo "topology:  proxy under test -> core 0 (1 worker); pinlb backend (echo) + pinlb bench --ws -c$CONNS -> core 1"
echo "           backend 127.0.0.1:$BACKEND_PORT pid $BACKEND_PID affinity $(affinity "$BACKEND_PID")"
describe_procs "${PEER_LIST[@]}"

# ---------------------------------------------------------------- throughput rounds
RAW="$WORK/raw.tsv" # round peer msg_s p99_us errors cpu_us_per_msg messages core0% core1% other0% p50_us
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
    for p in "${PEER_LIST[@]}"; do
        pid=${PID_OF[$p]}
        kill -0 "$pid" 2>/dev/null || { cat "${LOGF[$p]}" >&2 || true; die "$p (pid $pid) died"; }
        json="$WORK/bench-$r-$p.json"
        mapfile -t tree < <(proc_tree "$pid")
        c0=$(cpu_ticks "${tree[@]}")
        j0=$(core_jiffies)
        t0=$(date +%s%N)
        taskset -c 1 "$PINLB" bench --ws --message-size "$SIZE" -c "$CONNS" -d "$DURATION" \
            --warmup "$WARMUP" --rounds 1 --cpus 1 --json "$json" \
            "$p=http://127.0.0.1:${PORT[$p]}/ws" >"$WORK/bench-$r-$p.txt" 2>&1 &
        BENCH_PID=$!
        rc=0
        wait "$BENCH_PID" || rc=$?
        BENCH_PID=""
        ((rc == 0)) || { cat "$WORK/bench-$r-$p.txt" >&2; die "pinlb bench failed (rc=$rc)"; }
        t1=$(date +%s%N)
        c1=$(cpu_ticks "${tree[@]}")
        read -r busy0 busy1 < <(core_busy "$j0" "$(core_jiffies)")
        kill -0 "$pid" 2>/dev/null || { cat "${LOGF[$p]}" >&2 || true; die "$p (pid $pid) died during round $r"; }

        read -r rate p50 p99 msgs errors < <(jq -r '.targets[0] |
            [.requests_per_sec.median, .latency.p50_us, .latency.p99_us,
             .requests.responses + .warmup.responses,
             ([.requests.errors[], .warmup.errors[]] | add)] | @tsv' "$json")
        cpu=$(awk -v d=$((c1 - c0)) -v hz="$CLK_TCK" -v n="$msgs" 'BEGIN { printf "%.2f\n", (n > 0) ? d * 1e6 / hz / n : 0 }')
        other0=$(awk -v d=$((c1 - c0)) -v hz="$CLK_TCK" -v t=$(((t1 - t0) / 1000)) -v b="$busy0" \
            'BEGIN { o = (t > 0) ? b - 100 * d * 1e6 / hz / t : 0; printf "%.0f\n", (o < 0) ? 0 : o }')
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$rate" "$p99" "$errors" "$cpu" "$msgs" "$busy0" "$busy1" "$other0" "$p50" >>"$RAW"
        printf 'round %d/%d  %-6s %8.0f msg/s  p50 %6.0f us  p99 %6.0f us  cpu %6s us/msg  core0 %3s%% (other %2s%%)  core1 %3s%%  errors %s\n' \
            "$r" "$ROUNDS" "$p" "$rate" "$p50" "$p99" "$cpu" "$busy0" "$other0" "$busy1" "$errors"
        if ((errors > 0)); then log "WARNING: $p had errors in round $r (see $WORK/bench-$r-$p.txt with KEEP_TMP=1)"; fi
        if ((other0 > 10)); then
            log "WARNING: core 0 was ${other0}% busy outside $p in round $r - something else is running?"
        fi
    done
done

# ---------------------------------------------------------------- idle tunnels
# The long-lived proxies go first: each idle round starts its own, alone on core 0.
for p in "${PEER_LIST[@]}"; do
    stop_all "${PID_OF[$p]}"
    wait "${PID_OF[$p]}" 2>/dev/null || true
done
PIDS=("$BACKEND_PID")

# hold_tunnels N FROM OUTFILE: starts the client on core 1 and waits (bounded, 120 s) until it
# prints "ready OPEN FAILED"; sets CLIENT_PID and FAILED.
hold_tunnels() {
    local i line
    taskset -c 1 "$CLIENTS" --ws "127.0.0.1:${PORT[$p]}" "$1" "$2" >"$3" 2>"$3.err" &
    CLIENT_PID=$!
    for ((i = 0; i < 1200; i++)); do
        if line=$(grep -m1 '^ready ' "$3" 2>/dev/null); then
            read -r _ _ FAILED <<<"$line"
            return 0
        fi
        kill -0 "$CLIENT_PID" 2>/dev/null || {
            cat "$3.err" >&2
            die "idle_clients --ws exited before it was ready"
        }
        sleep 0.1
    done
    die "idle_clients --ws not ready after 120 s"
}

release_tunnels() {
    stop_all "$CLIENT_PID"
    wait "$CLIENT_PID" 2>/dev/null || true
    CLIENT_PID=""
}

IDLE_RAW="$WORK/idle.tsv" # round proxy base_kib loaded_kib established failed bytes_per_tunnel
: >"$IDLE_RAW"
if ((IDLE > 0)); then
    for ((r = 1; r <= IDLE_ROUNDS; r++)); do
        from="127.0.0.$((r + 10))"
        for p in "${PEER_LIST[@]}"; do
            pick_port
            PORT[$p]=$PICKED
            PIDS_BEFORE=${#PIDS[@]}
            start_peer "$p" "$PEERS_DIR/pinlb.toml"
            PROXY_PID=${PID_OF[$p]}
            # start_peer added the proxy to PIDS; this loop stops it itself.
            PIDS=("${PIDS[@]:0:PIDS_BEFORE}")
            hold_tunnels 64 "$from" "$WORK/warm.$r.$p"
            release_tunnels
            sleep "$SETTLE"
            base=$(rss_kib "$PROXY_PID")
            hold_tunnels "$IDLE" "$from" "$WORK/idle.$r.$p"
            sleep "$SETTLE"
            loaded=$(rss_kib "$PROXY_PID")
            est=$(ss -tnH state established "( sport = :${PORT[$p]} )" | wc -l)
            release_tunnels
            stop_all "$PROXY_PID"
            wait "$PROXY_PID" 2>/dev/null || true
            PROXY_PID=""
            per=$(awk -v a="$loaded" -v b="$base" -v n="$est" 'BEGIN { if (n > 0) printf "%.0f", (a - b) * 1024 / n; else print "nan" }')
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$p" "$base" "$loaded" "$est" "$FAILED" "$per" >>"$IDLE_RAW"
            log "idle round $r $p: baseline ${base} KiB, with $est idle tunnels ${loaded} KiB: $per bytes each ($FAILED failed to open)"
        done
    done
fi

# ---------------------------------------------------------------- summary
# median [DECIMALS]: the median of the numbers on stdin ("nan" for none).
median() { sort -g | awk -v d="${1:-2}" '{ v[NR] = $1 } END { if (NR) printf "%.*f", d, (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; else print "nan" }'; }
declare -A MED_RATE MIN_RATE MAX_RATE MED_P50 MED_P99 MED_CPU ERRS MED_IDLE
for p in "${PEER_LIST[@]}"; do
    read -r "MED_RATE[$p]" "MIN_RATE[$p]" "MAX_RATE[$p]" < <(stats "$p" 3)
    read -r "MED_P99[$p]" _ _ < <(stats "$p" 4)
    read -r "MED_CPU[$p]" _ _ < <(stats "$p" 6)
    read -r "MED_P50[$p]" _ _ < <(stats "$p" 11)
    ERRS[$p]=$(awk -F'\t' -v p="$p" '$2 == p {s += $5} END {print s + 0}' "$RAW")
    MED_IDLE[$p]=$(awk -F'\t' -v p="$p" '$2 == p { print $7 }' "$IDLE_RAW" | median 0)
    ((IDLE > 0)) || MED_IDLE[$p]="-"
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a == a + 0) printf "%.2f", a / b; else print "n/a" }'; }
MD="$WORK/report.md"
{
    echo "### WebSocket tunnels: pinlb vs nginx ($(date -u +%Y-%m-%d), commit $COMMIT)"
    echo
    echo "- Command: \`$ENV_LINE $CMDLINE\`"
    echo "- Host: nproc=$NCPU, $CPU_MODEL, $(uname -sr); before start core0 ${IDLE_BUSY0}% / core1 ${IDLE_BUSY1}% busy"
    echo "- Topology: proxy under test pinned to core 0 with one worker; \`pinlb backend\` (WebSocket echo) and \`pinlb bench --ws --message-size $SIZE -c $CONNS --cpus 1\` share core 1. Each connection upgrades once (not timed), then sends a $SIZE-byte binary message and waits for its echo, over and over."
    echo "- $ROUNDS interleaved rounds, each $WARMUP unrecorded then $DURATION recorded on the same connections; proxies started once. Medians over rounds; CPU = utime+stime of all the proxy's processes per echoed message."
    if ((IDLE > 0)); then
        echo "- Idle tunnels: each proxy started afresh per round, warmed with 64 tunnels, then $IDLE tunnels opened (one echo each, then nothing) and held ${SETTLE} s; bytes per tunnel = (VmRSS with them − VmRSS before) ÷ client connections established; medians over $IDLE_ROUNDS interleaved rounds."
    fi
    echo
    echo "| proxy | version | msg/s (median) | msg/s min | msg/s max | p50 µs | p99 µs (median) | CPU µs/msg (median) | errors (all rounds) | bytes per idle tunnel (median) |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for p in "${PEER_LIST[@]}"; do
        printf '| %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %s | %s |\n' "$p" "${VERSION[$p]}" \
            "${MED_RATE[$p]}" "${MIN_RATE[$p]}" "${MAX_RATE[$p]}" "${MED_P50[$p]}" "${MED_P99[$p]}" \
            "${MED_CPU[$p]}" "${ERRS[$p]}" "${MED_IDLE[$p]}"
    done
    if [[ " ${PEER_LIST[*]} " == *" pinlb "* && " ${PEER_LIST[*]} " == *" nginx "* ]]; then
        paired=$(awk -F'\t' '$2 == "pinlb" { a[$1] = $3 } $2 == "nginx" { b[$1] = $3 }
            END { for (r in a) if (b[r] > 0) printf "%f\n", a[r] / b[r] }' "$RAW" | median)
        echo
        echo "pinlb against nginx (bar: messages/s ≥ 1.0×, p99 no higher):"
        echo
        echo "- messages/s: **$(ratio "${MED_RATE[pinlb]}" "${MED_RATE[nginx]}")** (ratio of medians), **$paired** (paired per round, median)"
        echo "- p99: **$(ratio "${MED_P99[pinlb]}" "${MED_P99[nginx]}")** (≤ 1 meets the bar)"
        echo "- CPU per message: **$(ratio "${MED_CPU[pinlb]}" "${MED_CPU[nginx]}")**"
        if ((IDLE > 0)); then
            echo "- memory per idle tunnel: **$(ratio "${MED_IDLE[pinlb]}" "${MED_IDLE[nginx]}")**"
        fi
    fi
    noisy=$(awk -F'\t' '$10 > 10 { n++ } END { print n + 0 }' "$RAW")
    if ((noisy > 0)); then
        echo
        echo "**Warning:** in $noisy round(s) core 0 was more than 10% busy outside the proxy under test (another program was running); those numbers are noisy."
    fi
    if ((IDLE > 0)); then
        short=$(awk -F'\t' -v n="$IDLE" '$5 + $6 < n { c++ } END { print c + 0 }' "$IDLE_RAW")
        if ((short > 0)); then
            echo
            echo "**Warning:** in $short idle round(s) fewer tunnels were established than were opened: the proxy closed some, and those rounds measure fewer."
        fi
    fi
    echo
    echo "<details><summary>per-round results</summary>"
    echo
    echo "| round | proxy | msg/s | p50 µs | p99 µs | CPU µs/msg | errors | messages (both phases) | core0 busy | core0 busy outside proxy | core1 busy |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk -F'\t' '{ printf "| %s | %s | %.0f | %.0f | %.0f | %s | %s | %s | %s%% | %s%% | %s%% |\n", $1, $2, $3, $11, $4, $6, $5, $7, $8, $10, $9 }' "$RAW"
    if ((IDLE > 0)); then
        echo
        echo "| idle round | proxy | RSS before (KiB) | RSS with the tunnels (KiB) | established | failed to open | bytes per tunnel |"
        echo "|---:|---|---:|---:|---:|---:|---:|"
        awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }' "$IDLE_RAW"
    fi
    echo
    echo "</details>"
} >"$MD"

publish_report "$MD"
