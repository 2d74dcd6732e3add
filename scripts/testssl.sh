#!/usr/bin/env bash
# scripts/testssl.sh - Debian's testssl.sh against a pinlb TLS listener with the default TLS
# settings; fails when it rates any finding HIGH or CRITICAL.
#
# A throwaway CA signs an ECDSA P-256 certificate for 127.0.0.1 and localhost (90 days), passed
# to testssl.sh with --add-ca so that the chain of trust is judged as it would be for a real CA.
# pinlb runs on loopback in front of one `pinlb backend`; nothing leaves the machine
# (--nodns none, an IP address as the target).
#
# Usage: bash scripts/testssl.sh [PINLB_BINARY]   (default target/release/pinlb)
#   KEY=rsa   an RSA 2048 certificate instead of ECDSA P-256
# Needs: testssl.sh, openssl, curl (apt-get install -y testssl.sh).
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
PINLB=${1:-$ROOT/target/release/pinlb}
KEY=${KEY:-ec}
PORT=${PORT:-18443}
BACKEND_PORT=${BACKEND_PORT:-18444}
WORK=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

command -v testssl >/dev/null || command -v testssl.sh >/dev/null || {
    echo "testssl.sh is not installed (apt-get install -y testssl.sh)" >&2
    exit 2
}
TESTSSL=$(command -v testssl || command -v testssl.sh)

cd "$WORK"
case $KEY in
    ec) newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256) ;;
    rsa) newkey=(-newkey rsa:2048) ;;
    *) echo "KEY must be ec or rsa" >&2; exit 2 ;;
esac
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 90 \
    -subj "/CN=pinlb test CA" -keyout ca.key -out ca.pem 2>/dev/null
openssl req -new "${newkey[@]}" -nodes -subj "/CN=localhost" -keyout key.pem -out leaf.csr 2>/dev/null
# A CRL location, as every public CA puts in its certificates: testssl.sh rates a certificate
# without one HIGH, which says nothing of pinlb (nothing fetches it: no phone-out).
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\ncrlDistributionPoints=URI:http://127.0.0.1:1/ca.crl\n' >ext.cnf
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 90 \
    -extfile ext.cnf -out cert.pem 2>/dev/null

core=$(taskset -pc $$ | awk -F': ' '{print $2}' | cut -d, -f1 | cut -d- -f1)
"$PINLB" backend --cpus "$core" --listen "127.0.0.1:$BACKEND_PORT" 2>backend.log &
PIDS+=($!)
cat >pinlb.toml <<EOF
[runtime]
cpus = [$core]
[[listener]]
address = "127.0.0.1:$PORT"
upstream = "app"
[listener.tls]
cert = "$WORK/cert.pem"
key = "$WORK/key.pem"
[upstream.app]
backends = [{ address = "127.0.0.1:$BACKEND_PORT" }]
EOF
RUST_LOG=warn "$PINLB" serve -c pinlb.toml 2>pinlb.log &
PIDS+=($!)
for _ in $(seq 100); do
    curl -s -o /dev/null --cacert ca.pem "https://127.0.0.1:$PORT/" && break
    sleep 0.2
done
curl -sf -o /dev/null --cacert ca.pem "https://127.0.0.1:$PORT/" || {
    echo "pinlb does not answer over TLS on $PORT" >&2
    cat pinlb.log >&2
    exit 1
}

"$TESTSSL" --quiet --color 0 --warnings off --nodns none --add-ca "$WORK/ca.pem" \
    --jsonfile "$WORK/out.json" "127.0.0.1:$PORT" >testssl.log 2>&1 || true
[[ -s out.json ]] || { cat testssl.log >&2; echo "testssl.sh wrote no findings" >&2; exit 1; }

python3 - "$WORK/out.json" <<'PY'
import json, sys
findings = json.load(open(sys.argv[1]))
counts = {}
for f in findings:
    counts[f.get("severity", "?")] = counts.get(f.get("severity", "?"), 0) + 1
print("findings by severity:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
bad = [f for f in findings if f.get("severity") in ("HIGH", "CRITICAL")]
for f in findings:
    if f.get("severity") in ("MEDIUM", "HIGH", "CRITICAL"):
        print(f"  {f['severity']:8} {f['id']}: {f['finding']}")
sys.exit(1 if bad else 0)
PY
