#!/usr/bin/env bash
# Compares holdfast builds on this machine: for each round, each build in turn gets a fresh local 3-node
# cluster (separate processes on 127.0.0.1, fsync on) and the same `holdfast bench` workloads. On a small
# virtual machine two fresh clusters of one build differ by up to ±15 %, so a change is judged over
# alternating runs, and by the nodes' CPU time (and the leader's own) and context switches per operation,
# which are steadier than rates.
#
#   cluster/compare.sh old=/tmp/holdfast-old new=target/release/holdfast
#   ROUNDS=3 DURATION=8s WORKLOADS="uncontended-1 contended-8" cluster/compare.sh a=BIN b=BIN
#
# Settings (environment):
#   ROUNDS=2                how many times every build runs, alternating
#   DURATION=6s             each workload's duration
#   WORKLOADS="uncontended-1 uncontended-64 contended-8"   uncontended-N, contended-N, reads-N, busy-N or
#                           sessions-N (N clients; reads: `get`s of a held lock, busy: one-shot acquires of
#                           it; sessions: N sessions with 2 s leases, each holding a lock, its rate the
#                           heartbeats acknowledged a second, its errors the locks lost and sessions
#                           expired); with `@follower` (reads-64@follower) the load goes to a follower
#                           alone, with `@leader` to the leader alone (else it is spread over the three
#                           nodes); with `@http` (uncontended-64@http, contended-8@follower@http) through
#                           the HTTP API, keep-alive HTTP/1.1, instead of gRPC
#   GENERATOR=              the binary that runs `holdfast bench` (default: the first build), the same
#                           for every build so that only the nodes differ; `each`: every build runs its
#                           own load (for a change to the client as well as the nodes)
#   WORKER_THREADS=         each node's worker threads, as cluster/bench.sh gives them (nproc / 3, at
#                           least 1); set through TOKIO_WORKER_THREADS, which builds older than the
#                           --worker-threads flag read too; `default`: one per core, as before
#   SERVER_ARGS=            more flags for every node
#   COMPARE_BASE_PORT=29070 node i's client port is this + 100*(i-1), its peer port one more
#   COMPARE_DIR=target/compare  the clusters' data (COMPARE_DIR/run) and results (COMPARE_DIR/results-TIME)
#
# Keep a copy of the build before a change (cp target/release/holdfast /tmp/holdfast-old), and do not
# rebuild a binary while it is being compared: the build would replace it under the running nodes. Prints one line per run and a summary per build and workload; every run's JSON line
# goes to results.jsonl.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
COMPARE_DIR=${COMPARE_DIR:-$TARGET_DIR/compare}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-6s}
WORKLOADS=${WORKLOADS:-uncontended-1 uncontended-64 contended-8}
BASE_PORT=${COMPARE_BASE_PORT:-29070}
CLUSTER=$ROOT/cluster/cluster.sh
RUN_DIR=$COMPARE_DIR/run
RESULTS=$COMPARE_DIR/results-$(date -u +%Y%m%dT%H%M%SZ)

die() {
    echo "compare.sh: $*" >&2
    exit 1
}

