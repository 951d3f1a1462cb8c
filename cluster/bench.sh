#!/usr/bin/env bash
# Runs every `holdfast bench` workload against a fresh local 3-node cluster (separate release processes on
# 127.0.0.1, fsync on) and rewrites the generated section of docs/benchmarks.md with the results, the
# issue's targets and the machine it ran on.
#
#   cluster/bench.sh                                      # the default run, about 5 minutes
#   DURATION=2s SESSIONS=500 LOCKS=5000 cluster/bench.sh  # a smoke run, under a minute (plus the build)
#   SESSIONS=10000 LOCKS=1000000 cluster/bench.sh         # the issue's sizes (the fill alone takes minutes)
#   cluster/bench.sh --report target/bench/results-…      # only rewrite the page from an earlier run
#
# Settings (environment):
#   DURATION=10s            each of uncontended 1, uncontended 64, contended 8 (through the leader, then through
#                           a follower) and the three reads workloads
#   SESSIONS=10000 LEASE=2s SESSIONS_DURATION=20s   the sessions workloads (through the leader, then through a follower)
#   LOCKS=100000 SCALE_CLIENTS=128                  the scale workload
#   ELECTION_TIMEOUT=250ms  the nodes' --election-timeout (and the base of the failover target)
#   FAILOVER_WARMUP=2s FAILOVER_AFTER=5s            the failover workload
#   WORKER_THREADS=         each node's --worker-threads; default: its share of this machine's cores
#                           (nproc / 3, at least 1), as for any nodes that share a machine
#   SERVER_ARGS=            more flags for every node
#   BENCH_BASE_PORT=27070   node i's client port is this + 100*(i-1), its peer port one more
#   BENCH_DIR=target/bench  the cluster's data and logs (BENCH_DIR/run), results (BENCH_DIR/results-TIME)
#   DOC=docs/benchmarks.md  whose section between the bench markers is rewritten; WRITE_DOC=0: leave it
#   KEEP=1                  keep the nodes' data directories afterwards (deleted by default)
#   SKIP_BUILD=1            use target/release/holdfast as it is
#
# Every node it starts is stopped when it ends, also on failure or Ctrl-C.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BENCH_DIR=${BENCH_DIR:-$TARGET_DIR/bench}
BASE_PORT=${BENCH_BASE_PORT:-27070}
DURATION=${DURATION:-10s}
SESSIONS=${SESSIONS:-10000}
LEASE=${LEASE:-2s}
SESSIONS_DURATION=${SESSIONS_DURATION:-20s}
LOCKS=${LOCKS:-100000}
SCALE_CLIENTS=${SCALE_CLIENTS:-128}
ELECTION_TIMEOUT=${ELECTION_TIMEOUT:-250ms}
FAILOVER_WARMUP=${FAILOVER_WARMUP:-2s}
FAILOVER_AFTER=${FAILOVER_AFTER:-5s}
WORKER_THREADS=${WORKER_THREADS:-$(($(nproc) / 3 > 0 ? $(nproc) / 3 : 1))}
DOC=${DOC:-$ROOT/docs/benchmarks.md}
WRITE_DOC=${WRITE_DOC:-1}
KEEP=${KEEP:-0}
# A bound on each workload's process, on top of the bounds each workload keeps by itself.
WORKLOAD_TIMEOUT_S=${WORKLOAD_TIMEOUT_S:-1800}
# How long a stopped node may take to exit, and a restarted one to catch up once it is ready.
STOP_TIMEOUT_S=30
CATCH_UP_TIMEOUT_S=60

CLUSTER=$ROOT/cluster/cluster.sh
RUN_DIR=$BENCH_DIR/run
RESULTS=$BENCH_DIR/results-$(date -u +%Y%m%dT%H%M%SZ)
LOG=/dev/null
WORKLOADS=(uncontended-1 uncontended-64 contended-8 contended-follower reads-64 busy-64 reads-follower failover sessions
    sessions-follower scale failover-held)

die() {
    echo "bench.sh: $*" >&2
    exit 1
}

say() { echo "== $*" | tee -a "$LOG" >&2; }

