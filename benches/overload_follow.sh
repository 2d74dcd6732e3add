#!/usr/bin/env bash
# benches/overload_follow.sh - issue 47: "A backend that slows down from 1 ms to 20 ms per request
# has its learned limit lowered within 5 s, and raised again within 10 s of recovering." Steady
# load through pinlb (its defaults: a learned concurrency limit per backend) to three backends
# that each serve one request at a time; mid-run one of them turns slow, later fast again, and
# the limit pinlb has learned for it is read from its admin listener's GET /status throughout.
#
# Topology (meant for a 2-core machine, as benches/overload.sh):
#   core 0: pinlb, one worker (benches/peers/overload/pinlb-follow.toml: [runtime] cpus = [0],
#           least_conn over the three backends, no other key set, plus [admin] on loopback),
#           started with taskset -c 0
#   core 1: three Node.js processes (benches/peers/overload/node-serial.js: one request at a
#           time, in arrival order, each taking $FAST_MS ms - a timer with MODE=sleep, the
#           default, so they use next to no CPU; a busy loop with MODE=busy - and a control path,
#           GET /__work?ms=N, that sets the time per request for the requests served from then
#           on); the load generator, taskset -c 1 wrk -t1 -c$CONNS -d<run> --latency (keep-alive);
#           and the poller, a bash loop pinned to core 1 that GETs pinlb's /status every
#           $POLL_MS ms (curl --max-time 1) and records each backend's "concurrency_limit" and
#           "in_flight" and the upstream's queue's "waiting"
#
# Procedure: the backends and pinlb start and are polled (curl, bounded) until they answer
# "hello world"; pinlb's configuration is first tried with `pinlb check`. /status is read once:
# a pinlb whose backends have no "concurrency_limit" (a binary from before issue 47) ends the
# script here, exit status 1, saying so. Then the load starts (t = 0) with the poller, and
#   t = $WARM_S:                   GET /__work?ms=$SLOW_MS to backend 0 (directly, not through
#                                  pinlb): backend 0 turns slow
#   t = $WARM_S + $SLOW_S:         GET /__work?ms=$FAST_MS to backend 0: it recovers
#   t = $WARM_S + $SLOW_S + $AFTER_S: the load ends; so does the poller.
# Each event's time is taken just before its request is sent (the change takes effect between
# that and the answer, a millisecond or so later: the times below are at most that much long).
#
# Measured (backend 0's concurrency_limit over the polls, times from the polls' own clock):
#   limit before   its median over the $BASE_S s before the slow-down (min and max shown too)
#   lowered in     from the slow-down to the first poll at which the limit is at most half its
#                  value before (or at $ADAPTIVE_MIN, pinlb's adaptive_min default, when half is
#                  below that). Bar: <= 5 s. n/a when the limit before was already at
#                  $ADAPTIVE_MIN (nothing to lower: a steadier load, or a longer WARM_S, helps)
#   limit slow     its median over the last $BASE_S s of the slow phase
#   raised in      from the recovery to the first poll at which the limit is at least half-way
#                  back from "limit slow" to "limit before": >= slow + (before - slow) / 2, which
#                  is about half its value before when the slow phase took it near the floor.
#                  Bar: <= 10 s. n/a when it was never lowered (limit slow >= limit before)
#   limit after    its median over the last $BASE_S s of the run
# Every time is good to one poll ($POLL_MS ms) plus a /status request. Also: wrk's req/s, p50,
# p99, errors and non-2xx answers, and core busy % over the run. The report, Markdown on stdout
# and in $OUT_MD: those figures with the bars met or not, then a time series table every
# $TABLE_STEP_S s (t, each backend's limit and in flight, the queue's waiting; the events'
# polls added), then every poll's row.
#
# Usage:  bash benches/overload_follow.sh
#         PINLB=/tmp/pinlb SLOW_MS=50 bash benches/overload_follow.sh
# Environment:
#   PINLB=target/release/pinlb   pinlb binary (relative to the repo root)
#   WARM_S=10  SLOW_S=10  AFTER_S=15   the phases: before the slow-down, slow, after the recovery
#   FAST_MS=1  SLOW_MS=20   backend 0's time per request, fast and slow (the others stay FAST_MS)
#   MODE=sleep         the backends' turn: sleep (a timer) or busy (a busy loop on core 1)
#   CONNS=200          wrk's connections
#   POLL_MS=200        /status poll interval (50 to 2000)
#   BASE_S=3           the window the limit's before, slow and after levels are medians over
#   ADAPTIVE_MIN=2     pinlb's adaptive_min (its default; the config sets none): the floor
#   TABLE_STEP_S=1     the time series table's step in seconds
#   OUT_MD=/tmp/pinlb-overload-follow.md   where the Markdown report is written
#   PORT_BASE=18580    ports: the first free loopback ports >= PORT_BASE: 3 backends, pinlb,
#                      its admin listener
#   KEEP_TMP=0         1 = keep the temp dir (config, logs, every /status answer)
# Exit status: 0 when measured (the bars met or not: the report says), 1 when it could not be
# (no concurrency_limit in /status, pinlb or a backend not starting, wrk failing).
# Needs: node, wrk, curl, jq, taskset, awk, sort (wrk and jq installed with apt-get if missing
# and root). Don't run it while something else is busy on the machine.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PEERS_DIR="$ROOT/benches/peers/overload"
CMDLINE="bash $0${*:+ $*}"

