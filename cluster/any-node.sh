#!/usr/bin/env bash
# Through any node and any interface, beside etcd, judged against their targets: each round runs
# cluster/compare.sh (one fresh local 3-node cluster of this build) on the workloads below, then
# cluster/bench-etcd.sh (one fresh 3-member etcd) on etcd's, one right after the other on this host, so
# that each round's ratios come from one run.
#
#   cluster/any-node.sh                                 # 2 rounds of 5 s per workload, etcd beside
#   ROUNDS=1 ETCD=0 cluster/any-node.sh                 # holdfast alone
#   cluster/any-node.sh --report target/any-node/results-…   # only the report of an earlier run
#
# Settings (environment):
#   ROUNDS=2                how many rounds
#   DURATION=5s             each workload's duration (whole seconds)
#   ETCD=1                  run etcd's side (0: leave it out; a failed install or run leaves it out too)
#   HOLDFAST_BIN=           the build (default target/release/holdfast, built when missing)
#   ANY_NODE_DIR=target/any-node   the results (ANY_NODE_DIR/results-TIME)
#
# holdfast's workloads (cluster/compare.sh's names): one HTTP client through a follower
# (uncontended-1@follower@http); 64 HTTP clients spread over the three nodes (uncontended-64@http) and the
# same on the leader alone (uncontended-64@leader@http); 8 HTTP clients on one lock with `wait=`, spread
# (contended-8@http); 64 gRPC clients (the Rust client's `Calls` stream) on a follower and on the leader
# (uncontended-64@follower, uncontended-64@leader); 8 gRPC sessions on one lock attached to a follower and
# to the leader (contended-8@follower, contended-8@leader); one gRPC client through a follower and through
# the leader (uncontended-1@follower, uncontended-1@leader), for what a follower's hop costs. etcd's:
# uncontended-1, uncontended-64 and contended-8, its clients spread over its members.
#
# It prints each run's line as it goes, then three Markdown tables with a column per round: the rates (and
# p50, and the nodes' and the generator's CPU an operation) of each workload; a row per target, each cell
# the ratio (or p50) and whether it meets the target; and what bounds them on this host, with no goal (the
# leader alone's etcd multiples, and the cores each 64-client workload kept busy). Every run's JSON line,
# with its round and system, goes to results.jsonl.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
ANY_NODE_DIR=${ANY_NODE_DIR:-$TARGET_DIR/any-node}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-5s}
ETCD=${ETCD:-1}
RESULTS=$ANY_NODE_DIR/results-$(date -u +%Y%m%dT%H%M%SZ)
HOLDFAST_WORKLOADS="uncontended-1@follower@http uncontended-64@http uncontended-64@leader@http contended-8@http
    uncontended-64@follower uncontended-64@leader contended-8@follower contended-8@leader uncontended-1@follower
    uncontended-1@leader"
ETCD_WORKLOADS="uncontended-1 uncontended-64 contended-8"

die() {
    echo "any-node.sh: $*" >&2
    exit 1
}

REPORT_ONLY=0
if [[ ${1:-} == --report ]]; then
    [[ -f ${2:-}/results.jsonl ]] || die "--report takes the results directory of an earlier run"
    RESULTS=$2 REPORT_ONLY=1
fi
command -v jq >/dev/null || die "jq is needed"
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS=$ROUNDS is not a positive number"
[[ $ETCD == 0 || $ETCD == 1 ]] || die "ETCD=$ETCD: 0 or 1"
BIN=${HOLDFAST_BIN:-$TARGET_DIR/release/holdfast}
if [[ $REPORT_ONLY == 0 && ! -x $BIN ]]; then
    [[ -z ${HOLDFAST_BIN:-} ]] || die "HOLDFAST_BIN=$HOLDFAST_BIN is not an executable"
    (cd "$ROOT" && cargo build --release --bin holdfast)
fi
mkdir -p "$RESULTS"

# Appends the JSON lines of the one results.jsonl under $1 to ours, each with the round and the system.
collect() {
    local dir=$1 round=$2 system=$3
    jq -c --argjson round "$round" --arg system "$system" '. + {round: $round, system: $system}' \
        "$dir"/results-*/results.jsonl >>"$RESULTS/results.jsonl"
}

