#!/usr/bin/env bash
# benches/loadgen.sh - is `pinlb bench` as accurate and as fast as wrk? Both
# load one nginx `return 200` backend in interleaved rounds, on the same core,
# with the same threads and connections, and their numbers are compared.
#
# Topology (meant for a 2-core machine):
#   core 0: the backend: nginx, worker_processes 1, answering
#           `200 "hello world\n"`, access_log off, keep-alive never cut
#           (benches/peers/backend-nginx.conf, rendered into a mktemp -d dir);
#           or, with BACKEND_WORK set, `pinlb backend --work $BACKEND_WORK`, a
#           backend whose own time per request, not the load generator's loop,
#           makes up the latency (see "Which target" below).
#   core 1: the load generator under test, one at a time:
#           `taskset -c 1 wrk -t1 -c$CONNS -d$DURATION --latency URL`
#           `pinlb bench -t 1 -c $CONNS -d $DURATION --rounds 1 --warmup 0s
#                --cpus 1 --json FILE URL`
#
# Procedure: the backend is started once and polled (curl, bounded loop) until
# it answers. Then, for each of $ROUNDS rounds: wrk, then pinlb bench - so
# runs interleave (wrk, pinlb, wrk, pinlb, ...) and drift of the machine hits
# both alike. Neither gets a warm-up: each opens its connections inside its
# measured run, as wrk always does.
#
# Measured per round and tool:
#   req/s        wrk "Requests/sec"; pinlb bench's requests_per_sec (JSON)
#   p50, p99     wrk --latency 50% and 99% lines, normalised to microseconds;
#                pinlb bench's latency.p50_us and p99_us (JSON)
#   CPU us/req   the tool's own utime+stime (bash `times` around the run, which
#                counts the waited-for child and all its threads), divided by
#                the requests it completed: how lean it is, even when the
#                backend, not the tool, limits the rate
#   core busy    % busy of core 0 and core 1 during the run (/proc/stat), and
#                how much of each was NOT the backend (core 0) or the tool
#                (core 1): rounds where that exceeds 10% (another program
#                running) are flagged
# Summary: per tool the median over rounds; then pinlb bench / wrk for req/s
# (target >= 0.9), p50 and p99 (target 0.9-1.1), both as a ratio of medians
# and paired per round (median of the per-round ratios). Printed as Markdown
# and written to $OUT_MD.
#
# Which target: against a hello-world nginx that the generator saturates from
# one core, both the server and the generator run near 100%, and the latency a
# closed loop reports depends on how many of its connections wait on its own
# side between a response and the next request (time no tool counts). wrk has
# been seen at p50 271 us and 553 us against the same nginx minutes apart
# (benches/HISTORY.md), so there wrk does not agree with itself within 10%.
# BACKEND_WORK=50us gives a target whose latency is the server's: 64
# connections queue behind 50 us of work each, and the generator's own pass is
# a small part of every request's time. Run both; report both.
#
# WIRE=1 adds a reference neither tool controls: tcpdump (pinned to core 0,
# beside the backend, so it disturbs both tools' runs alike) records every
# packet with a payload on the backend's port, and each request's wire latency
# is the time from its first request packet to the first response packet on
# the same connection. A tool's latency minus the wire latency is the time the
# tool itself adds: sending, waking up, reading, parsing.
#
# Usage (from anywhere; root or not):
#   bash benches/loadgen.sh
#   ROUNDS=3 DURATION=5s bash benches/loadgen.sh
# Environment:
#   ROUNDS=5            rounds (one wrk run and one pinlb bench run each)
#   DURATION=10s        duration of every run
#   CONNS=64            connections (-c); both tools use one thread on core 1
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   WIRE=0              1 = also measure wire latency with tcpdump (see above)
#   BACKEND_WORK=       empty: the nginx backend; a duration ("50us"): `pinlb
#                       backend --work` on core 0 instead (same binary)
#   OUT_MD=/tmp/pinlb-loadgen.md  where the Markdown report is written
#   PORT_BASE=18180     the backend gets the first free loopback port >= this
#                       (checked with `ss -ltn`)
#   KEEP_TMP=0          1 = keep the temp dir (config, logs, raw outputs)
# Needs: nginx, wrk (installed with apt-get if missing and root), curl,
# taskset, ss, awk, getconf.
#
# Don't run it while something else is busy on the machine (e.g. cargo build):
# both cores are part of the measurement. Both cores are sampled for 1 s
# before anything starts and a warning is printed if either is >10% busy.

