#!/usr/bin/env bash
# benches/backend.sh - `pinlb backend` against an nginx `return 200` worker, one
# core each, in interleaved rounds, with wrk. The goal (issue 4): pinlb's test
# backend serves at least 0.9x nginx's rate, so it is never the bottleneck of a
# demo.
#
# Topology (meant for a 2-core machine):
#   core 0: the server under test, single-threaded: `pinlb backend --cpus 0`
#           (one pinned server thread) under `taskset -c 0`, and an nginx with
#           worker_processes 1 under `taskset -c 0` (benches/peers/backend-nginx.conf:
#           `return 200 "hello world\n"`, access_log off, keepalive_requests 1000000).
#           Both run for the whole run; only the one being measured gets load.
#   core 1: the load generator, `taskset -c 1 wrk -t1 -c$CONNS -d$DURATION --latency`.
#   Both answer 200 with the same 12-byte body "hello world\n" over keep-alive
#   connections; nginx adds Server, Content-Type and Connection headers that
#   pinlb doesn't (about 60 bytes more per response).
#
# Procedure: both servers are started once and polled (curl, bounded loop)
# until they answer "hello world". Then, for each of $ROUNDS rounds, each
# server in $SERVERS order gets an unrecorded warm-up wrk run ($WARMUP) and the
# recorded run ($DURATION): pinlb, nginx, pinlb, nginx, ... so drift cancels.
#
# Measured per round and server:
#   req/s        wrk "Requests/sec"
#   p99          wrk --latency 99% line, in microseconds
#   errors       wrk socket errors (connect+read+write+timeout) + non-2xx/3xx
#   CPU us/req   utime+stime delta of the server's processes (nginx: master +
#                worker; pinlb: its process, all threads) from /proc/PID/stat,
#                divided by the requests wrk completed
#   core busy    % busy of cores 0 and 1 (/proc/stat), and core 0's busy % NOT
#                spent in the server - rounds where that exceeds 10% (another
#                program running) are flagged
# Summary: per server the median over rounds of req/s, p99 and CPU us/req,
# min/max req/s, and pinlb/nginx: the ratio of the medians and the median of
# the per-round ratios, against the 0.9 target. Printed as Markdown and written
# to $OUT_MD.
#
# Usage (from anywhere; root or not):
#   bash benches/backend.sh
#   ROUNDS=3 DURATION=5s bash benches/backend.sh
# Environment:
#   ROUNDS=5            recorded rounds per server
#   DURATION=10s        wrk duration of each recorded run
#   CONNS=64            wrk connections (-c); wrk always uses one thread (-t1)
#   WARMUP=1s           unrecorded wrk run before each recorded run; 0 = none
#   PINLB=target/release/pinlb    pinlb binary (relative to the repo root)
#   OUT_MD=/tmp/pinlb-backend.md  where the Markdown report is written
#   PORT_BASE=18280     ports: the first free loopback ports >= PORT_BASE
#                       (checked with `ss -ltn`), pinlb's then nginx's
#   KEEP_TMP=0          1 = keep the temp dir (config, logs, wrk outputs)
# Needs: nginx, wrk (installed with apt-get if missing and root), curl,
# taskset, ss, awk, getconf.
#
# Don't run it while something else is busy on the machine (e.g. cargo build):
# both cores are part of the measurement. Both cores are sampled for 1 s before
# anything starts and a warning is printed if either is >10% busy.

set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR="$ROOT/benches/peers"
CMDLINE="bash $0${*:+ $*}"

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
WARMUP=${WARMUP:-1s}
PINLB=${PINLB:-target/release/pinlb}
OUT_MD=${OUT_MD:-/tmp/pinlb-backend.md}
PORT_BASE=${PORT_BASE:-18280}
KEEP_TMP=${KEEP_TMP:-0}
SERVERS=(pinlb nginx)
TARGET=0.9

case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[backend] %s\n' "$*" >&2; }
die() {
    printf '[backend] ERROR: %s\n' "$*" >&2
    exit 1
}

