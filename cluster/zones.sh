#!/usr/bin/env bash
# Three zones on one host: a 3-node cluster whose nodes each sit in a zone of their own, with a fixed delay
# between zones (ZONE_DELAY each way, 1 ms by default) and none inside one, and clients in every zone talking
# to their zone's node. The same for holdfast (HTTP, and gRPC for one client) and, when it can be installed,
# for a 3-member etcd through its v3 lock API (cluster/etcd-driver). Prints a line per run and a table in
# Markdown; every run's JSON line goes to results.jsonl.
#
#   cluster/zones.sh
#   ZONE_DELAY=5ms DURATION=8s SYSTEMS=holdfast cluster/zones.sh
#
# How the delay is made: this machine's kernel has no netem, so each node's peer port is reached through
# cluster/delay-proxy, a TCP proxy that holds every byte ZONE_DELAY in each direction, and the members
# know each other by the proxies' addresses; a node's own clients reach it directly. Every message between
# two nodes so crosses one proxy: a round trip between zones takes 2 x ZONE_DELAY.
#
# Settings (environment):
#   ZONE_DELAY=1ms          one way, between zones (Nms or Nus)
#   DURATION=6s             each workload (whole seconds)
#   SYSTEMS="holdfast etcd" which systems; etcd's rows need Debian's etcd-server (installed when missing)
#   FAILOVER_AFTER=4s       how long the failover probe runs after the leader is killed
#   ZONES_BASE_PORT=28070   holdfast node z: client port this + 100*(z-1), peer +1, its proxy +2;
#                           etcd member z: this + 1000 + 100*(z-1), peer +1, its proxy +2
#   ZONES_DIR=target/zones  data and logs (ZONES_DIR/run), results (ZONES_DIR/results-TIME)
#   SKIP_BUILD=1            use target/release/holdfast as it is
#   KEEP=1                  keep the data and logs of the last system run (deleted by default)
#
# The workloads, for each system: one client per zone in turn, talking to its zone's node (acquire and
# release a lock of its own, in a loop); 64 clients spread over the zones; 8 clients spread over the zones
# on one lock (holdfast: HTTP `wait=`; etcd: its lock queue), hand-overs per second; and the leader killed
# (kill -9) under one client that locks and unlocks through every node, its longest gap between two
# cycles (etcd's client gives each call 1 s before it tries again: etcd answers a proposal lost with its
# leader only after its 7 s request timeout).
#
# Every process it starts is stopped when it ends, also on failure or Ctrl-C.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
ZONES_DIR=${ZONES_DIR:-$TARGET_DIR/zones}
ZONE_DELAY=${ZONE_DELAY:-1ms}
DURATION=${DURATION:-6s}
SYSTEMS=${SYSTEMS:-holdfast etcd}
FAILOVER_AFTER=${FAILOVER_AFTER:-4s}
BASE_PORT=${ZONES_BASE_PORT:-28070}
RUN_DIR=$ZONES_DIR/run
RESULTS=$ZONES_DIR/results-$(date -u +%Y%m%dT%H%M%SZ)
BIN=$TARGET_DIR/release/holdfast

die() {
    echo "zones.sh: $*" >&2
    exit 1
}

case $ZONE_DELAY in
    *us) delay_us=${ZONE_DELAY%us} ;;
    *ms) delay_us=$((${ZONE_DELAY%ms} * 1000)) ;;
    *) die "ZONE_DELAY=$ZONE_DELAY: like 1ms or 500us" ;;
esac
[[ $delay_us =~ ^[0-9]+$ ]] || die "ZONE_DELAY=$ZONE_DELAY: like 1ms or 500us"
seconds=${DURATION%s}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || die "DURATION=$DURATION: whole seconds, like 6s"
after_s=${FAILOVER_AFTER%s}
[[ $after_s =~ ^[1-9][0-9]*$ ]] || die "FAILOVER_AFTER=$FAILOVER_AFTER: whole seconds, like 4s"
for tool in curl jq; do
    command -v "$tool" >/dev/null || die "$tool is needed"
done

if [[ -z ${SKIP_BUILD:-} ]]; then
    echo "building holdfast (release)"
    (cd "$ROOT" && cargo build -q --release --bin holdfast)
fi
echo "building the delay proxy (cluster/delay-proxy)"
CARGO_TARGET_DIR=$TARGET_DIR/delay-proxy cargo build -q --release --manifest-path "$ROOT/cluster/delay-proxy/Cargo.toml"
PROXY=$TARGET_DIR/delay-proxy/release/holdfast-delay-proxy
if [[ " $SYSTEMS " == *" etcd "* ]]; then
    # shellcheck source=cluster/etcd-setup.sh
    source "$ROOT/cluster/etcd-setup.sh"
    etcd_setup
fi