set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR="$ROOT/benches/peers"
CMDLINE="bash $0${*:+ $*}"

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
PINLB=${PINLB:-target/release/pinlb}
BACKEND_WORK=${BACKEND_WORK:-}
WIRE=${WIRE:-0}
OUT_MD=${OUT_MD:-/tmp/pinlb-loadgen.md}
PORT_BASE=${PORT_BASE:-18180}
KEEP_TMP=${KEEP_TMP:-0}

case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[loadgen] %s\n' "$*" >&2; }
die() {
    printf '[loadgen] ERROR: %s\n' "$*" >&2
    exit 1
}

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer (got '$ROUNDS')"
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "CONNS must be a positive integer (got '$CONNS')"
[[ $PORT_BASE =~ ^[0-9]+$ ]] || die "PORT_BASE must be a number (got '$PORT_BASE')"
[[ $DURATION =~ ^[0-9]+[smh]$ ]] || die "DURATION must look like 10s or 2m (got '$DURATION'): both tools must parse it"

# ---------------------------------------------------------------- tools
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nginx-light wrk" nginx wrk
if ((WIRE)); then
    install_missing tcpdump tcpdump
    PATH="$PATH:/usr/bin:/usr/sbin"
    require tcpdump
fi
require nginx wrk curl taskset ss awk getconf sort
[[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (build it: cargo build --release, or set PINLB=...)"
"$PINLB" bench --help >/dev/null 2>&1 || die "'$PINLB bench --help' failed: is this a pinlb with the bench command?"

NCPU=$(nproc)
((NCPU >= 2)) || die "need at least 2 cores (0 and 1); nproc=$NCPU"
CLK_TCK=$(getconf CLK_TCK)

# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-loadgen.XXXXXX")
chmod 755 "$WORK" # nginx workers may run as an unprivileged user when root
BACKEND_PID=""
GEN_PID=""
CAPTURE_PID=""

running_pids() { echo "$GEN_PID" "$CAPTURE_PID" "$BACKEND_PID"; }

# ---------------------------------------------------------------- helpers
install_cleanup

# run_tool TOOL OUTFILE: runs wrk or pinlb bench on core 1 against the backend,
# waits for it; sets RUN_CPU_S to the CPU seconds it used.
run_tool() {
    case $1 in
    wrk) run_timed "$2" taskset -c 1 wrk -t1 -c"$CONNS" -d"$DURATION" --latency "$URL" ;;
    pinlb)
        run_timed "$2.txt" "$PINLB" bench -t 1 -c "$CONNS" -d "$DURATION" --rounds 1 --warmup 0s \
            --cpus 1 --json "$2" "$URL"
        ;;
    esac
}

# start_capture FILE: tcpdump on core 0 of every payload packet to or from the backend's port,
# one line each with its epoch timestamp; returns once tcpdump is listening.
start_capture() {
    taskset -c 0 tcpdump -i lo -tt -n -B 65536 \
        "tcp port $PORT and (ip[2:2] - ((ip[0] & 0xf) << 2) - ((tcp[12] & 0xf0) >> 2)) != 0" \
        >"$1" 2>"$1.err" &
    CAPTURE_PID=$!
    local i
    for ((i = 0; i < 50; i++)); do
        grep -q "listening on" "$1.err" 2>/dev/null && return 0
        kill -0 "$CAPTURE_PID" 2>/dev/null || die "tcpdump failed: $(cat "$1.err")"
        sleep 0.1
    done
    die "tcpdump did not start listening within 5 s"
}

# stop_capture FILE: stops tcpdump and prints the wire latency p50 and p99 in microseconds: per
# connection, from the first packet of a request to the first packet of its response.
stop_capture() {
    kill -INT "$CAPTURE_PID" 2>/dev/null || true
    wait "$CAPTURE_PID" 2>/dev/null || true
    CAPTURE_PID=""
    awk -v port="$PORT" '$2 == "IP" {
            n = split($3, s, "."); sp = s[n]; n = split($5, d, "."); dp = d[n]; sub(/:$/, "", dp)
            if (dp == port) { if (!(sp in sent)) sent[sp] = $1 }
            else if (sp == port && (dp in sent)) { printf "%.1f\n", ($1 - sent[dp]) * 1e6; delete sent[dp] }
        }' "$1" | sort -g | awk '{ v[NR] = $1 } END {
            if (NR == 0) { print "0 0"; exit }
            i50 = int(NR * 0.50); if (i50 < NR * 0.50) i50++; i99 = int(NR * 0.99); if (i99 < NR * 0.99) i99++
            print v[i50], v[i99] }'
}

# ---------------------------------------------------------------- start
read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)