[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer (got '$ROUNDS')"
[[ $CONNS =~ ^[1-9][0-9]*$ ]] || die "CONNS must be a positive integer (got '$CONNS')"
[[ $PORT_BASE =~ ^[0-9]+$ ]] || die "PORT_BASE must be a number (got '$PORT_BASE')"

# ---------------------------------------------------------------- tools
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nginx-light wrk" nginx wrk
require nginx wrk curl taskset ss awk getconf sort
[[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (build it: cargo build --release, or set PINLB=...)"
"$PINLB" backend --help >/dev/null 2>&1 || die "'$PINLB backend --help' failed: a pinlb without the backend command?"

NCPU=$(nproc)
CLK_TCK=$(getconf CLK_TCK)
((NCPU >= 2)) || die "need at least 2 cores (0 and 1); nproc=$NCPU"

# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-backend.XXXXXX")
chmod 755 "$WORK" # nginx workers may run as an unprivileged user when root
PIDS=()           # every long-lived process we started
WRK_PID=""

running_pids() { echo "$WRK_PID" "${PIDS[@]}"; }

# ---------------------------------------------------------------- helpers
install_cleanup

# ---------------------------------------------------------------- start
# Is the machine quiet? Sample both cores for 1 s before starting anything.
read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)

declare -A PORT PID_OF VERSION LOGF
for s in "${SERVERS[@]}"; do
    pick_port
    PORT[$s]=$PICKED
done
log "work dir $WORK; pinlb port ${PORT[pinlb]}, nginx port ${PORT[nginx]}"

d="$WORK/pinlb"
mkdir -p "$d"
LOGF[pinlb]="$d/stderr.log"
RUST_LOG=warn taskset -c 0 "$PINLB" backend --listen "127.0.0.1:${PORT[pinlb]}" --cpus 0 \
    >"$d/stdout.log" 2>"${LOGF[pinlb]}" &
PID_OF[pinlb]=$!
VERSION[pinlb]=$("$PINLB" --version 2>&1 | awk 'NR == 1 {print $NF}')

d="$WORK/nginx"
mkdir -p "$d"
nginx_temp_paths "$d"
sed -e "s|@DIR@|$d|g" -e "s|@BACKEND_PORT@|${PORT[nginx]}|g" \
    "$PEERS_DIR/backend-nginx.conf" >"$d/nginx.conf"
LOGF[nginx]="$d/error.log"
taskset -c 0 nginx -p "$d" -c "$d/nginx.conf" -e "${LOGF[nginx]}" >"$d/stdout.log" 2>&1 &
PID_OF[nginx]=$!
VERSION[nginx]=$(nginx -v 2>&1 | awk -F'/' '{print $2}')

for s in "${SERVERS[@]}"; do
    PIDS+=("${PID_OF[$s]}")
    wait_ready "$s" "${PORT[$s]}" "${PID_OF[$s]}" "${LOGF[$s]}"
done

# ---------------------------------------------------------------- header
host_facts
ENV_LINE="ROUNDS=$ROUNDS DURATION=$DURATION CONNS=$CONNS WARMUP=$WARMUP PINLB=$PINLB"

echo "== pinlb backend vs nginx return 200 =="
echo "command:   $ENV_LINE $CMDLINE"
echo "nproc:     $NCPU ($CPU_MODEL), CLK_TCK=$CLK_TCK; before start: core0 ${IDLE_BUSY0}% busy, core1 ${IDLE_BUSY1}% busy"
echo "topology:  server under test -> core 0 (one thread / one worker); wrk -t1 -c$CONNS -> core 1"
describe_procs "${SERVERS[@]}"

# ---------------------------------------------------------------- rounds
RAW="$WORK/raw.tsv" # round server rps p99_us errors cpu_us_per_req requests core0% core1% other0%
: >"$RAW"
for ((r = 1; r <= ROUNDS; r++)); do
    for s in "${SERVERS[@]}"; do
        pid=${PID_OF[$s]}
        kill -0 "$pid" 2>/dev/null || {
            cat "${LOGF[$s]}" >&2 || true
            die "$s (pid $pid) died"
        }
        if [[ $WARMUP != 0 ]]; then run_wrk "${PORT[$s]}" "$WARMUP" "$WORK/warmup.txt"; fi
        mapfile -t tree < <(proc_tree "$pid")
        c0=$(cpu_ticks "${tree[@]}")
        j0=$(core_jiffies)
        out="$WORK/wrk-$r-$s.txt"
        run_wrk "${PORT[$s]}" "$DURATION" "$out"
        c1=$(cpu_ticks "${tree[@]}")
        read -r busy0 busy1 < <(core_busy "$j0" "$(core_jiffies)")
        kill -0 "$pid" 2>/dev/null || {
            cat "${LOGF[$s]}" >&2 || true
            die "$s (pid $pid) died during round $r"
        }

        rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
        reqs=$(awk '/ requests in / {print $1}' "$out")
        p99raw=$(awk '$1 == "99%" {print $2}' "$out")
        sockerr=$(awk '/Socket errors:/ { s = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) s += $i; print s }' "$out")
        non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
        [[ -n $rps && -n $reqs && -n $p99raw ]] || {
            cat "$out" >&2
            die "could not parse wrk output ($out)"
        }
        p99=$(to_us "$p99raw")
        dur_us=$(to_us "$(awk '/ requests in / { sub(/,$/, "", $4); print $4 }' "$out")")
        # core 0 busy time not spent in the server's processes (other programs,
        # or softirq work not charged to the server): should be small.
        other0=$(awk -v d=$((c1 - c0)) -v hz="$CLK_TCK" -v t="$dur_us" -v b="$busy0" \
            'BEGIN { o = (t > 0) ? b - 100 * d * 1e6 / hz / t : 0; printf "%.0f\n", (o < 0) ? 0 : o }')
        errors=$((${sockerr:-0} + ${non2xx:-0}))
        cpu=$(awk -v d=$((c1 - c0)) -v hz="$CLK_TCK" -v n="$reqs" 'BEGIN { printf "%.2f\n", (n > 0) ? d * 1e6 / hz / n : 0 }')
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$s" "$rps" "$p99" "$errors" "$cpu" "$reqs" "$busy0" "$busy1" "$other0" >>"$RAW"
        printf 'round %d/%d  %-6s %8.0f req/s  p99 %6s us  cpu %6s us/req  core0 %3s%% (other %2s%%)  core1 %3s%%  errors %s\n' \
            "$r" "$ROUNDS" "$s" "$rps" "$p99" "$cpu" "$busy0" "$other0" "$busy1" "$errors"
        if ((errors > 0)); then log "WARNING: $s had errors in round $r (socket: ${sockerr:-0}, non-2xx/3xx: ${non2xx:-0})"; fi
        if ((other0 > 10)); then
            log "WARNING: core 0 was ${other0}% busy outside $s in round $r - something else is running?"
        fi
    done
done

# ---------------------------------------------------------------- summary
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; else print "n/a" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

declare -A MED_RPS MIN_RPS MAX_RPS MED_P99 MED_CPU ERRS
for s in "${SERVERS[@]}"; do
    read -r "MED_RPS[$s]" "MIN_RPS[$s]" "MAX_RPS[$s]" < <(stats "$s" 3)
    read -r "MED_P99[$s]" _ _ < <(stats "$s" 4)
    read -r "MED_CPU[$s]" _ _ < <(stats "$s" 6)
    ERRS[$s]=$(awk -F'\t' -v s="$s" '$2 == s {n += $5} END {print n + 0}' "$RAW")
done
RATIO=$(ratio "${MED_RPS[pinlb]}" "${MED_RPS[nginx]}")
CPU_RATIO=$(ratio "${MED_CPU[pinlb]}" "${MED_CPU[nginx]}")
# Paired within each round, then the median over rounds: drift between rounds
# cancels out better than in a ratio of medians.
PAIRED=$(awk -F'\t' '$2 == "pinlb" { p[$1] = $3 } $2 == "nginx" { n[$1] = $3 }
    END { for (r in p) if (n[r] > 0) print p[r] / n[r] }' "$RAW" | median)
VERDICT=$(awk -v a="$RATIO" -v b="$PAIRED" -v t="$TARGET" 'BEGIN {
    if (a + 0 >= t && b + 0 >= t) print "meets"; else if (a + 0 >= t || b + 0 >= t) print "meets in one of the two ratios"; else print "misses" }')

MD="$WORK/report.md"
if [[ $WARMUP == 0 ]]; then WARMUP_TXT="no warm-up"; else WARMUP_TXT="a $WARMUP unrecorded warm-up"; fi
{
    echo "### pinlb backend vs nginx \`return 200\` ($(date -u +%Y-%m-%d), commit $COMMIT)"
    echo
    echo "- Command: \`$ENV_LINE $CMDLINE\`"
    echo "- Host: nproc=$NCPU, $CPU_MODEL, $(uname -sr); before start core0 ${IDLE_BUSY0}% / core1 ${IDLE_BUSY1}% busy"
    echo "- Topology: the server under test on core 0, single-threaded (\`pinlb backend --cpus 0\`; nginx \`worker_processes 1\` under \`taskset -c 0\`), both answering 200 \`hello world\\n\` over keep-alive; \`wrk -t1 -c$CONNS --latency\` on core 1."
    echo "- $ROUNDS interleaved rounds (pinlb, nginx, repeat), each $WARMUP_TXT then $DURATION recorded; servers started once for the whole run. Medians over rounds; CPU = utime+stime of the server's processes per completed request."
    echo
    echo "| server | version | req/s (median) | req/s min | req/s max | p99 µs (median) | CPU µs/req (median) | errors (all rounds) |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|"
    for s in "${SERVERS[@]}"; do
        printf '| %s | %s | %.0f | %.0f | %.0f | %.0f | %.2f | %s |\n' "$s" "${VERSION[$s]}" \
            "${MED_RPS[$s]}" "${MIN_RPS[$s]}" "${MAX_RPS[$s]}" "${MED_P99[$s]}" "${MED_CPU[$s]}" "${ERRS[$s]}"
    done
    echo
    echo "- throughput: pinlb ÷ nginx = **$RATIO** (ratio of medians), **$PAIRED** (median of per-round ratios); target ≥ $TARGET: **$VERDICT**"
    echo "- CPU per request: pinlb ÷ nginx = **$CPU_RATIO** (< 1 is leaner)"
    noisy=$(awk -F'\t' '$10 > 10 { n++ } END { print n + 0 }' "$RAW")
    if ((noisy > 0)); then
        echo
        echo "**Warning:** in $noisy round(s) core 0 was more than 10% busy outside the server under test (another program was running); those numbers are noisy."
    fi
    echo
    echo "<details><summary>per-round results</summary>"
    echo
    echo "| round | server | req/s | p99 µs | CPU µs/req | errors | requests | core0 busy | core0 busy outside server | core1 busy |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk -F'\t' '{ printf "| %s | %s | %.0f | %s | %s | %s | %s | %s%% | %s%% | %s%% |\n", $1, $2, $3, $4, $6, $5, $7, $8, $10, $9 }' "$RAW"
    echo
    echo "</details>"
} >"$MD"

publish_report "$MD"
