#!/usr/bin/env bash
# benches/upgrade.sh - failed requests across binary upgrades under load: pinlb's
# `pinlb upgrade` (the new process takes over the listening sockets over a unix socket)
# against HAProxy's seamless reload (master-worker mode, `expose-fd listeners`), in the
# same run, interleaved rounds.
#
# Topology (meant for a 2-core machine):
#   core 0: the proxy under test, ONE worker (`taskset -c 0`; pinlb [runtime] cpus = [0],
#           HAProxy nbthread 1). pinlb's new process inherits core 0 from the old one.
#   core 1: one `pinlb backend` (hello world) AND the load generator
#           (`pinlb bench --cpus 1`).
#   Configs: benches/peers/upgrade/{pinlb.toml,haproxy.cfg}, rendered into a mktemp -d dir.
#
# Procedure: the backend is started once; each proxy is started once (pinlb `serve`,
# HAProxy `-W -S master.sock`) and polled (curl, bounded) until it answers. For each of
# $ROUNDS rounds, for each mode in $MODES (close: a new connection per request, which is what
# exposes a refused or lost connect; keepalive: $CONNS kept-alive connections, which exposes
# the close of idle connections by the old process), for each proxy in $PEERS order:
#   1. `pinlb bench -c $CONNS -d ${DURATION}s --warmup 0s --rounds 1 --timeout 2s` runs;
#   2. meanwhile $UPGRADES upgrades, evenly spaced (the first at DURATION/(UPGRADES+1) s):
#      pinlb: `pinlb upgrade -c pinlb.toml` (synchronous: it returns once the new process
#             serves; exits non-zero if it did not, which aborts the run);
#      HAProxy: SIGUSR2 to the master (its reload), then a poll until a new worker pid.
# Measured per round, mode and proxy: failed requests = pinlb bench's connect + handshake +
# timeout + read errors + non-2xx responses (its JSON), the requests that succeeded, req/s,
# and the busy time of core 0 (from /proc/stat: the proxy's core, so CPU per request is the
# proxy's, old and new processes together, plus whatever else ran there).
# Summary: per mode and proxy, failed requests summed over rounds, the median req/s, and
# CPU per request; the bar is 0 failed requests for pinlb.
#
# Usage (from anywhere, after cargo build --release):
#   bash benches/upgrade.sh
#   ROUNDS=1 UPGRADES=3 DURATION=10 bash benches/upgrade.sh
# Environment:
#   ROUNDS=3            rounds
#   DURATION=20         seconds of load per run
#   UPGRADES=5          upgrades (reloads) per run
#   CONNS=16            connections at once (-c)
#   MODES="close keepalive"
#   PEERS="pinlb haproxy"
#   PINLB=target/release/pinlb
#   OUT_MD=/tmp/pinlb-upgrade.md   where the Markdown report is written
#   PORT_BASE=28400     first port tried; KEEP_TMP=1 keeps the temp dir
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-20}
UPGRADES=${UPGRADES:-5}
CONNS=${CONNS:-16}
MODES=${MODES:-close keepalive}
PEERS=${PEERS:-pinlb haproxy}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-/tmp/pinlb-upgrade.md}
PORT_BASE=${PORT_BASE:-28400}
KEEP_TMP=${KEEP_TMP:-0}
CMDLINE="ROUNDS=$ROUNDS DURATION=$DURATION UPGRADES=$UPGRADES CONNS=$CONNS MODES=\"$MODES\" PEERS=\"$PEERS\" bash benches/upgrade.sh"

log() { printf '[upgrade] %s\n' "$*" >&2; }
die() { printf '[upgrade] ERROR: %s\n' "$*" >&2; exit 1; }

for v in ROUNDS DURATION UPGRADES CONNS; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
for m in $MODES; do
    case $m in close | keepalive) ;; *) die "unknown mode '$m' (known: close keepalive)" ;; esac
done
for p in $PEERS; do
    case $p in pinlb | haproxy) ;; *) die "unknown peer '$p' (known: pinlb haproxy)" ;; esac