(($# >= 1)) || die "usage: $(basename "$0") LABEL=BINARY [LABEL=BINARY ...]"
labels=()
declare -A binaries
for arg in "$@"; do
    [[ $arg == *=* ]] || die "'$arg' is not LABEL=BINARY"
    label=${arg%%=*} bin=${arg#*=}
    [[ -x $bin ]] || die "$bin is not an executable"
    [[ -z ${binaries[$label]:-} ]] || die "label '$label' is given twice"
    labels+=("$label")
    binaries[$label]=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
done
GENERATOR=${GENERATOR:-${binaries[${labels[0]}]}}
[[ $GENERATOR == each || -x $GENERATOR ]] || die "GENERATOR=$GENERATOR is not an executable (nor 'each')"
for tool in curl jq; do
    command -v "$tool" >/dev/null || die "$tool is needed"
done
for workload in $WORKLOADS; do
    [[ $workload =~ ^(uncontended|contended|reads|busy|sessions)-[0-9]+(@follower|@leader|@http)*$ ]] ||
        die "unknown workload '$workload'"
    [[ $workload != *@http* || $workload =~ ^(uncontended|contended)- ]] ||
        die "'$workload': only uncontended and contended run over HTTP"
done

export HOLDFAST_RUN_DIR=$RUN_DIR HOLDFAST_BASE_PORT=$BASE_PORT HOLDFAST_SERVER_ARGS=${SERVER_ARGS:-}
WORKER_THREADS=${WORKER_THREADS:-$(($(nproc) / 3 > 0 ? $(nproc) / 3 : 1))}
if [[ $WORKER_THREADS != default ]]; then
    [[ $WORKER_THREADS =~ ^[1-9][0-9]*$ ]] || die "WORKER_THREADS=$WORKER_THREADS is not a positive number (nor 'default')"
    export TOKIO_WORKER_THREADS=$WORKER_THREADS
fi
ENDPOINTS=$(for i in 1 2 3; do printf '127.0.0.1:%s,' $((BASE_PORT + 100 * (i - 1))); done)
ENDPOINTS=${ENDPOINTS%,}

# The id of the leader.
leader_id() {
    local leader
    leader=$(curl -sf "127.0.0.1:$BASE_PORT/v1/cluster" | jq -r '.leader // empty')
    [[ -n $leader ]] || die "no leader"
    echo "$leader"
}

# The client address of the leader.
leader_endpoint() {
    echo "127.0.0.1:$((BASE_PORT + 100 * ($(leader_id) - 1)))"
}

# The client address of a node that does not lead (the cluster has just elected its leader).
follower_endpoint() {
    local leader id
    leader=$(leader_id)
    for id in 1 2 3; do
        if [[ $id != "$leader" ]]; then
            echo "127.0.0.1:$((BASE_PORT + 100 * (id - 1)))"
            return
        fi
    done
}
mkdir -p "$RESULTS"

cleanup() {
    "$CLUSTER" clean >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# CPU time (clock ticks) and context switches (voluntary and not) of every thread of the three nodes.
node_pids() { cat "$RUN_DIR"/node{1,2,3}/pid; }
cpu_ticks() {
    local total=0 pid
    for pid in $(node_pids); do
        total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
    done
    echo "$total"
}
# CPU time (clock ticks) of process $1.
cpu_ticks_of() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# Each node thread's switches so far, one "TID COUNT" line each.
switches_by_thread() {
    local pid status
    for pid in $(node_pids); do
        for status in /proc/"$pid"/task/*/status; do
            awk -v tid="${status%/status}" '/ctxt_switches/ { s += $2 } END { sub(".*/", "", tid); print tid, s }' \
                "$status" 2>/dev/null || true
        done
    done
}
# The switches between two snapshots of switches_by_thread (files): a thread's count since the first, or
# since it was born. A thread that ended in between (tokio's blocking pool lets idle ones go) is left out,
# as its count is gone: the sum may miss a few, but never goes below zero.
switches_between() {
    awk 'NR == FNR { before[$1] = $2; next } { total += $2 - ($1 in before ? before[$1] : 0) } END { print total + 0 }' "$1" "$2"
}

ticks_per_s=$(getconf CLK_TCK)
for round in $(seq 1 "$ROUNDS"); do
    for label in "${labels[@]}"; do
        cleanup
        HOLDFAST_BIN=${binaries[$label]} "$CLUSTER" start 3 >"$RESULTS/cluster.log" 2>&1 ||
            die "the cluster of '$label' did not start: $(tail -3 "$RESULTS/cluster.log")"
        for workload in $WORKLOADS; do
            endpoints=$ENDPOINTS
            [[ $workload != *@follower* ]] || endpoints=$(follower_endpoint)
            [[ $workload != *@leader* ]] || endpoints=$(leader_endpoint)
            base=${workload%%@*}
            kind=${base%-*} clients=${base##*-}
            args=("$kind" --clients "$clients")
            [[ $workload != *@http* ]] || args+=(--http)
            case $kind in
            busy) args=(reads --busy --clients "$clients") ;;
            sessions) args=(sessions --sessions "$clients" --lease 2s --pids "$(node_pids | paste -sd,)") ;;
            esac
            ticks_before=$(cpu_ticks)
            # The leader's own share: with a node per host its CPU bounds the rate, whichever node the
            # clients talk to.
            leader_pid=$(cat "$RUN_DIR/node$(leader_id)/pid")
            leader_ticks_before=$(cpu_ticks_of "$leader_pid")
            switches_by_thread >"$RESULTS/switches-before"
            generator=$GENERATOR
            [[ $generator != each ]] || generator=${binaries[$label]}
            out=$("$generator" bench --endpoints "$endpoints" --json "${args[@]}" \
                --duration "$DURATION" 2>>"$RESULTS/bench.log") || out='{"ops": 0, "failed": true}'
            # A sessions run's operations are the heartbeats its sessions had acknowledged.
            out=$(echo "$out" | jq -c 'if .kind == "sessions" then . + {ops: (.heartbeats_acknowledged // 0),
                rate_per_s: ((.heartbeats_acknowledged // 0) / (.window_seconds // 1)),
                p50_ms: .heartbeat_p50_ms_at_most, p99_ms: .heartbeat_p99_ms_at_most,
                errors: ((.spurious_lost // 0) + (.expirations // 0))} else . end')
            ticks=$(($(cpu_ticks) - ticks_before))
            leader_ticks=$(($(cpu_ticks_of "$leader_pid") - leader_ticks_before))
            switches_by_thread >"$RESULTS/switches-after"
            switches=$(switches_between "$RESULTS/switches-before" "$RESULTS/switches-after")
            echo "$out" | jq -c --arg build "$label" --arg workload "$workload" --argjson round "$round" \
                --argjson ticks "$ticks" --argjson leader_ticks "$leader_ticks" --argjson hz "$ticks_per_s" \
                --argjson switches "$switches" \
                '{build: $build, workload: $workload, round: $round, rate: .rate_per_s, p50_ms: .p50_ms,
                  p99_ms: .p99_ms, errors: .errors, commands_per_entry: .commands_per_entry,
                  cpu_us_per_op: (if .ops > 0 then $ticks * 1e6 / $hz / .ops else null end),
                  leader_cpu_us_per_op: (if .ops > 0 then $leader_ticks * 1e6 / $hz / .ops else null end),
                  switches_per_op: (if .ops > 0 then $switches / .ops else null end),
                  generator_us_per_op: .bench_cpu_us_per_op}' |
                tee -a "$RESULTS/results.jsonl" |
                jq -r '"\(.build) \(.workload) round \(.round): \(.rate // 0 | floor)/s, p50 \(.p50_ms) ms, p99 \(.p99_ms) ms, errors \(.errors), nodes \(.cpu_us_per_op // 0 | floor) us CPU (leader \(.leader_cpu_us_per_op // 0 | floor)) and \(.switches_per_op // 0 | . * 10 | floor / 10) switches per op\(if .generator_us_per_op then ", generator \(.generator_us_per_op | floor) us CPU per op" else "" end)"'
        done
    done
done

echo "== per build and workload, over $ROUNDS rounds (min-max)"
jq -rs 'group_by(.workload, .build)[] |
    "\(.[0].workload) \(.[0].build): \(map(.rate // 0 | floor) | "\(min)-\(max)")/s, p50 \(map(.p50_ms) | "\(min)-\(max)") ms, nodes \(map(.cpu_us_per_op // 0 | floor) | "\(min)-\(max)") us CPU (leader \(map(.leader_cpu_us_per_op // 0 | floor) | "\(min)-\(max)")) and \(map(.switches_per_op // 0 | . * 10 | floor / 10) | "\(min)-\(max)") switches per op"' \
    "$RESULTS/results.jsonl"
echo "== results in $RESULTS"