PORT=""
for ((p = PORT_BASE; p < PORT_BASE + 200; p++)); do
    if ! port_in_use "$p"; then
        PORT=$p
        break
    fi
done
[[ -n $PORT ]] || die "no free port found from $PORT_BASE"
URL="http://127.0.0.1:$PORT/"

mkdir -p "$WORK/backend"
if [[ -z $BACKEND_WORK ]]; then
    BACKEND_DESC='nginx (1 worker, `return 200 "hello world\n"`)'
    nginx_temp_paths "$WORK/backend"
    sed -e "s|@DIR@|$WORK/backend|g" -e "s|@BACKEND_PORT@|$PORT|g" \
        "$PEERS_DIR/backend-nginx.conf" >"$WORK/backend/nginx.conf"
    taskset -c 0 nginx -p "$WORK/backend" -c "$WORK/backend/nginx.conf" -e "$WORK/backend/error.log" \
        >"$WORK/backend/stdout.log" 2>&1 &
else
    BACKEND_DESC="\`pinlb backend --work $BACKEND_WORK\` (busy $BACKEND_WORK per request, \"hello world\\n\")"
    taskset -c 0 "$PINLB" backend --listen "127.0.0.1:$PORT" --cpus 0 --work "$BACKEND_WORK" \
        >"$WORK/backend/error.log" 2>&1 &
fi
BACKEND_PID=$!
ready=0
for ((i = 0; i < 50; i++)); do
    kill -0 "$BACKEND_PID" 2>/dev/null || {
        cat "$WORK/backend/error.log" >&2 2>/dev/null || true
        die "the backend exited during startup"
    }
    if body=$(curl -s --max-time 1 "$URL" 2>/dev/null) && [[ $body == "hello world" ]]; then
        ready=1
        break
    fi
    sleep 0.1
done
((ready)) || die "the backend is not answering 'hello world' on $URL after 5 s"

host_facts
WRK_VERSION=$(wrk -v 2>&1 | awk 'NR == 1 {print $2}' || true)
PINLB_VERSION=$("$PINLB" --version 2>&1 | awk 'NR == 1 {print $NF}')
WIRE_ENV=""
if ((WIRE)); then WIRE_ENV=" WIRE=1"; fi
ENV_LINE="ROUNDS=$ROUNDS DURATION=$DURATION CONNS=$CONNS${BACKEND_WORK:+ BACKEND_WORK=$BACKEND_WORK}$WIRE_ENV PINLB=$PINLB"

echo "== pinlb bench vs wrk =="
echo "command:   $ENV_LINE $CMDLINE"
echo "nproc:     $NCPU ($CPU_MODEL); before start: core0 ${IDLE_BUSY0}% busy, core1 ${IDLE_BUSY1}% busy"
echo "topology:  backend $BACKEND_DESC $URL -> core 0; wrk $WRK_VERSION / pinlb bench $PINLB_VERSION, 1 thread, $CONNS connections -> core 1"
if ((IDLE_BUSY0 > 10 || IDLE_BUSY1 > 10)); then
    log "WARNING: cores busy before start (core0 ${IDLE_BUSY0}%, core1 ${IDLE_BUSY1}%) - something else is running; numbers will be noisy"
fi