# Ports of zone z's node: $1 is the system's base.
client_port() { echo $(($1 + 100 * ($2 - 1))); }
peer_port() { echo $(($1 + 100 * ($2 - 1) + 1)); }
proxy_port() { echo $(($1 + 100 * ($2 - 1) + 2)); }
HOLDFAST_BASE=$BASE_PORT
ETCD_BASE=$((BASE_PORT + 1000))

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
    [[ -n ${KEEP:-} ]] || rm -rf "$RUN_DIR"
}
trap stop EXIT
trap 'exit 130' INT TERM

# One proxy process for the three peer ports of the system whose ports start at $1.
start_proxies() {
    local base=$1 z links=()
    for z in 1 2 3; do
        links+=("127.0.0.1:$(proxy_port "$base" "$z")=127.0.0.1:$(peer_port "$base" "$z")")
    done
    "$PROXY" "$delay_us" "${links[@]}" >"$RUN_DIR/proxy-$base.log" 2>&1 &
    pids+=($!)
}

# Waits (bounded) until `curl -sf URL` answers and, given a FILTER, `jq -e FILTER` holds of the answer.
wait_until() {
    local url=$1 filter=$2 what=$3 tries answer
    for tries in $(seq 1 200); do
        if answer=$(curl -sf --max-time 1 "$url") && { [[ -z $filter ]] || jq -e "$filter" >/dev/null 2>&1 <<<"$answer"; }; then
            return
        fi
        sleep 0.1
    done
    die "$what: not after 20 s"
}

start_holdfast() {
    local z members=()
    for z in 1 2 3; do
        members+=("$z=127.0.0.1:$(proxy_port "$HOLDFAST_BASE" "$z")")
    done
    start_proxies "$HOLDFAST_BASE"
    for z in 1 2 3; do
        mkdir -p "$RUN_DIR/node$z"
        NO_COLOR=1 "$BIN" server --id "$z" --members "$(IFS=,; echo "${members[*]}")" \
            --client-addr "127.0.0.1:$(client_port "$HOLDFAST_BASE" "$z")" \
            --peer-addr "127.0.0.1:$(peer_port "$HOLDFAST_BASE" "$z")" \
            --data-dir "$RUN_DIR/node$z/data" --worker-threads 1 \
            >"$RUN_DIR/node$z/log" 2>&1 &
        pids+=($!)
        echo $! >"$RUN_DIR/node$z/pid"
    done
    for z in 1 2 3; do
        wait_until "http://127.0.0.1:$(client_port "$HOLDFAST_BASE" "$z")/readyz" '' "holdfast node $z ready"
    done
}

start_etcd() {
    local z cluster=()
    for z in 1 2 3; do
        cluster+=("m$z=http://127.0.0.1:$(proxy_port "$ETCD_BASE" "$z")")
    done
    start_proxies "$ETCD_BASE"
    for z in 1 2 3; do
        etcd --name "m$z" --data-dir "$RUN_DIR/m$z" \
            --listen-client-urls "http://127.0.0.1:$(client_port "$ETCD_BASE" "$z")" \
            --advertise-client-urls "http://127.0.0.1:$(client_port "$ETCD_BASE" "$z")" \
            --listen-peer-urls "http://127.0.0.1:$(peer_port "$ETCD_BASE" "$z")" \
            --initial-advertise-peer-urls "http://127.0.0.1:$(proxy_port "$ETCD_BASE" "$z")" \
            --initial-cluster "$(IFS=,; echo "${cluster[*]}")" --initial-cluster-state new \
            --initial-cluster-token holdfast-zones >"$RUN_DIR/m$z.log" 2>&1 &
        pids+=($!)
        echo $! >"$RUN_DIR/m$z.pid"
    done
    wait_until "http://127.0.0.1:$(client_port "$ETCD_BASE" 1)/health" '.health == "true"' "etcd healthy"
}

holdfast_leader() {
    curl -sf "http://127.0.0.1:$(client_port "$HOLDFAST_BASE" 1)/v1/cluster" | jq -r '.leader'
}

# etcd's leader, as the zone of its member: member z's status names its own id and the leader's.
etcd_leader() {
    local z status
    for z in 1 2 3; do
        status=$(curl -sf -X POST -d '{}' "http://127.0.0.1:$(client_port "$ETCD_BASE" "$z")/v3/maintenance/status")
        if [[ $(jq -r '.header.member_id' <<<"$status") == $(jq -r '.leader' <<<"$status") ]]; then
            echo "$z"
            return
        fi
    done
    die "no etcd member says it leads"
}

endpoints() {
    local base=$1 z list=()
    shift
    for z in "$@"; do
        list+=("http://127.0.0.1:$(client_port "$base" "$z")")
    done
    (IFS=,; echo "${list[*]}")
}

