#!/usr/bin/env bash
# benches/fastcgi.sh - a PHP hello-world through pinlb (`protocol = "fastcgi"`) and through
# nginx's fastcgi module, to the same php-fpm pool (issue 30's bar: pinlb's req/s ≥ nginx's).
#
# php-fpm (pm = static, 2 x PHP_CHILDREN workers: each proxy keeps PHP_CHILDREN connections,
# and php-fpm binds a worker to each kept one) pinned to PHP_CORES; the proxy under test (pinlb
# with one worker, or nginx with one worker process, keep-alive to php-fpm in both, PHP_CHILDREN
# connections kept) on core 0;
# wrk on core 1. ROUNDS interleaved rounds (pinlb, nginx, pinlb, ...) of DURATION each; prints
# the median req/s, p99 latency and the proxy's CPU per request (its utime+stime over the
# requests it served), and the ratio pinlb/nginx.
#
# Usage: bash benches/fastcgi.sh [PINLB_BINARY]   (default target/release/pinlb)
#   ROUNDS=5, DURATION=10s, CONNS=32, PHP_CHILDREN=4, PHP_CORES=2-5 (default: cores 2.. up to 5),
#   PHP_FPM=/usr/sbin/php-fpm8.2 (default: the first /usr/sbin/php-fpm*), KEEP_TMP=1,
#   PORT_BASE=18390
# Needs: php-fpm, nginx, wrk, taskset, curl. A short check: ROUNDS=1 DURATION=2s.
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-32}
PHP_CHILDREN=${PHP_CHILDREN:-4}
KEEP_TMP=${KEEP_TMP:-0}
WORK=$(mktemp -d)
PIDS=()
log() { printf '[fastcgi] %s\n' "$*" >&2; }
die() { printf '[fastcgi] ERROR: %s\n' "$*" >&2; exit 1; }
PORT_BASE=${PORT_BASE:-18390}
# shellcheck source=benches/lib.sh
source "$ROOT/benches/lib.sh"
running_pids() { echo "${PIDS[@]}"; }
install_cleanup
require taskset curl wrk nginx

PHP_FPM=${PHP_FPM:-$(compgen -G '/usr/sbin/php-fpm*' | head -n1 || true)}
[[ -x $PHP_FPM ]] || die "no php-fpm (Debian: apt-get install php-fpm), or set PHP_FPM"
CORES=$(nproc)
((CORES >= 2)) || die "needs 2 cores at least: the proxy on 0, wrk on 1 (php-fpm on 2.. when there are more)"
if ((CORES >= 3)); then
    PHP_CORES=${PHP_CORES:-2-$((CORES - 1 < 5 ? CORES - 1 : 5))}
else
    PHP_CORES=${PHP_CORES:-1}
    log "WARNING: 2 cores: php-fpm shares core 1 with wrk; figures are for a run-through only"
fi

pick_port
FPM_PORT=$PICKED
pick_port
PINLB_PORT=$PICKED
pick_port
NGINX_PORT=$PICKED

mkdir -p "$WORK/www"
echo '<?php echo "hello world";' >"$WORK/www/index.php"
cat >"$WORK/php-fpm.conf" <<EOF
[global]
error_log = $WORK/fpm.log
daemonize = no
pid = $WORK/fpm.pid

[www]
listen = 127.0.0.1:$FPM_PORT
listen.backlog = 4096
pm = static
; Twice what each proxy keeps: the proxy not under load holds its kept connections idle, and
; php-fpm binds a worker to each of them, so each proxy's round has PHP_CHILDREN workers free.
pm.max_children = $((2 * PHP_CHILDREN))
pm.max_requests = 0
EOF
as_root=()
[[ $(id -u) -eq 0 ]] && as_root=(-R)
taskset -c "$PHP_CORES" "$PHP_FPM" -F -y "$WORK/php-fpm.conf" -p "$WORK" "${as_root[@]}" \
    >"$WORK/fpm.out" 2>&1 &
PIDS+=($!)

cat >"$WORK/pinlb.toml" <<EOF
[runtime]
cpus = [0]

[[listener]]
address = "127.0.0.1:$PINLB_PORT"
upstream = "php"