http() { curl --noproxy '*' -s --max-time 3 "$@"; }
client_port() { echo $((BASE_PORT + 100 * ($1 - 1))); }
node_url() { echo "http://127.0.0.1:$(client_port "$1")"; }
node_pid() { cat "$RUN_DIR/node$1/pid"; }
node_alive() {
    local pid
    pid=$(cat "$RUN_DIR/node$1/pid" 2>/dev/null) || return 1
    kill -0 "$pid" 2>/dev/null
}
pids() { echo "$(node_pid 1),$(node_pid 2),$(node_pid 3)"; }
rss_bytes() { awk '/^VmRSS:/ { print $2 * 1024 }' "/proc/$1/status"; }
# The most the process has had resident since it started.
peak_bytes() { awk '/^VmHWM:/ { print $2 * 1024 }' "/proc/$1/status"; }
# The value of a series in node $1's /metrics (0 if it has none yet).
metric() { http "$(node_url "$1")/metrics" | awk -v s="$2" '$1 == s { print $2; found = 1 } END { if (!found) print 0 }'; }
now() { date +%s.%N; }
# Seconds between two `now`s, to the millisecond.
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# Writes $RESULTS/run.json: the settings and the machine.
record_run() {
    local cpu mem_gib os fs commit smoke=false
    cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    mem_gib=$(awk '/^MemTotal:/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)
    os=$(awk -F= '$1 == "PRETTY_NAME" { gsub(/"/, "", $2); print $2 }' /etc/os-release 2>/dev/null)
    fs=$(df -T "$BENCH_DIR" | awk 'NR == 2 { print $2 }')
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    git -C "$ROOT" diff --quiet HEAD 2>/dev/null || commit="$commit with uncommitted changes"
    if [[ $DURATION =~ ^[0-4]s$ || $DURATION =~ ms$ ]] || ((SESSIONS < 1000 || LOCKS < 10000)); then
        smoke=true
    fi
    jq -n --arg date "$(date -u '+%Y-%m-%d %H:%M UTC')" --arg cpu "${cpu:-unknown CPU}" --arg cores "$(nproc)" \
        --arg mem_gib "$mem_gib" --arg kernel "$(uname -r)" --arg os "${os:-Linux}" --arg fs "$fs" \
        --arg commit "$commit" --argjson smoke "$smoke" \
        --arg settings "DURATION=$DURATION SESSIONS=$SESSIONS LEASE=$LEASE SESSIONS_DURATION=$SESSIONS_DURATION LOCKS=$LOCKS ELECTION_TIMEOUT=$ELECTION_TIMEOUT WORKER_THREADS=$WORKER_THREADS" \
        '$ARGS.named' >"$RESULTS/run.json"
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if [[ -f $RUN_DIR/size ]]; then
        echo "== stopping the benchmark cluster" >&2
        "$CLUSTER" stop >&2 || true
        if [[ $KEEP != 1 ]]; then
            rm -rf "$RUN_DIR"
        else
            echo "== kept $RUN_DIR" >&2
        fi
    fi
    echo "== results and log in $RESULTS" >&2
    exit "$status"
}

# Runs one workload: bench NAME ARGS... writes $RESULTS/NAME.json (or {"failed": …}); progress goes to the
# terminal and the log.
bench() {
    local name=$1 code=0
    shift
    say "$name: holdfast bench $*"
    timeout -k 10 "$WORKLOAD_TIMEOUT_S" "$BIN" bench --endpoints "$ENDPOINTS" --json "$@" \
        >"$RESULTS/$name.json" 2> >(tee -a "$LOG" >&2) || code=$?
    if ((code == 0)); then
        jq -c . "$RESULTS/$name.json" | tee -a "$LOG" >&2
    else
        echo "{\"failed\": true, \"exit\": $code}" >"$RESULTS/$name.json"
        say "$name FAILED (exit $code)"
    fi
}

# After the fill: memory and data size per node; a snapshot of every node's state, asked for with
# POST /v1/cluster/snapshot (the fill is far fewer entries than --snapshot-every), its size and how long it
# took, and each node's peak memory since (a snapshot encodes the whole state); then a follower stopped
# (SIGTERM, as for an upgrade) and restarted, which opens from its snapshot: until it answers /readyz 200,
# until it applied the leader's whole log, and its peak memory by then. Writes nodes.json.
measure_nodes() {
    say "scale: memory, data size, snapshots, a follower's restart and catch-up"
    local leader follower i pid last_index t0 t_ready caught_up=null applied deadline nodes=() fsync=()
    local snapshots=() answer snapshot_peaks=()
    leader=$(http "$(node_url 1)/v1/cluster" | jq -r '.leader // empty')
    [[ -n $leader ]] || leader=1
    follower=$((leader % 3 + 1))
    for i in 1 2 3; do
        pid=$(node_pid "$i")
        nodes+=("{\"id\": $i, \"rss_bytes\": $(rss_bytes "$pid"), \"peak_bytes\": $(peak_bytes "$pid"), \"data_bytes\": $(du -sb "$RUN_DIR/node$i/data" | awk '{ print $1 }')}")
        fsync+=("{\"id\": $i, \"sum\": $(metric "$i" holdfast_storage_fsync_duration_seconds_sum), \"count\": $(metric "$i" holdfast_storage_fsync_duration_seconds_count)}")
    done
    for i in 1 2 3; do
        t0=$(now)
        answer=$(curl --noproxy '*' -s --max-time 90 -X POST "$(node_url "$i")/v1/cluster/snapshot")
        jq -e '.snapshot_bytes' <<<"$answer" >/dev/null || die "node $i did not snapshot: $answer"
        snapshots+=("$(jq -c --argjson s "$(since "$t0" "$(now)")" '. + {seconds: $s}' <<<"$answer")")
    done
    for i in 1 2 3; do
        snapshot_peaks+=("{\"id\": $i, \"peak_bytes\": $(peak_bytes "$(node_pid "$i")")}")
    done
    last_index=$(metric "$leader" holdfast_raft_last_log_index)
    pid=$(node_pid "$follower")
    kill -TERM "$pid"
    # Until the process is gone (reaped), so that what follows times only the start.
    deadline=$((SECONDS + STOP_TIMEOUT_S))
    while kill -0 "$pid" 2>/dev/null; do
        ((SECONDS < deadline)) || die "node $follower did not stop within ${STOP_TIMEOUT_S}s"
        sleep 0.05
    done
    t0=$(now)
    "$CLUSTER" restart "$follower" | tee -a "$LOG" >&2
    t_ready=$(now)
    deadline=$((SECONDS + CATCH_UP_TIMEOUT_S))
    while ((SECONDS < deadline)); do
        applied=$(metric "$follower" holdfast_raft_applied_index)
        if awk -v a="$applied" -v b="$last_index" 'BEGIN { exit !(a >= b) }'; then
            caught_up=$(since "$t0" "$(now)")
            break
        fi
        sleep 0.05
    done
    local IFS=,
    cat <<EOF >"$RESULTS/nodes.json"
{"nodes": [${nodes[*]}], "fsync": [${fsync[*]}], "snapshots": [${snapshots[*]}],
 "snapshot_peaks": [${snapshot_peaks[*]}], "restarted": $follower,
 "restart_ready_s": $(since "$t0" "$t_ready"), "caught_up_s": $caught_up, "caught_up_to": $last_index,
 "restarted_rss_bytes": $(rss_bytes "$(node_pid "$follower")"),
 "restarted_peak_bytes": $(peak_bytes "$(node_pid "$follower")")}
EOF
    jq -c . "$RESULTS/nodes.json" | tee -a "$LOG" >&2
}

# A failover restarts the node it killed; if that failed, brings back whatever is down.
revive_nodes() {
    local i
    for i in 1 2 3; do
        node_alive "$i" || "$CLUSTER" restart "$i" >&2
    done
}

run_all() {
    mkdir -p "$RESULTS"
    LOG=$RESULTS/bench.log
    : >"$LOG"
    record_run

    # The release binary, and a copy of it that no other build can replace while the cluster runs.
    if [[ ${SKIP_BUILD:-0} != 1 ]]; then
        say "building the release binary"
        (cd "$ROOT" && cargo build --release --bin holdfast) 2>&1 | tail -n 3 >&2
    fi
    [[ -x $TARGET_DIR/release/holdfast ]] || die "no release binary at $TARGET_DIR/release/holdfast"
    BIN=$BENCH_DIR/holdfast
    cp "$TARGET_DIR/release/holdfast" "$BIN.tmp"
    mv "$BIN.tmp" "$BIN"

    # The host itself, before any node runs: how long a thread takes to wake another on the same core and
    # on another core, and a small synced append on the data's disk (`holdfast bench host`).
    say "probing the host (thread wake-ups, fdatasync in $BENCH_DIR)"
    "$BIN" bench --json host --dir "$BENCH_DIR" >"$RESULTS/host.json" 2>>"$LOG" || echo '{}' >"$RESULTS/host.json"

    # cluster.sh, and the kill and restart commands the failover workload runs, find this cluster so.
    export HOLDFAST_BIN=$BIN
    export HOLDFAST_BASE_PORT=$BASE_PORT
    export HOLDFAST_RUN_DIR=$RUN_DIR
    export HOLDFAST_SERVER_ARGS="--election-timeout $ELECTION_TIMEOUT --worker-threads $WORKER_THREADS ${SERVER_ARGS:-}"

    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    "$CLUSTER" clean >/dev/null
    say "starting 3 nodes on ports $BASE_PORT, $((BASE_PORT + 100)), $((BASE_PORT + 200)) ($HOLDFAST_SERVER_ARGS)"
    "$CLUSTER" start 3 | tee -a "$LOG" >&2
    ENDPOINTS=127.0.0.1:$(client_port 1),127.0.0.1:$(client_port 2),127.0.0.1:$(client_port 3)

    bench uncontended-1 uncontended --clients 1 --duration "$DURATION"
    bench uncontended-64 uncontended --clients 64 --duration "$DURATION"
    bench contended-8 contended --clients 8 --duration "$DURATION"
    ENDPOINTS=$(follower_endpoint) bench contended-follower contended --clients 8 --duration "$DURATION"
    bench reads-64 reads --clients 64 --duration "$DURATION"
    bench busy-64 reads --busy --clients 64 --duration "$DURATION"
    ENDPOINTS=$(follower_endpoint) bench reads-follower reads --clients 64 --duration "$DURATION"
    bench failover failover --kill "$CLUSTER kill {id}" --restart "$CLUSTER restart {id}" \
        --election-timeout "$ELECTION_TIMEOUT" --warmup "$FAILOVER_WARMUP" --after "$FAILOVER_AFTER"
    revive_nodes
    bench sessions sessions --sessions "$SESSIONS" --lease "$LEASE" --duration "$SESSIONS_DURATION" --pids "$(pids)"
    sessions_through_follower
    bench scale scale --locks "$LOCKS" --clients "$SCALE_CLIENTS" --pids "$(pids)"
    measure_nodes
    failover_held
}

# The client address of a node that does not lead.
follower_endpoint() {
    local leader
    leader=$(http "$(node_url 1)/v1/cluster" | jq -r '.leader // empty')
    echo "127.0.0.1:$(client_port $((${leader:-1} % 3 + 1)))"
}

# The same sessions attached to a follower, as behind a load balancer that picks any node: their
# heartbeats reach the leader through it.
sessions_through_follower() {
    ENDPOINTS=$(follower_endpoint) bench sessions-follower sessions \
        --sessions "$SESSIONS" --lease "$LEASE" --duration "$SESSIONS_DURATION" --pids "$(pids)"
}

# The leader killed again, now with the fill's locks held: the new leader must take over as fast as with
# few, and keep them all. Counts the locks held (holdfast_locks_held) on the node that leads before, and on
# the one that leads after; adds both to failover-held.json.
failover_held() {
    local before after leader
    revive_nodes
    leader=$(http "$(node_url 1)/v1/cluster" | jq -r '.leader // empty')
    before=$(metric "${leader:-1}" holdfast_locks_held)
    bench failover-held failover --kill "$CLUSTER kill {id}" --restart "$CLUSTER restart {id}" \
        --election-timeout "$ELECTION_TIMEOUT" --warmup "$FAILOVER_WARMUP" --after "$FAILOVER_AFTER"
    leader=$(http "$(node_url 1)/v1/cluster" | jq -r '.leader // empty')
    after=$(metric "${leader:-1}" holdfast_locks_held)
    jq -c --argjson b "${before:-null}" --argjson a "${after:-null}" '. + {locks_held_before: $b, locks_held_after: $a}' \
        "$RESULTS/failover-held.json" >"$RESULTS/failover-held.json.tmp"
    mv "$RESULTS/failover-held.json.tmp" "$RESULTS/failover-held.json"
}

# Writes $RESULTS/section.md from the results in $RESULTS, prints it, and splices it into $DOC.
report() {
    local name
    [[ -s $RESULTS/run.json ]] || die "$RESULTS/run.json is missing: not a results directory of this script"
    for name in "${WORKLOADS[@]}"; do
        [[ -s $RESULTS/$name.json ]] || echo '{"failed": true, "exit": "none: no result in this directory"}' >"$RESULTS/$name.json"
    done
    [[ -s $RESULTS/nodes.json ]] || echo '{"nodes": [], "fsync": []}' >"$RESULTS/nodes.json"
    [[ -s $RESULTS/host.json ]] || echo '{}' >"$RESULTS/host.json"
    jq -n -r --slurpfile run "$RESULTS/run.json" --slurpfile host "$RESULTS/host.json" \
        --slurpfile u1 "$RESULTS/uncontended-1.json" --slurpfile u64 "$RESULTS/uncontended-64.json" \
        --slurpfile c8 "$RESULTS/contended-8.json" --slurpfile cf "$RESULTS/contended-follower.json" \
        --slurpfile fo "$RESULTS/failover.json" \
        --slurpfile rd "$RESULTS/reads-64.json" --slurpfile bz "$RESULTS/busy-64.json" \
        --slurpfile rf "$RESULTS/reads-follower.json" \
        --slurpfile se "$RESULTS/sessions.json" --slurpfile sf "$RESULTS/sessions-follower.json" \
        --slurpfile sc "$RESULTS/scale.json" \
        --slurpfile nd "$RESULTS/nodes.json" --slurpfile fh "$RESULTS/failover-held.json" -f /dev/stdin >"$RESULTS/section.md" <<'JQ'
def r($x): if $x == null then "?" else ($x * 10 | round / 10 | tostring) end;
# Two decimals, where a target lies close: 1.03 ms is not "1 ms".
def r2($x): if $x == null then "?" else ($x * 100 | round / 100 | tostring) end;
def i($x): if $x == null then "?"
  else ($x | round | tostring | [match("\\d{1,3}(?=(\\d{3})*$)"; "g").string] | join(",")) end;
def mib($b): if $b == null then "?" else ($b / 1048576 | round | tostring) + " MiB" end;
def pct($x): if $x == null then "?" else ($x * 100 | round | tostring) + " %" end;
def us($ms): if $ms == null then "?" else ($ms * 1000 | round | tostring) + " µs" end;
def le($a; $b): $a != null and $b != null and $a <= $b;
def ge($a; $b): $a != null and $b != null and $a >= $b;
def verdict($ok): if $ok then "met" else "**missed**" end;
def row($what; $x; $result; $target; $ok):
  if $x.failed == true then "| \($what) | the workload failed (exit \($x.exit)) | \($target) | **failed** |"
  else "| \($what) | \($result) | \($target) | \($ok) |" end;
def sessions_row($what; $se):
  row("\(i($se.sessions)) sessions\($what), \(r($se.lease_ms | if . then . / 1000 else null end)) s leases"; $se;
      "\($se.spurious_lost) locks lost, \(i($se.expirations)) session expirations; the nodes used \(pct($se.cpu_cores_total)) of a core in total (the load generator \(pct($se.bench_cpu_cores))); heartbeat acknowledgement p99 ≤ \(r($se.heartbeat_p99_ms_at_most)) ms at the nodes (p50 ≤ \(r($se.heartbeat_p50_ms_at_most)) ms; histogram bounds); a leader-confirmed read p99 \(r($se.read_p99_ms)) ms; all open in \(r($se.open_seconds)) s";
      "10,000 sessions: zero spurious expirations, ≤ 1 core in total";
      (verdict($se.opened == $se.sessions and $se.spurious_lost == 0 and $se.expirations == 0
               and le($se.cpu_cores_total; 1))
        + (if $se.sessions < 10000 then " (at \(i($se.sessions)), not 10,000)" else "" end)));
def reads_row($what; $x):
  row($what; $x; "\(i($x.rate_per_s)) answers/s, p50 \(r($x.p50_ms)) ms, p99 \(r($x.p99_ms)) ms, \($x.errors) errors";
      "none (each answer confirmed by a quorum)"; "—");
$run[0] as $run | $u1[0] as $u1 | $u64[0] as $u64 | $c8[0] as $c8 | $cf[0] as $cf | $fo[0] as $fo | $se[0] as $se | $sf[0] as $sf |
$sc[0] as $sc | $nd[0] as $nd | $fh[0] as $fh | $host[0] as $host | $rd[0] as $rd | $bz[0] as $bz | $rf[0] as $rf |
($nd.nodes | map(.rss_bytes) | max) as $rss_max |
($nd.nodes | map(.peak_bytes) | if any(. == null) then null else max end) as $fill_peak_max |
# The peak through the snapshots and the restart (results from before 2026-12-02 evening have only the
# peak after the fill, or none).
([$fill_peak_max, ($nd.snapshot_peaks // [] | map(.peak_bytes) | max), $nd.restarted_peak_bytes]
  | map(select(. != null)) | if length > 0 then max else null end) as $peak_max |
($nd.nodes | map(.data_bytes) | max) as $data_max |
($nd.snapshots // [] | map(.snapshot_bytes) | max) as $snapshot_max |
($nd.snapshots // [] | map(.seconds) | max) as $snapshot_s |
($nd.fsync | map(select(.count > 0) | .sum / .count * 1000) | if length > 0 then add / length else null end)
  as $fsync_ms |
[
  "<!-- bench:begin -->",
  "<!-- Generated by cluster/bench.sh: the next run rewrites everything between the bench markers. -->",
  "",
  "## Latest `cluster/bench.sh` run",
  "",
  (if $run.smoke then
    "**A short smoke run, not a measurement**: it shows that the suite works end to end; its runs are too short and its sizes too small to judge the targets by. Settings: `\($run.settings)`."
  else
    "Settings: `\($run.settings)`."
  end),
  "",
  "Machine: \($run.cpu), \($run.cores) cores, \($run.mem_gib) GiB, \($run.os), Linux \($run.kernel); data on \($run.fs) (mean fsync \(r($fsync_ms)) ms). Host probe (`holdfast bench host`): a thread wakes another and is woken back in \(us($host.wake_one_core_p50_ms)) on one core, \(us($host.wake_two_cores_p50_ms)) across two (p50); a 128-byte append and fdatasync \(us($host.fdatasync_p50_ms)) (p50), \(us($host.fdatasync_p99_ms)) (p99). 3 nodes as separate release processes on 127.0.0.1, fsync on, the load generator on the same machine. Run \($run.date) at commit \($run.commit).",
  "",
  "| workload | result | target | verdict |",
  "|---|---|---|---|",
  row("1 client, uncontended"; $u1;
      "p50 \(r2($u1.p50_ms)) ms, p99 \(r($u1.p99_ms)) ms; \(i($u1.rate_per_s)) cycles/s";
      "p50 acquire+release ≤ 1 ms"; verdict(le($u1.p50_ms; 1))),
  row("64 clients, uncontended"; $u64;
      "\(i($u64.rate_per_s)) cycles/s, p50 \(r($u64.p50_ms)) ms, p99 \(r($u64.p99_ms)) ms, \($u64.errors) errors\(if $u64.commands_per_entry then "; \(r($u64.commands_per_entry)) commands per log entry" else "" end)";
      "≥ 10,000 cycles/s, p99 ≤ 20 ms"; verdict(ge($u64.rate_per_s; 10000) and le($u64.p99_ms; 20))),
  row("8 clients on one lock"; $c8;
      "\(i($c8.rate_per_s)) hand-overs/s, p50 \(r($c8.p50_ms)) ms, p99 \(r($c8.p99_ms)) ms";
      "≥ 2,000 hand-overs/s, p99 ≤ 5 ms"; verdict(ge($c8.rate_per_s; 2000) and le($c8.p99_ms; 5))),
  row("8 clients on one lock through a follower"; $cf;
      "\(i($cf.rate_per_s)) hand-overs/s, p50 \(r($cf.p50_ms)) ms, p99 \(r($cf.p99_ms)) ms";
      "none (the sessions attached to a follower, as behind a load balancer)"; "—"),
  reads_row("64 clients reading one held lock (`get`)"; $rd),
  reads_row("64 clients trying one held lock (one-shot acquires, all busy)"; $bz),
  reads_row("64 clients reading one held lock through a follower"; $rf),
  row("leader killed"; $fo;
      "first grant \(i($fo.first_grant_after_kill_ms)) ms after the kill (new leader seen at \(i($fo.new_leader_after_kill_ms)) ms), longest gap \(i($fo.longest_gap_ms)) ms; \($fo.held_kept) of \($fo.held) locks held before the kill still held, same fence\(if $fo.session_kept == null then "" elif $fo.session_kept then "; a session's lock (\(r($fo.session_lease_ms / 1000)) s lease) kept" else "; a session's lock (\(r($fo.session_lease_ms / 1000)) s lease) LOST" end)";
      "a grant within the election timeout (\(i($fo.election_timeout_ms)) ms) + 0.5 s; held locks stay held";
      verdict(le($fo.first_grant_after_kill_ms; $fo.target_ms) and $fo.held_all_kept == true and $fo.session_kept != false)),
  sessions_row(""; $se),
  sessions_row(" through a follower"; $sf),
  row("\(i($sc.locks)) held locks"; $sc;
      "filled at \(i($sc.rate_per_s)) locks/s (1,000,000 would take \(i($sc.projected_1m_seconds)) s); the largest node \(mib($rss_max)) resident after the fill\(if $nd.snapshot_peaks then ", \(mib($fill_peak_max)) at its peak by then; \(mib($peak_max)) the largest peak of any node through the snapshots below and the restart (the target is judged by it)" elif $peak_max then ", \(mib($peak_max)) at its peak (since it started)" else "" end), data dir \(mib($data_max)); a snapshot of every node's state \(mib($snapshot_max)), taken in \(r($snapshot_s)) s at most; a restarted follower ready from it in \(r($nd.restart_ready_s)) s, caught up in \(r($nd.caught_up_s)) s";
      "1,000,000 locks: ≤ 1 GiB per node, restart with catch-up ≤ 10 s";
      (verdict(le($peak_max // $rss_max; 1073741824) and le($nd.caught_up_s; 10))
        + (if $sc.locks < 1000000 then " (at \(i($sc.locks)), not 1,000,000)" else "" end))),
  row("leader killed, \(i($sc.locks)) locks held"; $fh;
      "first grant \(i($fh.first_grant_after_kill_ms)) ms after the kill (new leader seen at \(i($fh.new_leader_after_kill_ms)) ms), longest gap \(i($fh.longest_gap_ms)) ms; \(i($fh.locks_held_before)) locks held before the kill, \(i($fh.locks_held_after)) after it\(if $fh.session_kept == null then "" elif $fh.session_kept then "; a session's lock kept" else "; a session's lock LOST" end)";
      "as for the leader killed above; no held lock lost";
      verdict(le($fh.first_grant_after_kill_ms; $fh.target_ms) and $fh.held_all_kept == true
              and ge($fh.locks_held_after; $fh.locks_held_before) and $fh.session_kept != false)),
  "",
  "Every workload's JSON is kept in `target/bench/results-*/` on the machine that ran it.",
  "<!-- bench:end -->"
] | join("\n")
JQ
    echo >&2
    cat "$RESULTS/section.md"
    [[ $WRITE_DOC == 1 ]] || return 0
    if grep -q '^<!-- bench:begin -->$' "$DOC" && grep -q '^<!-- bench:end -->$' "$DOC"; then
        awk -v section="$RESULTS/section.md" '
            /^<!-- bench:begin -->$/ { while ((getline line < section) > 0) print line; skipping = 1; next }
            /^<!-- bench:end -->$/ { skipping = 0; next }
            !skipping { print }
        ' "$DOC" >"$DOC.tmp"
    else
        { cat "$DOC"; echo; cat "$RESULTS/section.md"; } >"$DOC.tmp"
    fi
    mv "$DOC.tmp" "$DOC"
    say "rewrote the generated section of $DOC"
}

for tool in curl jq awk du timeout; do
    command -v "$tool" >/dev/null || die "needs $tool"
done
case ${1:-} in
--report)
    RESULTS=${2:?usage: bench.sh --report RESULTS_DIR}
    report
    ;;
"")
    run_all
    report
    ;;
*)
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