# Records one run: $1 system, $2 workload, $3 zone ("all" for spread clients), $4 the leader's zone, then
# the run's JSON on stdin.
record() {
    jq -c --arg system "$1" --arg workload "$2" --arg zone "$3" --arg leader "$4" --arg delay "$ZONE_DELAY" \
        '{system: $system, workload: $workload, zone: $zone, leader_zone: $leader, zone_delay: $delay,
          rate: (.rate_per_s // .rate // .cycles_per_s), p50_ms: (.p50_ms // .latency_p50_ms),
          p99_ms: (.p99_ms // .latency_p99_ms), errors: .errors, longest_gap_ms: .longest_gap_ms, raw: .}' |
        tee -a "$RESULTS/results.jsonl" |
        jq -r '"\(.system) \(.workload) zone \(.zone) (leader \(.leader_zone)): \(.rate // 0 | floor)/s, p50 \(.p50_ms) ms, p99 \(.p99_ms) ms, errors \(.errors), longest gap \(.longest_gap_ms) ms"'
}

hf() {
    "$BIN" bench --endpoints "$1" --json "${@:2}" 2>>"$RESULTS/holdfast-bench.log" || echo '{"failed": true}'
}

run_holdfast() {
    start_holdfast
    local leader z all
    leader=$(holdfast_leader)
    all=$(endpoints "$HOLDFAST_BASE" 1 2 3)
    for z in 1 2 3; do
        hf "$(endpoints "$HOLDFAST_BASE" "$z")" uncontended --clients 1 --duration "$DURATION" --http |
            record holdfast "1 client, HTTP" "$z" "$leader"
        hf "$(endpoints "$HOLDFAST_BASE" "$z")" uncontended --clients 1 --duration "$DURATION" |
            record holdfast "1 client, gRPC" "$z" "$leader"
    done
    hf "$all" uncontended --clients 64 --duration "$DURATION" --http | record holdfast "64 clients, HTTP" all "$leader"
    hf "$all" contended --clients 8 --duration "$DURATION" --http | record holdfast "8 on one lock, HTTP" all "$leader"
    hf "$all" failover --kill "kill -9 \$(cat $RUN_DIR/node{id}/pid)" --warmup 2s --after "$FAILOVER_AFTER" |
        record holdfast "leader killed" all "$leader"
    stop
}

run_etcd() {
    mkdir -p "$RUN_DIR"
    start_etcd
    local leader z all
    leader=$(etcd_leader)
    all=$(endpoints "$ETCD_BASE" 1 2 3)
    for z in 1 2 3; do
        "$DRIVER" "$(endpoints "$ETCD_BASE" "$z")" uncontended 1 "$seconds" 2>>"$RESULTS/driver.log" |
            record "etcd $ETCD_VERSION" "1 client" "$z" "$leader"
    done
    "$DRIVER" "$all" uncontended 64 "$seconds" 2>>"$RESULTS/driver.log" |
        record "etcd $ETCD_VERSION" "64 clients" all "$leader"
    "$DRIVER" "$all" contended 8 "$seconds" 2>>"$RESULTS/driver.log" |
        record "etcd $ETCD_VERSION" "8 on one lock" all "$leader"
    # The probe runs 2 s, then the leader is killed, then it runs FAILOVER_AFTER more.
    "$DRIVER" "$all" probe 1 $((2 + after_s)) >"$RESULTS/etcd-probe.json" 2>>"$RESULTS/driver.log" &
    local probe=$!
    sleep 2
    kill -9 "$(cat "$RUN_DIR/m$leader.pid")"
    wait "$probe" || true
    record "etcd $ETCD_VERSION" "leader killed" all "$leader" <"$RESULTS/etcd-probe.json"
    stop
}

mkdir -p "$RESULTS" "$RUN_DIR"
echo "zones: 3, ZONE_DELAY=$ZONE_DELAY each way between zones; results in $RESULTS"
for system in $SYSTEMS; do
    case $system in
        holdfast) run_holdfast ;;
        etcd) run_etcd ;;
        *) die "unknown system '$system'" ;;
    esac
done

echo
echo "| system | workload | zone | rate/s | p50 ms | p99 ms | longest gap ms |"
echo "|---|---|---|---|---|---|---|"
jq -r '"| \(.system) | \(.workload) | \(if .zone == "all" then "all" elif .zone == .leader_zone then "\(.zone) (leader)" else .zone end) | \(if .workload == "leader killed" then "–" else .rate // 0 | floor end) | \(.p50_ms // "–" | if type == "number" then . * 100 | round / 100 else . end) | \(.p99_ms // "–" | if type == "number" then . * 100 | round / 100 else . end) | \(if .workload == "leader killed" then .longest_gap_ms | round else "–" end) |"' \
    "$RESULTS/results.jsonl"
