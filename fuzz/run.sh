#!/usr/bin/env bash
# A fuzzing campaign: every target (or those named) for MINUTES each, one after another, on the
# nightly toolchain, with its seeds and dictionary; prints executions, coverage and findings
# per target and records the table in fuzz/README.md ("Last campaign").
#
#   fuzz/run.sh [MINUTES] [TARGET...]     # default: 10 minutes, every target
#
# A finding (libFuzzer stops at the first) is copied into fuzz/regressions/TARGET/, where
# `cargo test --test fuzz_replay` replays it until it is fixed. The corpus each target grows is
# kept in fuzz/corpus/TARGET/ (ignored by git), so the next campaign starts where this stopped.
# Runs niced, one process per target: the machine stays usable meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${1:-10}
[[ $minutes =~ ^[1-9][0-9]*$ ]] || {
  echo "usage: fuzz/run.sh [MINUTES] [TARGET...]" >&2
  exit 2
}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(request config proxy_protocol fastcgi)

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: no nightly toolchain (rustup toolchain install nightly): libFuzzer needs it;" \
    "the targets' checks still run on stable in cargo test --test fuzz_replay" >&2
  exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: cargo-fuzz is missing (cargo install cargo-fuzz --locked)" >&2
  exit 1
fi

# Each target's libFuzzer options besides time and corpus.
declare -A options=(
  # One input is a TCP round trip through pinlb; -timeout only fires on a real hang (the
  # harness's own limit is 5 s), and ASan's RSS grows to about 600 MB.
  [request]="-dict=fuzz/request.dict -max_len=4096 -timeout=10 -rss_limit_mb=4096"
  [config]="-dict=fuzz/config.dict -max_len=4096"
  # A v2 header's largest frame (V2_MAX) and a little more.
  [proxy_protocol]="-max_len=2100"
  [fastcgi]="-max_len=4096"
)

# cargo-fuzz's default build: release with debug assertions and overflow checks, under
# AddressSanitizer (`-O` would turn the assertions off).
for t in "${targets[@]}"; do
  [[ -n ${options[$t]+x} ]] || {
    echo "fuzz/run.sh: no target $t (request, config, proxy_protocol, fastcgi)" >&2
    exit 2
  }
  nice -n 19 cargo +nightly fuzz build "$t"
done

mkdir -p fuzz/logs
rows=()
found=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
  log=fuzz/logs/$t.log
  secs=$((minutes * 60))
  before=$(find "fuzz/artifacts/$t" -type f | sort)
  echo "fuzz/run.sh: $t for $minutes min (log: $log)" >&2
  status=0
  # -max_total_time ends it; `timeout` only bounds a process that would not stop.
  # shellcheck disable=SC2086 # the options are words on purpose
  timeout --kill-after=30 $((secs + 300)) nice -n 19 cargo +nightly fuzz run "$t" \
    "fuzz/corpus/$t" "fuzz/seeds/$t" -- ${options[$t]} -max_total_time=$secs \
    -print_final_stats=1 >"$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # libFuzzer's status lines: `#N  KIND cov: C ft: F corp: K/SIZE ...`; the last one is where
  # the run ended.
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  if [[ -z $execs ]]; then
    execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
  fi
  findings=()
  while read -r f; do
    [[ -n $f ]] || continue
    mkdir -p "fuzz/regressions/$t"
    cp "$f" "fuzz/regressions/$t/"
    findings+=("fuzz/regressions/$t/$(basename "$f")")
  done < <(comm -13 <(echo "$before") <(find "fuzz/artifacts/$t" -type f | sort))
  if ((${#findings[@]})); then
    found=1
    verdict="${#findings[@]}: ${findings[*]}"
  elif ((status != 0)); then
    found=1
    verdict="exit status $status without an artifact (see $log)"
  else
    verdict=none
  fi
  row="| \`$t\` | $minutes | ${execs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | $verdict |"
  echo "$row"
  rows+=("$row")
done

table=$(
  echo "$(date -u +%F), $(nproc) cores, $(cargo +nightly --version | cut -d' ' -f2), cargo-fuzz $(cargo fuzz --version | cut -d' ' -f2), AddressSanitizer, commit $(git rev-parse --short HEAD), \`fuzz/run.sh $minutes ${targets[*]}\`:"
  echo
  echo "| target | minutes | executions | exec/s | coverage (edges) | features | corpus | findings |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
)
echo
echo "$table"
# The README keeps the last campaign between its two markers.
readme=fuzz/README.md
start='<!-- run.sh: last campaign -->'
grep -qF "$start" "$readme" || {
  echo "fuzz/run.sh: $readme has no $start section to record the campaign in" >&2
  exit 1
}
TABLE=$table awk -v start="$start" -v end='<!-- run.sh: end -->' '
  $0 == start { print; print ENVIRON["TABLE"]; skip = 1; next }
  $0 == end { skip = 0 }
  !skip
' "$readme" >"$readme.new"
mv "$readme.new" "$readme"
exit $found
