#!/usr/bin/env bash
# Sessions by the hundred thousand, judged against their targets: for each size, a fresh local 3-node
# cluster (release processes on 127.0.0.1, fsync on, default flags) and `holdfast bench sessions --light
# --spread` (100 sessions a connection, connection i on node i mod 3, as behind a load balancer; 256
# opening at a time; each session holding a lock and heartbeating every quarter lease).
#
#   cluster/sessions.sh                                # 100,000 with 10 s leases, then 250,000 with 30 s
#   ROUNDS=2 SIZES="100000:10s" cluster/sessions.sh
#
# Settings (environment):
#   SIZES="100000:10s 250000:30s"   SESSIONS:LEASE, one run of each per round
#   ROUNDS=1                        how many times each size runs
#   DURATION=30s                    the window measured once every session is open
#   HOLDFAST_BIN=                   the build (default target/release/holdfast, built when missing)
#   SESSIONS_BASE_PORT=29070        node i's client port is this + 100*(i-1), its peer port one more
#   SESSIONS_DIR=target/sessions    the clusters' data (SESSIONS_DIR/run) and results (results-TIME)
#
# For each run it prints a line, and at the end a Markdown table with a verdict on each target:
#   - nothing lost: no lock lost, no session expired, every heartbeat due in the window acknowledged;
#   - the nodes ≤ 1 core in total, and each node ≤ 1 GiB resident at its highest (VmHWM, the opening and
#     the closing included);
#   - the leader's CPU a heartbeat ≤ 5 µs: its whole CPU in the window (its own streams, the followers'
#     batches, Raft, the keeper) over the heartbeats acknowledged in it;
#   - a session ≤ 2 KiB of the leader's memory: its resident size holding them, less its size before the
#     first was opened, over the sessions (each node's is in the JSON);
#   - open at 5,000 a second or faster (100,000 in 20 s).
# Every run's JSON (`holdfast bench sessions --json`, with the leader and the idle sizes added) goes to
# results.jsonl.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SESSIONS_DIR=${SESSIONS_DIR:-$TARGET_DIR/sessions}
SIZES=${SIZES:-100000:10s 250000:30s}
ROUNDS=${ROUNDS:-1}
DURATION=${DURATION:-30s}
BASE_PORT=${SESSIONS_BASE_PORT:-29070}
CLUSTER=$ROOT/cluster/cluster.sh
RUN_DIR=$SESSIONS_DIR/run
RESULTS=$SESSIONS_DIR/results-$(date -u +%Y%m%dT%H%M%SZ)

die() {
    echo "sessions.sh: $*" >&2
    exit 1
}

for tool in curl jq; do
    command -v "$tool" >/dev/null || die "$tool is needed"
done
for size in $SIZES; do
    [[ $size =~ ^[1-9][0-9]*:[1-9][0-9]*(ms|s)$ ]] || die "'$size' is not SESSIONS:LEASE (100000:10s)"
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS=$ROUNDS is not a positive number"
BIN=${HOLDFAST_BIN:-$TARGET_DIR/release/holdfast}
if [[ ! -x $BIN ]]; then
    [[ -z ${HOLDFAST_BIN:-} ]] || die "HOLDFAST_BIN=$HOLDFAST_BIN is not an executable"
    (cd "$ROOT" && cargo build --release --bin holdfast)
fi
export HOLDFAST_BIN=$BIN HOLDFAST_RUN_DIR=$RUN_DIR HOLDFAST_BASE_PORT=$BASE_PORT
ENDPOINTS=$(for i in 1 2 3; do printf '127.0.0.1:%s,' $((BASE_PORT + 100 * (i - 1))); done)
ENDPOINTS=${ENDPOINTS%,}
mkdir -p "$RESULTS"