done
cd "$ROOT"
[[ $PINLB == /* ]] || PINLB="$ROOT/$PINLB"
[[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (cargo build --release, or set PINLB=...)"

# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "haproxy curl" haproxy curl
require haproxy curl taskset awk sort

WORK=$(mktemp -d /tmp/pinlb-upgrade.XXXXXX)
PIDS=()
GEN_PID=""
declare -A PID_OF PORT LOGF VERSION
# The pinlb serving now: after an upgrade, not this script's child.
running_pids() { echo "$GEN_PID" "${PIDS[@]}" "${PID_OF[pinlb]:-}"; }
install_cleanup

render() { # TEMPLATE DEST PORT DIR
    sed -e "s|@DIR@|$4|g" -e "s|@PORT@|$3|g" -e "s|@BACKEND_PORT@|$BPORT|g" "$1" >"$2"
}

pick_port
BPORT=$PICKED
taskset -c 1 "$PINLB" backend --listen "127.0.0.1:$BPORT" --cpus 1 >"$WORK/backend.log" 2>&1 &
PIDS+=($!)
wait_ready backend "$BPORT" "$!" "$WORK/backend.log"

PEERS_DIR="$ROOT/benches/peers/upgrade"
for p in $PEERS; do
    pick_port
    PORT[$p]=$PICKED
    d="$WORK/$p"
    mkdir -p "$d"
    case $p in
    pinlb)
        render "$PEERS_DIR/pinlb.toml" "$d/pinlb.toml" "${PORT[$p]}" "$d"
        LOGF[$p]="$d/stderr.log"
        RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$d/pinlb.toml" >"${LOGF[$p]}" 2>&1 &
        PID_OF[$p]=$!
        VERSION[$p]=$("$PINLB" --version | awk '{print $NF}')
        ;;
    haproxy)
        render "$PEERS_DIR/haproxy.cfg" "$d/haproxy.cfg" "${PORT[$p]}" "$d"
        LOGF[$p]="$d/stderr.log"
        taskset -c 0 haproxy -W -S "$d/master.sock" -db -f "$d/haproxy.cfg" >"${LOGF[$p]}" 2>&1 &
        PID_OF[$p]=$!
        PIDS+=("${PID_OF[$p]}")
        VERSION[$p]=$(haproxy -v 2>&1 | awk 'NR == 1 {print $3}')
        ;;
    esac
    wait_ready "$p" "${PORT[$p]}" "${PID_OF[$p]}" "${LOGF[$p]}"
done

# haproxy_worker: the master's worker serving now (its newest child: the highest pid, as
# start times tie within a second).
haproxy_worker() { ps -o pid= --ppid "${PID_OF[haproxy]}" 2>/dev/null | sort -n | awk 'END {print $1}'; }

# upgrade P: one upgrade of proxy P; returns once the new process serves.
upgrade() {
    case $1 in
    pinlb)
        local out
        out=$("$PINLB" upgrade -c "$WORK/pinlb/pinlb.toml" --timeout 10s 2>&1) || die "pinlb upgrade failed: $out"
        PID_OF[pinlb]=$(awk '/^upgraded: pid/ {print $3}' <<<"$out")
        ;;
    haproxy)
        local before i now
        before=$(haproxy_worker)
        kill -USR2 "${PID_OF[haproxy]}"
        for ((i = 0; i < 100; i++)); do
            now=$(haproxy_worker)
            [[ -n $now && $now != "$before" ]] && return 0
            sleep 0.05
        done
        die "HAProxy started no new worker within 5 s of its reload"
        ;;
    esac
}

RAW="$WORK/raw.tsv"
: >"$RAW"
gap=$(awk -v d="$DURATION" -v n="$UPGRADES" 'BEGIN { printf "%.3f", d / (n + 1) }')
log "$ROUNDS rounds x modes [$MODES] x peers [$PEERS], ${DURATION}s each, $UPGRADES upgrades ${gap}s apart, -c$CONNS"
for ((r = 1; r <= ROUNDS; r++)); do
    for mode in $MODES; do
        for p in $PEERS; do
            flags=()
            [[ $mode == close ]] && flags=(--disable-keepalive)
            json="$WORK/$p-$mode-$r.json"
            j0=$(core_jiffies)
            taskset -c 1 "$PINLB" bench "${flags[@]}" -c "$CONNS" -d "${DURATION}s" --warmup 0s \
                --rounds 1 --timeout 2s --cpus 1 --json "$json" "http://127.0.0.1:${PORT[$p]}/" \
                >"$WORK/$p-$mode-$r.log" 2>&1 &
            GEN_PID=$!
            for ((u = 1; u <= UPGRADES; u++)); do
                sleep "$gap"
                upgrade "$p"
            done
            wait "$GEN_PID" || { cat "$WORK/$p-$mode-$r.log" >&2; die "pinlb bench failed"; }
            GEN_PID=""
            j1=$(core_jiffies)
            failed=0
            for k in connect handshake timeout read non_2xx; do
                failed=$((failed + $(json_first "$k" "$json")))
            done
            ok=$(json_first ok "$json")
            rps=$(json_first median "$json")
            busy=$(awk -v a="$j0" -v b="$j1" 'BEGIN { split(a, x, " "); split(b, y, " "); print y[1] - x[1] }')
            cpu_us=$(awk -v j="$busy" -v n="$ok" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", n ? j / hz * 1e6 / n : 0 }')
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$p" "$r" "$failed" "$ok" "$rps" "$cpu_us" >>"$RAW"
            log "round $r $mode $p: $failed failed, $ok ok, $(printf '%.0f' "$rps") req/s, core 0 ${cpu_us} us/request"
        done
    done
done

host_facts
MD="$WORK/report.md"
{
    echo "## Binary upgrade under load: pinlb upgrade vs HAProxy seamless reload"
    echo
    echo "\`$CMDLINE\` - commit $COMMIT, $(nproc) cores ($CPU_MODEL), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    echo "$ROUNDS rounds; per run ${DURATION}s of \`pinlb bench -c$CONNS\` and $UPGRADES upgrades. Failed = connect + timeout + read errors + non-2xx, summed over rounds."
    echo
    echo "| mode | proxy | upgrades | failed requests | requests ok | req/s (median) | core-0 CPU per request, µs (median) |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    for mode in $MODES; do
        for p in $PEERS; do
            awk -F'\t' -v m="$mode" -v p="$p" -v v="${VERSION[$p]}" -v u="$UPGRADES" '
                $1 == m && $2 == p { n++; f += $4; ok += $5; rps[n] = $6; cpu[n] = $7 }
                function median(a, n,   i, j, t) {
                    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
                }
                END { printf "| %s | %s %s | %d | %d | %d | %.0f | %.2f |\n", m, p, v, n * u, f, ok, median(rps, n), median(cpu, n) }' "$RAW"
        done
    done
    raw_section "Per run (mode, proxy, round, failed, ok, req/s, µs/request):"
} >"$MD"
publish_report "$MD"