[[ $REPORT_ONLY == 1 ]] || for round in $(seq "$ROUNDS"); do
    echo "any-node.sh: round $round, holdfast" >&2
    COMPARE_DIR=$RESULTS/holdfast-$round ROUNDS=1 DURATION=$DURATION WORKLOADS=$HOLDFAST_WORKLOADS \
        "$ROOT/cluster/compare.sh" "holdfast=$BIN" >"$RESULTS/holdfast-$round.log" 2>&1 ||
        die "compare.sh failed: $(tail -3 "$RESULTS/holdfast-$round.log")"
    grep ' round 1:' "$RESULTS/holdfast-$round.log" | sed 's/^/  /' >&2
    collect "$RESULTS/holdfast-$round" "$round" holdfast
    if [[ $ETCD == 1 ]]; then
        echo "any-node.sh: round $round, etcd" >&2
        if ETCD_DIR=$RESULTS/etcd-$round ROUNDS=1 DURATION=$DURATION WORKLOADS=$ETCD_WORKLOADS \
            "$ROOT/cluster/bench-etcd.sh" >"$RESULTS/etcd-$round.log" 2>&1; then
            grep ' round 1:' "$RESULTS/etcd-$round.log" | sed 's/^/  /' >&2
            collect "$RESULTS/etcd-$round" "$round" etcd
        else
            echo "any-node.sh: etcd's side failed, left out: $(tail -2 "$RESULTS/etcd-$round.log")" >&2
            ETCD=0
        fi
    fi
done

# The JSON lines of each round in turn, as $runs, with a workload's line, its rate and a ratio of two rates
# (null where a side did not run).
ROUNDS_OF_RUNS='
  group_by(.round)[]
  | . as $runs
  | def run(system; workload): $runs | map(select(.system == system and .workload == workload)) | first;
    def rate(system; workload): run(system; workload).rate // null;
    def ratio(a; b): if a != null and b != null and b > 0 then a / b else null end;'