# php-fpm binds a worker to each kept connection: at most pm.max_children requests (so
# connections) at once, the rest waiting in pinlb's queue (see docs/configuration.md).
[upstream.php]
protocol = "fastcgi"
keepalive = $PHP_CHILDREN
max_conns = $PHP_CHILDREN
queue = 4096
backends = [{ address = "127.0.0.1:$FPM_PORT" }]

[upstream.php.fastcgi]
root = "$WORK/www"
script = "/index.php"
EOF
"$PINLB" serve -c "$WORK/pinlb.toml" 2>"$WORK/pinlb.log" &
PINLB_PID=$!
PIDS+=("$PINLB_PID")

nginx_temp_paths "$WORK"
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
worker_cpu_affinity 1;
daemon off;
pid $WORK/nginx.pid;
error_log $WORK/nginx.err warn;
events { worker_connections 4096; }
http {
    access_log off;
    include $WORK/temp_paths.conf;
    # keepalive as pinlb's: connections past it are closed after their request, which frees
    # the php-fpm worker that held them.
    upstream php { server 127.0.0.1:$FPM_PORT; keepalive $PHP_CHILDREN; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        root $WORK/www;
        location / {
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME \$document_root/index.php;
            fastcgi_keep_conn on;
            fastcgi_pass php;
        }
    }
}
EOF
nginx -c "$WORK/nginx.conf" -p "$WORK" >"$WORK/nginx.out" 2>&1 &
NGINX_PID=$!
PIDS+=("$NGINX_PID")

wait_ready pinlb "$PINLB_PORT" "$PINLB_PID" "$WORK/pinlb.log"
wait_ready nginx "$NGINX_PORT" "$NGINX_PID" "$WORK/nginx.err"

RAW=$WORK/raw.tsv
: >"$RAW"
# round N NAME PORT PID...: one wrk run; appends "N NAME req/s p99_us cpu_us_per_req".
round() {
    local n=$1 name=$2 port=$3 t0 t1 reqs rps p99
    shift 3
    t0=$(cpu_ticks "$@")
    run_wrk "$port" "$DURATION" "$WORK/$name.$n.wrk"
    t1=$(cpu_ticks "$@")
    reqs=$(awk '/requests in/ {print $1}' "$WORK/$name.$n.wrk")
    rps=$(awk '/Requests\/sec/ {print $2}' "$WORK/$name.$n.wrk")
    p99=$(to_us "$(awk '$1 == "99%" {print $2}' "$WORK/$name.$n.wrk")")
    grep -q "Non-2xx" "$WORK/$name.$n.wrk" && die "$name answered errors: $(cat "$WORK/$name.$n.wrk")"
    printf '%s\t%s\t%s\t%s\t%s\n' "$n" "$name" "$rps" "$p99" \
        "$(awk -v t=$((t1 - t0)) -v r="$reqs" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz * 1e6 / r }')" >>"$RAW"
}
NGINX_TREE=$(proc_tree "$NGINX_PID" | tr '\n' ' ')
for ((n = 1; n <= ROUNDS; n++)); do
    log "round $n/$ROUNDS"
    round "$n" pinlb "$PINLB_PORT" "$PINLB_PID"
    # shellcheck disable=SC2086
    round "$n" nginx "$NGINX_PORT" $NGINX_TREE
done

read -r P_RPS _ _ < <(stats pinlb 3)
read -r N_RPS _ _ < <(stats nginx 3)
read -r P_P99 _ _ < <(stats pinlb 4)
read -r N_P99 _ _ < <(stats nginx 4)
read -r P_CPU _ _ < <(stats pinlb 5)
read -r N_CPU _ _ < <(stats nginx 5)
echo
echo "PHP hello-world, php-fpm pm=static x$PHP_CHILDREN on cores $PHP_CORES, wrk -c$CONNS, $ROUNDS x $DURATION (medians)"
echo
echo "| proxy | req/s | p99 µs | proxy CPU µs/req |"
echo "|---|---:|---:|---:|"
echo "| pinlb | $P_RPS | $P_P99 | $P_CPU |"
echo "| nginx | $N_RPS | $N_P99 | $N_CPU |"
echo
awk -v p="$P_RPS" -v n="$N_RPS" -v pc="$P_CPU" -v nc="$N_CPU" 'BEGIN {
    printf "pinlb/nginx: req/s %.3f (bar: ≥ 1), CPU per request %.3f\n", p / n, pc / nc }'
raw_section "Per round (round, proxy, req/s, p99 µs, CPU µs/req):"
