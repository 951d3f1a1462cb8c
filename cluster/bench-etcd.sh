#!/usr/bin/env bash
# etcd's side of the comparison: a fresh 3-member etcd on 127.0.0.1 for each round (Debian's etcd-server,
# installed with apt-get when missing; fsync on, etcd's default), and the loops of `holdfast bench
# uncontended|contended` through etcd's v3 lock API (cluster/etcd-driver, built here; it needs protoc and
# protobuf's own protos, installed with apt-get when missing), the clients spread evenly over the three
# members. Prints a line per
# run and a summary per workload in the form of cluster/compare.sh's, so that the two can be read side by
# side from one host; every run's JSON line goes to results.jsonl.
#
#   cluster/bench-etcd.sh
#   ROUNDS=3 DURATION=8s WORKLOADS="uncontended-1 contended-8" cluster/bench-etcd.sh
#
# Settings (environment):
#   ROUNDS=2                how many fresh clusters, one after the other
#   DURATION=6s             each workload's duration (whole seconds)
#   WORKLOADS="uncontended-1 uncontended-64 contended-8"   uncontended-N or contended-N (N clients)
#   ETCD_BASE_PORT=23790    member i's client port is this + 10*(i-1), its peer port one more
#   ETCD_DIR=target/etcd    the members' data (ETCD_DIR/run) and results (ETCD_DIR/results-TIME)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
ETCD_DIR=${ETCD_DIR:-$TARGET_DIR/etcd}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-6s}
WORKLOADS=${WORKLOADS:-uncontended-1 uncontended-64 contended-8}
BASE_PORT=${ETCD_BASE_PORT:-23790}
RUN_DIR=$ETCD_DIR/run
RESULTS=$ETCD_DIR/results-$(date -u +%Y%m%dT%H%M%SZ)

die() {
    echo "bench-etcd.sh: $*" >&2
    exit 1
}

seconds=${DURATION%s}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "DURATION=$DURATION: whole seconds, like 6s"
for workload in $WORKLOADS; do
    [[ $workload =~ ^(uncontended|contended)-[0-9]+$ ]] || die "unknown workload '$workload'"
done
for tool in curl jq; do
    command -v "$tool" >/dev/null || die "$tool is needed"
done

# shellcheck source=cluster/etcd-setup.sh
source "$ROOT/cluster/etcd-setup.sh"
etcd_setup
VERSION=$ETCD_VERSION

client_port() { echo $((BASE_PORT + 10 * ($1 - 1))); }
peer_port() { echo $((BASE_PORT + 10 * ($1 - 1) + 1)); }
ENDPOINTS=$(for i in 1 2 3; do printf 'http://127.0.0.1:%s,' "$(client_port "$i")"; done)
ENDPOINTS=${ENDPOINTS%,}
CLUSTER=$(for i in 1 2 3; do printf 'm%s=http://127.0.0.1:%s,' "$i" "$(peer_port "$i")"; done)
CLUSTER=${CLUSTER%,}

pids=()
stop() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    pids=()
    rm -rf "$RUN_DIR"
}
trap stop EXIT
trap 'exit 130' INT TERM

start() {
    mkdir -p "$RUN_DIR"
    local i
    for i in 1 2 3; do
        etcd --name "m$i" --data-dir "$RUN_DIR/m$i" \
            --listen-client-urls "http://127.0.0.1:$(client_port "$i")" \
            --advertise-client-urls "http://127.0.0.1:$(client_port "$i")" \
            --listen-peer-urls "http://127.0.0.1:$(peer_port "$i")" \
            --initial-advertise-peer-urls "http://127.0.0.1:$(peer_port "$i")" \
            --initial-cluster "$CLUSTER" --initial-cluster-state new --initial-cluster-token holdfast-bench \
            >"$RUN_DIR/m$i.log" 2>&1 &
        pids+=($!)
    done
    # Healthy once a member answers with a leader elected; bounded.
    local tries
    for tries in $(seq 1 100); do
        if curl -sf "http://127.0.0.1:$(client_port 1)/health" | jq -e '.health == "true"' >/dev/null 2>&1; then
            return
        fi
        sleep 0.1
    done
    die "etcd did not become healthy: $(tail -3 "$RUN_DIR/m1.log")"
}

cpu_ticks() {
    local total=0 pid
    for pid in "${pids[@]}"; do
        total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo "$total"
}

mkdir -p "$RESULTS"
ticks_per_s=$(getconf CLK_TCK)
for round in $(seq 1 "$ROUNDS"); do
    stop
    start
    for workload in $WORKLOADS; do
        kind=${workload%-*} clients=${workload##*-}
        ticks_before=$(cpu_ticks)
        out=$("$DRIVER" "$ENDPOINTS" "$kind" "$clients" "$seconds" 2>>"$RESULTS/driver.log") ||
            out='{"ops": 0, "failed": true}'
        ticks=$(($(cpu_ticks) - ticks_before))
        echo "$out" | jq -c --arg workload "$workload" --argjson round "$round" --argjson ticks "$ticks" \
            --argjson hz "$ticks_per_s" --arg version "$VERSION" \
            '{build: "etcd \($version)", workload: $workload, round: $round, rate: .rate_per_s, p50_ms: .p50_ms,
              p99_ms: .p99_ms, errors: .errors,
              cpu_us_per_op: (if .ops > 0 then $ticks * 1e6 / $hz / .ops else null end),
              generator_us_per_op: .bench_cpu_us_per_op}' |
            tee -a "$RESULTS/results.jsonl" |
            jq -r '"\(.build) \(.workload) round \(.round): \(.rate // 0 | floor)/s, p50 \(.p50_ms) ms, p99 \(.p99_ms) ms, errors \(.errors), nodes \(.cpu_us_per_op // 0 | floor) us CPU per op, generator \(.generator_us_per_op // 0 | floor) us CPU per op"'
    done
done

echo "== per workload, over $ROUNDS rounds (min-max)"
jq -rs 'group_by(.workload)[] |
    "\(.[0].workload) \(.[0].build): \(map(.rate // 0 | floor) | "\(min)-\(max)")/s, p50 \(map(.p50_ms) | "\(min)-\(max)") ms, nodes \(map(.cpu_us_per_op // 0 | floor) | "\(min)-\(max)") us CPU per op"' \
    "$RESULTS/results.jsonl"
echo "== results in $RESULTS"