# ---------------------------------------------------------------- rounds
RAW="$WORK/raw.tsv" # round tool rps p50_us p99_us errors requests cpu_us_per_req core0% core1% other0% other1% wire_p50 wire_p99
: >"$RAW"
mapfile -t BACKEND_TREE < <(echo "$BACKEND_PID"; children "$BACKEND_PID")
for ((r = 1; r <= ROUNDS; r++)); do
    for tool in wrk pinlb; do
        kill -0 "$BACKEND_PID" 2>/dev/null || die "the backend died"
        out="$WORK/$tool-$r.out"
        b0=$(cpu_ticks "${BACKEND_TREE[@]}")
        j0=$(core_jiffies)
        ((WIRE)) && start_capture "$WORK/$tool-$r.pcap.txt"
        run_tool "$tool" "$out"
        wire="- -"
        ((WIRE)) && wire=$(stop_capture "$WORK/$tool-$r.pcap.txt")
        read -r busy0 busy1 < <(core_busy "$j0" "$(core_jiffies)")
        b1=$(cpu_ticks "${BACKEND_TREE[@]}")

        if [[ $tool == wrk ]]; then
            rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
            reqs=$(awk '/ requests in / {print $1}' "$out")
            p50raw=$(awk '$1 == "50%" {print $2}' "$out")
            p99raw=$(awk '$1 == "99%" {print $2}' "$out")
            [[ -n $rps && -n $reqs && -n $p50raw && -n $p99raw ]] || {
                cat "$out" >&2
                die "could not parse wrk's output ($out)"
            }
            p50=$(to_us "$p50raw")
            p99=$(to_us "$p99raw")
            sockerr=$(awk '/Socket errors:/ { s = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) s += $i; print s }' "$out")
            non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
            errors=$((${sockerr:-0} + ${non2xx:-0}))
            run_s=$(to_us "$(awk '/ requests in / { sub(/,$/, "", $4); print $4 }' "$out")")
            run_s=$(awk -v u="$run_s" 'BEGIN { printf "%.3f\n", u / 1e6 }')
        else
            rps=$(json_first median "$out")
            reqs=$(json_first responses "$out")
            p50=$(json_first p50_us "$out")
            p99=$(json_first p99_us "$out")
            run_s=$(json_first elapsed_s "$out")
            [[ -n $rps && -n $reqs && -n $p50 && -n $p99 && -n $run_s ]] || {
                cat "$out" "$out.txt" >&2
                die "could not parse pinlb bench's JSON ($out)"
            }
            errors=0
            for k in connect timeout read non_2xx; do
                errors=$((errors + $(json_first "$k" "$out")))
            done
        fi
        # Busy time not spent in the backend (core 0) or in the tool (core 1).
        read -r cpu other0 other1 < <(awk -v c="$RUN_CPU_S" -v n="$reqs" -v d=$((b1 - b0)) -v hz="$CLK_TCK" \
            -v t="$run_s" -v c0="$busy0" -v c1="$busy1" 'BEGIN {
                o0 = (t > 0) ? c0 - 100 * d / hz / t : 0
                o1 = (t > 0) ? c1 - 100 * c / t : 0
                printf "%.2f %.0f %.0f\n", (n > 0) ? c * 1e6 / n : 0, (o0 < 0) ? 0 : o0, (o1 < 0) ? 0 : o1
            }')
        read -r wire50 wire99 <<<"$wire"
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$tool" "$rps" "$p50" "$p99" \
            "$errors" "$reqs" "$cpu" "$busy0" "$busy1" "$other0" "$other1" "$wire50" "$wire99" >>"$RAW"
        printf 'round %d/%d  %-5s %8.0f req/s  p50 %6.0f us  p99 %6.0f us  cpu %5s us/req  core0 %3s%% (other %2s%%)  core1 %3s%% (other %2s%%)  errors %s\n' \
            "$r" "$ROUNDS" "$tool" "$rps" "$p50" "$p99" "$cpu" "$busy0" "$other0" "$busy1" "$other1" "$errors"
        ((WIRE)) && printf '              wire p50 %6.0f us  wire p99 %6.0f us\n' "$wire50" "$wire99"
        if ((errors > 0)); then log "WARNING: $tool had $errors errors in round $r"; fi
        if ((other0 > 10 || other1 > 10)); then
            log "WARNING: round $r ($tool): cores busy outside the benchmark (core0 ${other0}%, core1 ${other1}%) - something else is running?"
        fi
    done
done