PINLB=${PINLB:-target/release/pinlb}
WARM_S=${WARM_S:-10}
SLOW_S=${SLOW_S:-10}
AFTER_S=${AFTER_S:-15}
FAST_MS=${FAST_MS:-1}
SLOW_MS=${SLOW_MS:-20}
MODE=${MODE:-sleep}
CONNS=${CONNS:-200}
POLL_MS=${POLL_MS:-200}
BASE_S=${BASE_S:-3}
ADAPTIVE_MIN=${ADAPTIVE_MIN:-2}
TABLE_STEP_S=${TABLE_STEP_S:-1}
OUT_MD=${OUT_MD:-/tmp/pinlb-overload-follow.md}
PORT_BASE=${PORT_BASE:-18580}
KEEP_TMP=${KEEP_TMP:-0}
case $PINLB in /*) ;; *) PINLB="$ROOT/$PINLB" ;; esac
PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[follow] %s\n' "$*" >&2; }
die() {
    printf '[follow] ERROR: %s\n' "$*" >&2
    exit 1
}

for v in WARM_S SLOW_S AFTER_S FAST_MS SLOW_MS CONNS POLL_MS BASE_S ADAPTIVE_MIN TABLE_STEP_S; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ $PORT_BASE =~ ^[0-9]+$ ]] || die "PORT_BASE must be a number"
((POLL_MS >= 50 && POLL_MS <= 2000)) || die "POLL_MS must be 50 to 2000 (got $POLL_MS)"
((FAST_MS <= 10000 && SLOW_MS <= 10000)) || die "FAST_MS and SLOW_MS must be at most 10000"
((BASE_S <= WARM_S && BASE_S <= SLOW_S && BASE_S <= AFTER_S)) || die "BASE_S ($BASE_S) must not exceed WARM_S, SLOW_S or AFTER_S"
case $MODE in sleep | busy) ;; *) die "MODE must be sleep or busy (got '$MODE')" ;; esac
TOTAL_S=$((WARM_S + SLOW_S + AFTER_S))

# ---------------------------------------------------------------- tools
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
install_missing "nodejs wrk jq" node wrk jq
require node wrk curl jq taskset awk sort
[[ -x $PINLB ]] || die "pinlb binary not found at $PINLB (build it: cargo build --release, or set PINLB=...)"
"$PINLB" --version >/dev/null 2>&1 || die "'$PINLB --version' failed"
NCPU=$(nproc)
((NCPU >= 2)) || die "need at least 2 cores (0 and 1); nproc=$NCPU"
[[ -n ${EPOCHREALTIME:-} ]] || die "needs bash 5 (\$EPOCHREALTIME); this is bash $BASH_VERSION"

# ---------------------------------------------------------------- cleanup
# ---------------------------------------------------------------- cleanup
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pinlb-follow.XXXXXX")
NODE_PIDS=()
PINLB_PID=""
WRK_PID=""  # wrk while it runs
POLL_PID="" # the poller while it runs
running_pids() { echo "$WRK_PID" "$POLL_PID" "$PINLB_PID" "${NODE_PIDS[@]}"; }
install_cleanup

# ---------------------------------------------------------------- helpers
# now_us: sets NOW_US to the wall clock in microseconds (no fork).
now_us() {
    local t=$EPOCHREALTIME
    NOW_US=${t/[.,]/}
}

# sleep_until_us T: sleeps until the wall clock reaches T (µs); at once if it has.
sleep_until_us() {
    local d s
    now_us
    d=$(($1 - NOW_US))
    if ((d > 0)); then
        printf -v s '%d.%06d' $((d / 1000000)) $((d % 1000000))
        sleep "$s"
    fi
}

# set_work MS: backend 0's time per request from now on (its control path, not through pinlb);
# sets EVENT_US to the time just before the request went out.
set_work() {
    local url="http://127.0.0.1:${NODE_PORTS[0]}/__work?ms=$1" answer
    now_us
    EVENT_US=$NOW_US
    answer=$(curl -s --max-time 2 "$url") || die "backend 0 did not answer $url"
    [[ $answer == *"\"ms\":$1,"* ]] || die "backend 0 answered $url with: $answer"
}

# poller: every POLL_MS, one line "MICROSECONDS<TAB>/status's JSON on one line" (empty when
# /status did not answer within 1 s); at most POLL_N lines. Runs pinned to core 1.
poller() {
    local i body d s next
    taskset -pc 1 "$BASHPID" >/dev/null 2>&1 || true
    for ((i = 0; i < POLL_N; i++)); do
        now_us
        next=$((NOW_US + POLL_MS * 1000))
        body=$(curl -s --max-time 1 "http://127.0.0.1:$ADMIN/status" 2>/dev/null) || body=""
        printf '%s\t%s\n' "$NOW_US" "${body//$'\n'/}"
        now_us
        d=$((next - NOW_US))
        if ((d > 0)); then
            printf -v s '%d.%06d' $((d / 1000000)) $((d % 1000000))
            sleep "$s"
        fi
    done
}

# col_stat FROM TO COL WHAT: over the polls with FROM <= t < TO whose column COL ($RAW, 1-based)
# is a number, its median, min or max (WHAT); "nan" when there is none.
col_stat() {
    awk -F'\t' -v a="$1" -v b="$2" -v k="$3" '$1 + 0 >= a && $1 + 0 < b && $k ~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/ {print $k}' "$RAW" |
        sort -g | awk -v w="$4" '{ v[NR] = $1 } END {
            if (NR == 0) { print "nan"; exit }
            if (w == "min") print v[1]
            else if (w == "max") print v[NR]
            else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        }'
}

# first_poll FROM TO COL OP THRESHOLD: the t of the first poll with FROM <= t < TO whose column
# COL is a number OP ("le" or "ge") THRESHOLD; "none" when none is.
first_poll() {
    awk -F'\t' -v a="$1" -v b="$2" -v k="$3" -v op="$4" -v thr="$5" '
        $1 + 0 >= a && $1 + 0 < b && $k ~ /^-?[0-9.]+([eE][-+]?[0-9]+)?$/ &&
            ((op == "le" && $k + 0 <= thr + 0) || (op == "ge" && $k + 0 >= thr + 0)) { print $1; found = 1; exit }
        END { if (!found) print "none" }' "$RAW"
}

# calc EXPR: awk's value of EXPR, to 3 decimals ("nan" stays).
calc() { awk "BEGIN { v = $1; printf \"%.3f\\n\", v }"; }

# ---------------------------------------------------------------- start
read -r IDLE_BUSY0 IDLE_BUSY1 < <(core_busy_1s)
NODE_PORTS=()
for i in 0 1 2; do
    pick_port
    NODE_PORTS+=("$PICKED")
done
pick_port
PORT=$PICKED
pick_port
ADMIN=$PICKED
log "work dir $WORK; backends 127.0.0.1:${NODE_PORTS[*]}; pinlb 127.0.0.1:$PORT, admin 127.0.0.1:$ADMIN"

for i in 0 1 2; do
    PORT=${NODE_PORTS[$i]} WORK_MS=$FAST_MS WORK=$MODE taskset -c 1 node "$PEERS_DIR/node-serial.js" \
        >"$WORK/node$i.log" 2>&1 &
    NODE_PIDS+=("$!")
    wait_ready "node$i" "${NODE_PORTS[$i]}" "$!" "$WORK/node$i.log"
done

sed -e "s|@PORT@|$PORT|g" -e "s|@ADMIN@|$ADMIN|g" -e "s|@NODE0@|${NODE_PORTS[0]}|g" \
    -e "s|@NODE1@|${NODE_PORTS[1]}|g" -e "s|@NODE2@|${NODE_PORTS[2]}|g" \
    "$PEERS_DIR/pinlb-follow.toml" >"$WORK/pinlb.toml"
if ! "$PINLB" check -c "$WORK/pinlb.toml" >"$WORK/check.log" 2>&1; then
    cat "$WORK/check.log" >&2
    die "\`pinlb check\` rejects benches/peers/overload/pinlb-follow.toml (rendered: $WORK/pinlb.toml); this binary may predate one of its keys"
fi
RUST_LOG=warn taskset -c 0 "$PINLB" serve -c "$WORK/pinlb.toml" >"$WORK/pinlb.log" 2>&1 &
PINLB_PID=$!
wait_ready pinlb "$PORT" "$PINLB_PID" "$WORK/pinlb.log"
PINLB_VERSION=$("$PINLB" --version 2>&1 | awk 'NR == 1 {print $NF}')

# /status must show a learned limit per backend: the binary has issue 47, or nothing to measure.
curl -s --max-time 2 "http://127.0.0.1:$ADMIN/status" >"$WORK/status0.json" ||
    die "pinlb's admin listener (127.0.0.1:$ADMIN) did not answer GET /status"
jq -e '.upstreams[] | select(.name == "app") | .backends | length == 3' "$WORK/status0.json" >/dev/null 2>&1 ||
    die "pinlb's GET /status has no upstream \"app\" with 3 backends (answer kept in $WORK/status0.json with KEEP_TMP=1)"
if ! jq -e '[.upstreams[] | select(.name == "app") | .backends[] | has("concurrency_limit")] | all' "$WORK/status0.json" >/dev/null; then
    keys=$(jq -r '[.upstreams[] | select(.name == "app") | .backends[0] | keys_unsorted[]] | join(", ")' "$WORK/status0.json")
    die "pinlb's GET /status has no \"concurrency_limit\" for its backends (a backend's keys: $keys): $PINLB (pinlb $PINLB_VERSION) predates issue 47's learned limits; nothing to measure"
fi
if jq -e '[.upstreams[] | select(.name == "app") | .backends[] | .concurrency_limit == null] | all' "$WORK/status0.json" >/dev/null; then
    log "WARNING: every backend's concurrency_limit is null before the load (not learning: adaptive = false or a fixed max_conns?); the run goes on, and ends in an error if backend 0's stays null"
fi

# ---------------------------------------------------------------- run
host_facts
NODE_VERSION=$(node --version)
ENV_LINE="PINLB=$PINLB WARM_S=$WARM_S SLOW_S=$SLOW_S AFTER_S=$AFTER_S FAST_MS=$FAST_MS SLOW_MS=$SLOW_MS MODE=$MODE CONNS=$CONNS POLL_MS=$POLL_MS BASE_S=$BASE_S"
echo "== overload_follow: backend 0 of 3 slows from $FAST_MS ms to $SLOW_MS ms per request and recovers, under wrk -c$CONNS through pinlb =="
echo "command:   $ENV_LINE $CMDLINE"
echo "nproc:     $NCPU ($CPU_MODEL); commit $COMMIT; pinlb $PINLB_VERSION; node $NODE_VERSION"
echo "topology:  core 0: pinlb (pid $PINLB_PID, one worker); core 1: 3 node-serial.js ${NODE_PORTS[*]} (MODE=$MODE) + wrk -t1 -c$CONNS + the /status poller"

POLL_N=$(((TOTAL_S + 5) * 1000 / POLL_MS))
now_us
T0_US=$NOW_US
start_wrk "$PORT" "${TOTAL_S}s" "$WORK/wrk.txt"
poller >"$WORK/polls.tsv" &
POLL_PID=$!
J0=$(core_jiffies)
log "load on for ${TOTAL_S} s: backend 0 to $SLOW_MS ms at t=${WARM_S} s, back to $FAST_MS ms at t=$((WARM_S + SLOW_S)) s"
sleep_until_us $((T0_US + WARM_S * 1000000))
set_work "$SLOW_MS"
SLOW_US=$EVENT_US
log "backend 0 slow ($SLOW_MS ms per request)"
sleep_until_us $((T0_US + (WARM_S + SLOW_S) * 1000000))
set_work "$FAST_MS"
FAST_US=$EVENT_US
log "backend 0 fast again ($FAST_MS ms per request)"
wait_wrk "$WORK/wrk.txt"
J1=$(core_jiffies)
stop_all "$POLL_PID"
wait "$POLL_PID" 2>/dev/null || true
POLL_PID=""
kill -0 "$PINLB_PID" 2>/dev/null || log "WARNING: pinlb died during the run (log: $WORK/pinlb.log)"
read -r BUSY0 BUSY1 < <(core_busy "$J0" "$J1")

# ---------------------------------------------------------------- analysis
# One row per poll: t (s since the load started), backend 0..2's concurrency_limit, their
# in_flight, the queue's waiting; "null" for a null limit, "-" for what the answer lacked (all
# of them when /status did not answer).
RAW="$WORK/raw.tsv"
jq -R -r --argjson t0 "$T0_US" --arg a0 "127.0.0.1:${NODE_PORTS[0]}" --arg a1 "127.0.0.1:${NODE_PORTS[1]}" \
    --arg a2 "127.0.0.1:${NODE_PORTS[2]}" '
    split("\t") as $f
    | ((($f[0] | tonumber) - $t0) / 1e6) as $t
    | ((($f[1] // "") | fromjson?) // null) as $s
    | (if $s == null then null else ([$s.upstreams[]? | select(.name == "app")] | .[0]) end) as $u
    | ([$a0, $a1, $a2] | map(. as $a | if $u == null then null else ([$u.backends[]? | select(.address == $a)] | .[0]) end)) as $b
    | [$t]
      + ($b | map(if . == null then "-" elif .concurrency_limit == null then "null" else .concurrency_limit end))
      + ($b | map(if . == null or .in_flight == null then "-" else .in_flight end))
      + [if $u == null or $u.queue == null then "-" else ($u.queue.waiting // "-") end]
    | @tsv' "$WORK/polls.tsv" | awk -F'\t' -v OFS='\t' '{ $1 = sprintf("%.3f", $1); print }' >"$RAW"
NPOLLS=$(wc -l <"$RAW")
NDOWN=$(awk -F'\t' '$2 == "-"' "$RAW" | wc -l)
((NPOLLS > 0)) || die "no /status poll recorded ($WORK/polls.tsv)"

TS=$(calc "($SLOW_US - $T0_US) / 1e6")
TF=$(calc "($FAST_US - $T0_US) / 1e6")
TE=$TOTAL_S
B_BEFORE=$(calc "$TS - $BASE_S")
B_SLOW=$(calc "$TF - $BASE_S")
B_AFTER=$(calc "$TE - $BASE_S")
L_BEFORE=$(col_stat "$B_BEFORE" "$TS" 2 median)
L_BEFORE_MIN=$(col_stat "$B_BEFORE" "$TS" 2 min)
L_BEFORE_MAX=$(col_stat "$B_BEFORE" "$TS" 2 max)
L_SLOW=$(col_stat "$B_SLOW" "$TF" 2 median)
L_SLOW_MIN=$(col_stat "$TS" "$TF" 2 min)
L_AFTER=$(col_stat "$B_AFTER" 1e9 2 median)
[[ $L_BEFORE != nan ]] ||
    die "backend 0's concurrency_limit was never a number in the $BASE_S s before the slow-down (null: pinlb learns no limit for it - adaptive = false, or a fixed max_conns?); polls: $RAW (KEEP_TMP=1 keeps it)"

LOWER_NOTE="" RAISE_NOTE=""
T_LOWER=nan T_RAISE=nan AT_LOWER=none AT_RAISE=none LOW_THR=nan HI_THR=nan
if awk -v l="$L_BEFORE" -v m="$ADAPTIVE_MIN" 'BEGIN { exit !(l <= m) }'; then
    LOWER_NOTE="n/a: the limit before was already at adaptive_min ($ADAPTIVE_MIN), nothing to lower"
else
    LOW_THR=$(awk -v l="$L_BEFORE" -v m="$ADAPTIVE_MIN" 'BEGIN { h = l / 2; printf "%.3f\n", (h < m) ? m : h }')
    AT_LOWER=$(first_poll "$TS" "$TF" 2 le "$LOW_THR")
    if [[ $AT_LOWER == none ]]; then
        LOWER_NOTE="not within the slow phase ($SLOW_S s): the limit stayed above $LOW_THR (lowest $L_SLOW_MIN)"
    else
        T_LOWER=$(calc "$AT_LOWER - $TS")
    fi
fi
if [[ $L_SLOW == nan ]] || awk -v s="$L_SLOW" -v b="$L_BEFORE" 'BEGIN { exit !(s >= b) }'; then
    RAISE_NOTE="n/a: the limit was not lower at the end of the slow phase (${L_SLOW}) than before ($L_BEFORE)"
else
    HI_THR=$(calc "$L_SLOW + ($L_BEFORE - $L_SLOW) / 2")
    AT_RAISE=$(first_poll "$TF" 1e9 2 ge "$HI_THR")
    if [[ $AT_RAISE == none ]]; then
        RAISE_NOTE="not within the $AFTER_S s after the recovery: the limit stayed below $HI_THR (at the end: $L_AFTER)"
    else
        T_RAISE=$(calc "$AT_RAISE - $TF")
    fi
fi
# verdict VALUE BAR: "✓" when VALUE <= BAR, "✗" when above, "" for nan.
verdict() { awk -v v="$1" -v b="$2" 'BEGIN { if (v == "nan") print ""; else print (v + 0 <= b + 0) ? "✓" : "✗" }'; }
V_LOWER=$(verdict "$T_LOWER" 5)
V_RAISE=$(verdict "$T_RAISE" 10)

# wrk's figures
WRK_RPS=$(awk '/^Requests\/sec:/ {print $2}' "$WORK/wrk.txt")
WRK_P50=$(awk '$1 == "50%" {print $2; exit}' "$WORK/wrk.txt")
WRK_P99=$(awk '$1 == "99%" {print $2; exit}' "$WORK/wrk.txt")
WRK_REQS=$(awk '/requests in/ {print $1; exit}' "$WORK/wrk.txt")
WRK_NON2XX=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$WORK/wrk.txt")
WRK_SOCKERR=$(awk -F'Socket errors: ' 'NF > 1 {print $2}' "$WORK/wrk.txt")

# ---------------------------------------------------------------- report
MD="$WORK/report.md"
{
    echo "### Overload, a backend's learned limit following it (issue 47): backend 0 of 3 from $FAST_MS ms to $SLOW_MS ms per request and back, under wrk -c$CONNS ($(date -u '+%Y-%m-%d %H:%M UTC'), commit $COMMIT)"
    echo
    echo "- Command: \`$ENV_LINE $CMDLINE\`"
    echo "- Host: nproc=$NCPU, $CPU_MODEL, $(uname -sr); before start core0 ${IDLE_BUSY0}% / core1 ${IDLE_BUSY1}% busy, during the run core0 ${BUSY0}% / core1 ${BUSY1}%"
    echo "- Versions: pinlb $PINLB_VERSION; node $NODE_VERSION; $(wrk --version 2>&1 | awk 'NR == 1 {print $1, $2}')"
    echo "- Topology: pinlb on core 0 (one worker; \`benches/peers/overload/pinlb-follow.toml\`: least_conn, no other key but the admin listener: its learned limits are the defaults'); 3 \`node-serial.js\` backends (one request at a time, MODE=$MODE), \`wrk -t1 -c$CONNS -d${TOTAL_S}s\` (keep-alive) and a \`/status\` poll every $POLL_MS ms on core 1."
    echo "- Timeline: load from t = 0 to $TOTAL_S s; backend 0 to $SLOW_MS ms at t = $TS s, back to $FAST_MS ms at t = $TF s (each taken just before the control request went out). $NPOLLS polls, $NDOWN without an answer."
    echo "- Load: $WRK_REQS requests, ${WRK_RPS} req/s, p50 $WRK_P50, p99 $WRK_P99; non-2xx ${WRK_NON2XX:-0}; socket errors ${WRK_SOCKERR:-none}"
    if ((IDLE_BUSY0 > 10 || IDLE_BUSY1 > 10)); then
        echo "- **Warning:** the cores were busy before the start (core0 ${IDLE_BUSY0}%, core1 ${IDLE_BUSY1}%): another program was running; the times are noisy."
    fi
    echo
    echo "| backend 0's concurrency_limit | value | bar |"
    echo "|---|---:|---|"
    echo "| before: median (min-max) over the $BASE_S s before the slow-down | $L_BEFORE ($L_BEFORE_MIN-$L_BEFORE_MAX) | |"
    echo "| lowered: s from the slow-down to the first poll with limit ≤ $LOW_THR (half the limit before, or adaptive_min) | ${T_LOWER/nan/${LOWER_NOTE}} | ≤ 5 s $V_LOWER |"
    echo "| slow: median over the last $BASE_S s of the slow phase (lowest in it) | $L_SLOW ($L_SLOW_MIN) | |"
    echo "| raised: s from the recovery to the first poll with limit ≥ $HI_THR (half-way back from slow to before) | ${T_RAISE/nan/${RAISE_NOTE}} | ≤ 10 s $V_RAISE |"
    echo "| after: median over the last $BASE_S s of the run | $L_AFTER | |"
    echo
    echo "Every $TABLE_STEP_S s (the first poll at or after each mark) and each event's poll: concurrency_limit and in_flight per backend, the upstream queue's waiting (\"-\": not in /status)."
    echo
    echo "| t s | limit b0 | limit b1 | limit b2 | in flight b0 | in flight b1 | in flight b2 | queue waiting | event |"
    echo "|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    awk -F'\t' -v step="$TABLE_STEP_S" -v ts="$TS" -v tf="$TF" -v al="$AT_LOWER" -v ar="$AT_RAISE" \
        -v sm="$SLOW_MS" -v fm="$FAST_MS" '
        BEGIN { mark = 0; seen_s = 0; seen_f = 0 }
        { t = $1 + 0; ev = ""
          if (!seen_s && t >= ts + 0) { ev = "first poll after backend 0 -> " sm " ms"; seen_s = 1 }
          if (!seen_f && t >= tf + 0) { ev = "first poll after backend 0 -> " fm " ms"; seen_f = 1 }
          if (al != "none" && $1 == al) ev = (ev == "" ? "" : ev "; ") "lowered"
          if (ar != "none" && $1 == ar) ev = (ev == "" ? "" : ev "; ") "raised"
          if (t >= mark || ev != "") {
              printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, ev
          }
          while (mark <= t) mark += step
        }' "$RAW"
    raw_section "Every poll (t s, concurrency_limit of backends 0, 1, 2, in_flight of backends 0, 1, 2, queue waiting):"
} >"$MD"
publish_report "$MD"