# Per round: each target's figure and whether it is met (null when its side did not run).
TARGETS=$ROUNDS_OF_RUNS'
    def target(name; value; goal; met): value as $v
      | {name: name, value: $v, goal: goal, met: (if $v == null then null else ($v | met) end)};
  { round: .[0].round,
    targets: [
      target("HTTP, 64 clients spread over the nodes / the same on the leader";
        ratio(rate("holdfast"; "uncontended-64@http"); rate("holdfast"; "uncontended-64@leader@http"));
        "≥ 0.9"; . >= 0.9),
      target("HTTP, 64 clients spread / etcd 64 clients";
        ratio(rate("holdfast"; "uncontended-64@http"); rate("etcd"; "uncontended-64")); "≥ 6"; . >= 6),
      target("HTTP, one client through a follower, acquire+release p50 (ms)";
        run("holdfast"; "uncontended-1@follower@http").p50_ms // null; "≤ 1.2 ms"; . <= 1.2),
      target("HTTP `wait=`, 8 on one lock spread / etcd hand-overs";
        ratio(rate("holdfast"; "contended-8@http"); rate("etcd"; "contended-8")); "≥ 20"; . >= 20),
      target("gRPC, 64 clients through a follower / through the leader";
        ratio(rate("holdfast"; "uncontended-64@follower"); rate("holdfast"; "uncontended-64@leader"));
        "≥ 0.9"; . >= 0.9),
      target("gRPC, 8 on one lock through a follower / through the leader";
        ratio(rate("holdfast"; "contended-8@follower"); rate("holdfast"; "contended-8@leader")); "≥ 0.9";
        . >= 0.9),
      target("gRPC, 64 clients through a follower / etcd 64 clients";
        ratio(rate("holdfast"; "uncontended-64@follower"); rate("etcd"; "uncontended-64")); "≥ 8"; . >= 8)
    ]
  }'

# Per round, beside the targets: what bounds them on this host. The leader alone's etcd multiples (a spread,
# which forwards two thirds of its writes, has no more cores to spread over on one host); what a follower's
# hop adds to one client's cycle of two writes (its p50 through a follower less through the leader), against
# the leader's hand-over p50 (a hand-over through a follower makes two such hops, the release in and the
# grant out); and how many of the host's cores each 64-client workload kept busy (the nodes' and the
# generator's CPU an operation times the rate): near all of them, a workload is bound by CPU; well under,
# by latency.
REFERENCES=$ROUNDS_OF_RUNS'
    def p50(system; workload): run(system; workload).p50_ms // null;
    def minus(a; b): if a != null and b != null then a - b else null end;
    def cores(system; workload): run(system; workload) as $r
      | if $r == null or $r.cpu_us_per_op == null then null
        else $r.rate * ($r.cpu_us_per_op + ($r.generator_us_per_op // 0)) / 1e6 end;
  { round: .[0].round,
    references: [
      {name: "HTTP, 64 clients on the leader alone / etcd 64 clients",
        value: ratio(rate("holdfast"; "uncontended-64@leader@http"); rate("etcd"; "uncontended-64"))},
      {name: "gRPC, 64 clients through the leader / etcd 64 clients",
        value: ratio(rate("holdfast"; "uncontended-64@leader"); rate("etcd"; "uncontended-64"))},
      {name: "gRPC, one client: p50 through a follower less through the leader (ms)",
        value: minus(p50("holdfast"; "uncontended-1@follower"); p50("holdfast"; "uncontended-1@leader"))},
      {name: "gRPC, 8 on one lock through the leader, hand-over p50 (ms)",
        value: p50("holdfast"; "contended-8@leader")},
      {name: "cores busy: HTTP, 64 clients spread", value: cores("holdfast"; "uncontended-64@http")},
      {name: "cores busy: HTTP, 64 clients on the leader", value: cores("holdfast"; "uncontended-64@leader@http")},
      {name: "cores busy: gRPC, 64 clients through a follower", value: cores("holdfast"; "uncontended-64@follower")},
      {name: "cores busy: gRPC, 64 clients through the leader", value: cores("holdfast"; "uncontended-64@leader")},
      {name: "cores busy: etcd, 64 clients", value: cores("etcd"; "uncontended-64")}
    ]
  }'

rounds=$(jq -s 'map(.round) | unique | .[]' "$RESULTS/results.jsonl")
header= rule=
for round in $rounds; do
    header+=" round $round |"
    rule+="---|"
done
echo
echo "| workload (a second; p50; the nodes' CPU and the generator's an operation) |$header"
echo "|---|$rule"
jq -rs 'group_by(.system, .workload)[]
  | "| \(.[0].system) \(.[0].workload) | " + (sort_by(.round) | map(
      "\(.rate // 0 | round)/s; \(.p50_ms // 0 | . * 100 | round / 100) ms; \(.cpu_us_per_op // 0 | round) µs, \(.generator_us_per_op // 0 | round) µs"
    ) | join(" | ")) + " |"' "$RESULTS/results.jsonl"
echo
echo "| target | goal |$header"
echo "|---|---|$rule"
jq -rs "[$TARGETS]"' | (.[0].targets | length) as $n | range(0; $n) as $i
  | def cell: if .value == null then "— (not run)" else
      "\(.value * 100 | round / 100)\(if .met then ", met" else ", not met" end)" end;
  "| \(.[0].targets[$i].name) | \(.[0].targets[$i].goal) | " + (map(.targets[$i] | cell) | join(" | ")) + " |"' \
    "$RESULTS/results.jsonl"
echo
echo "| what bounds them (no goal) |$header"
echo "|---|$rule"
jq -rs "[$REFERENCES]"' | (.[0].references | length) as $n | range(0; $n) as $i
  | def cell: if .value == null then "— (not run)" else "\(.value * 100 | round / 100)" end;
  "| \(.[0].references[$i].name) | " + (map(.references[$i] | cell) | join(" | ")) + " |"' \
    "$RESULTS/results.jsonl"
echo
etcd_build=$(jq -rs 'map(select(.system == "etcd"))[0].build // empty' "$RESULTS/results.jsonl")
[[ -z $etcd_build ]] || echo "$etcd_build from Debian's etcd-server, its clients spread over its members."
echo "any-node.sh: results in $RESULTS/results.jsonl" >&2