# ---------------------------------------------------------------- summary
# paired COLUMN -> median over rounds of pinlb's value / wrk's value
paired() {
    awk -F'\t' -v c="$1" '$2 == "wrk" { w[$1] = $c } $2 == "pinlb" { p[$1] = $c }
        END { for (r in p) if (w[r] > 0) print p[r] / w[r] }' "$RAW" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; else print "n/a" }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
verdict() { # VALUE LOW HIGH -> "ok" or "MISSED"
    awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { print (v != "n/a" && v + 0 >= lo && v + 0 <= hi) ? "ok" : "MISSED" }'
}

declare -A MED_RPS MIN_RPS MAX_RPS MED_P50 MED_P99 MED_CPU ERRS MED_W50 MED_W99
for t in wrk pinlb; do
    read -r "MED_RPS[$t]" "MIN_RPS[$t]" "MAX_RPS[$t]" < <(stats "$t" 3)
    read -r "MED_P50[$t]" _ _ < <(stats "$t" 4)
    read -r "MED_P99[$t]" _ _ < <(stats "$t" 5)
    read -r "MED_CPU[$t]" _ _ < <(stats "$t" 8)
    if ((WIRE)); then
        read -r "MED_W50[$t]" _ _ < <(stats "$t" 13)
        read -r "MED_W99[$t]" _ _ < <(stats "$t" 14)
    fi
    ERRS[$t]=$(awk -F'\t' -v p="$t" '$2 == p {s += $6} END {print s + 0}' "$RAW")
done
R_RPS=$(ratio "${MED_RPS[pinlb]}" "${MED_RPS[wrk]}")
R_P50=$(ratio "${MED_P50[pinlb]}" "${MED_P50[wrk]}")
R_P99=$(ratio "${MED_P99[pinlb]}" "${MED_P99[wrk]}")
R_CPU=$(ratio "${MED_CPU[pinlb]}" "${MED_CPU[wrk]}")
P_RPS=$(paired 3)
P_P50=$(paired 4)
P_P99=$(paired 5)
P_CPU=$(paired 8)

tool_name() { if [[ $1 == pinlb ]]; then echo "pinlb bench"; else echo "$1"; fi; }

MD="$WORK/report.md"
{
    echo "### pinlb bench vs wrk ($(date -u +%Y-%m-%d), commit $COMMIT)"
    echo
    echo "- Command: \`$ENV_LINE $CMDLINE\`"
    echo "- Host: nproc=$NCPU, $CPU_MODEL, $(uname -sr); before start core0 ${IDLE_BUSY0}% / core1 ${IDLE_BUSY1}% busy"
    echo "- Topology: backend $BACKEND_DESC pinned to core 0; the load generator on core 1 with 1 thread and $CONNS keep-alive connections: \`wrk -t1 -c$CONNS -d$DURATION --latency\` (wrk $WRK_VERSION) and \`pinlb bench -t 1 -c $CONNS -d $DURATION --rounds 1 --warmup 0s --cpus 1\` (pinlb $PINLB_VERSION)."
    echo "- $ROUNDS interleaved rounds (wrk, pinlb bench, repeat), no warm-up for either; medians over rounds. CPU = the tool's own utime+stime per completed request."
    echo
    echo "| tool | req/s (median) | req/s min | req/s max | p50 µs (median) | p99 µs (median) | CPU µs/req (median) | errors (all rounds) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|"
    for t in wrk pinlb; do
        printf '| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %s |\n' "$(tool_name "$t")" "${MED_RPS[$t]}" "${MIN_RPS[$t]}" \
            "${MAX_RPS[$t]}" "${MED_P50[$t]}" "${MED_P99[$t]}" "${MED_CPU[$t]}" "${ERRS[$t]}"
    done
    echo
    echo "pinlb bench ÷ wrk:"
    echo
    echo "| | ratio of medians | paired per round (median) | target | |"
    echo "|---|---:|---:|---|---|"
    echo "| req/s | $R_RPS | $P_RPS | ≥ 0.9 | $(verdict "$P_RPS" 0.9 1000) |"
    echo "| p50 | $R_P50 | $P_P50 | 0.9–1.1 | $(verdict "$P_P50" 0.9 1.1) |"
    echo "| p99 | $R_P99 | $P_P99 | 0.9–1.1 | $(verdict "$P_P99" 0.9 1.1) |"
    echo "| CPU per request | $R_CPU | $P_CPU | (< 1 is leaner) | |"
    if ((WIRE)); then
        echo
        echo "Against the wire (tcpdump on the backend's port; medians over rounds, µs): what each tool adds to the latency it reports."
        echo
        echo "| tool | p50 | wire p50 | added at p50 | p99 | wire p99 | added at p99 |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
        for t in wrk pinlb; do
            awk -v n="$(tool_name "$t")" -v a="${MED_P50[$t]}" -v w="${MED_W50[$t]}" -v b="${MED_P99[$t]}" -v x="${MED_W99[$t]}" \
                'BEGIN { printf "| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", n, a, w, a - w, b, x, b - x }'
        done
    fi
    noisy=$(awk -F'\t' '$11 > 10 || $12 > 10 { n++ } END { print n + 0 }' "$RAW")
    if ((noisy > 0)); then
        echo
        echo "**Warning:** in $noisy run(s) a core was more than 10% busy outside the backend (core 0) or the tool (core 1): another program was running, so those numbers are noisy."
    fi
    echo
    echo "<details><summary>per-round results</summary>"
    echo
    echo "| round | tool | req/s | p50 µs | p99 µs | wire p50 µs | wire p99 µs | CPU µs/req | errors | requests | core0 busy (other) | core1 busy (other) |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk -F'\t' '{ printf "| %s | %s | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s | %s%% (%s%%) | %s%% (%s%%) |\n", $1, ($2 == "pinlb") ? "pinlb bench" : $2, $3, $4, $5, $13, $14, $8, $6, $7, $9, $11, $10, $12 }' "$RAW"
    echo
    echo "</details>"
} >"$MD"

publish_report "$MD"