cleanup() {
    "$CLUSTER" clean >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

node_pids() { cat "$RUN_DIR"/node{1,2,3}/pid; }
# Resident bytes of process $1.
rss_bytes() { awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$1/status"; }

# The id of the leader.
leader_id() {
    local leader
    leader=$(curl --noproxy '*' -sf "127.0.0.1:$BASE_PORT/v1/cluster" | jq -r '.leader // empty')
    [[ -n $leader ]] || die "no leader"
    echo "$leader"
}

# One run of $1 sessions with $2 leases; appends its JSON, with the leader (1-based, by node) and each
# node's resident bytes before the opening, to results.jsonl.
run() {
    local sessions=$1 lease=$2 pids leader idle out
    "$CLUSTER" clean >/dev/null 2>&1 || true
    "$CLUSTER" start 3 >/dev/null
    pids=$(node_pids | paste -sd,)
    leader=$(leader_id)
    idle=$(for pid in $(node_pids); do rss_bytes "$pid"; done | jq -sc .)
    out=$RESULTS/run-$sessions-$lease-$(date -u +%H%M%S).json
    "$BIN" bench --endpoints "$ENDPOINTS" --json sessions --light --spread --sessions "$sessions" \
        --lease "$lease" --duration "$DURATION" --pids "$pids" >"$out"
    # The leader at the end, too: a change of leader during the run makes its CPU figure meaningless.
    [[ $(leader_id) == "$leader" ]] || echo "sessions.sh: the leader changed during the run" >&2
    jq -c --argjson leader "$leader" --argjson idle "$idle" --arg leader_after "$(leader_id)" \
        '. + {leader: $leader, leader_after: ($leader_after | tonumber), rss_bytes_idle: $idle}' "$out" \
        >>"$RESULTS/results.jsonl"
    "$CLUSTER" clean >/dev/null 2>&1 || true
}

# The figures of one results.jsonl line, and the verdicts.
FIGURES='
  (.leader - 1) as $l
  | (.heartbeats_acknowledged // 0) as $acked
  | {
      sessions, opened, lease_s: (.lease_ms / 1000), open_s: .open_seconds,
      refused: .open_refused_overloaded, failed: .open_failures,
      lost: .spurious_lost, expired: (.expirations // -1),
      acked_per_s: ($acked / .window_seconds), due_per_s: .heartbeats_per_s,
      nodes_cores: .cpu_cores_total, leader_cores: .cpu[$l].cores, generator_cores: .bench_cpu_cores,
      us_per_heartbeat: (if $acked > 0 then .cpu[$l].cpu_seconds / $acked * 1e6 else null end),
      mib_holding: [.memory[].rss_bytes_holding / 1048576],
      mib_peak: [.memory[].rss_bytes_peak / 1048576],
      kib_per_session: [range(0; 3) as $i | (.memory[$i].rss_bytes_holding - .rss_bytes_idle[$i]) / ([.opened, 1] | max) / 1024],
      leader: .leader, leader_changed: (.leader != .leader_after)
    }
  | . + {kib_per_session_leader: .kib_per_session[$l]}
  | . + {
      met_nothing_lost: (.opened == .sessions and .lost == 0 and .expired == 0 and .acked_per_s >= 0.99 * .due_per_s),
      met_cores: (.nodes_cores <= 1),
      met_memory: ((.mib_peak | max) <= 1024),
      met_heartbeat: (.us_per_heartbeat != null and .us_per_heartbeat <= 5 and (.leader_changed | not)),
      met_session: (.kib_per_session_leader <= 2),
      met_open: (.opened / .open_s >= 5000)
    }'

for round in $(seq "$ROUNDS"); do
    for size in $SIZES; do
        sessions=${size%%:*} lease=${size#*:}
        echo "sessions.sh: round $round, $sessions sessions, $lease leases" >&2
        run "$sessions" "$lease"
        tail -n 1 "$RESULTS/results.jsonl" | jq -r "$FIGURES"' | "  \(.opened) open in \(.open_s * 10 | round / 10) s, lost \(.lost), expired \(.expired), \(.acked_per_s | round)/\(.due_per_s | round) heartbeats/s; nodes \(.nodes_cores * 100 | round / 100) cores (leader \(.leader_cores * 100 | round / 100), \((.us_per_heartbeat // 0) * 100 | round / 100) µs a heartbeat), generator \(.generator_cores * 100 | round / 100); \(.kib_per_session_leader * 100 | round / 100) KiB a session on the leader; at most \(.mib_peak | max | round) MiB"' >&2
    done
done

echo
echo "| sessions, lease | opened in | lost, expired | heartbeats acked / due | nodes' CPU (leader) | leader's CPU a heartbeat | generator CPU | a session on the leader (each node) | each node holding (at most) | targets met |"
echo "|---|---|---|---|---|---|---|---|---|---|"
jq -r "$FIGURES"' | def f(n): . * n | round / n;
  def kib: map(f(100) | tostring) | join(", ");
  def mib: map(round | tostring) | join("-");
  [ "\(.sessions), \(.lease_s) s",
    "\(.open_s | f(10)) s",
    "\(.lost), \(.expired)",
    "\(.acked_per_s | round) / \(.due_per_s | round) per s",
    "\(.nodes_cores | f(100)) (\(.leader_cores | f(100)))",
    "\(.us_per_heartbeat // 0 | f(100)) µs" + (if .leader_changed then " (the leader changed)" else "" end),
    "\(.generator_cores | f(100))",
    "\(.kib_per_session_leader | f(100)) KiB (\(.kib_per_session | kib))",
    "\(.mib_holding | [min, max] | mib) MiB (\(.mib_peak | [min, max] | mib))",
    ([if .met_nothing_lost then empty else "not nothing lost" end,
      if .met_cores then empty else "not ≤ 1 core" end,
      if .met_memory then empty else "not ≤ 1 GiB" end,
      if .met_heartbeat then empty else "not ≤ 5 µs" end,
      if .met_session then empty else "not ≤ 2 KiB" end,
      if .met_open then empty else "not 5,000 opened a second" end] | if length == 0 then "all" else join("; ") end)
  ] | "| " + join(" | ") + " |"' "$RESULTS/results.jsonl"
echo
echo "sessions.sh: results in $RESULTS/results.jsonl" >&2
