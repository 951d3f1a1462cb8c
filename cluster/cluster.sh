#!/usr/bin/env bash
# Runs a local holdfast cluster of 3 or 5 processes on 127.0.0.1.
#
# Node i serves clients on port 7070+100*(i-1) and Raft on 7071+100*(i-1). Its data, log and pid live in
# cluster/.run/nodeI/ (gitignored), so a node that is restarted rejoins with its data.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN_DIR=${HOLDFAST_RUN_DIR:-$ROOT/cluster/.run}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
# Seconds that `start` and `restart` wait for /readyz, and that `stop` waits for a process to exit.
START_TIMEOUT_S=${HOLDFAST_START_TIMEOUT:-30}
STOP_TIMEOUT_S=10
# Client port of node 1; node i's client port is this + 100*(i-1), its peer port one more.
BASE_PORT=${HOLDFAST_BASE_PORT:-7070}

usage() {
    cat <<EOF
usage: $(basename "$0") COMMAND [ARG]

  start [3|5]   start a cluster of 3 (default) or 5 nodes and wait until every node is ready
  stop          stop every node (SIGTERM, then SIGKILL after ${STOP_TIMEOUT_S}s); data is kept
  status        show each node's process and its GET /v1/cluster
  kill N        kill -9 node N
  restart N     stop node N if it runs, start it again on its data, wait until it is ready
  logs N [-f]   print (or follow) node N's log
  clean         stop every node and delete ${RUN_DIR}

Node i: client http://127.0.0.1:\$((7070+100*(i-1))), peer 127.0.0.1:\$((7071+100*(i-1))).
Binary: \$HOLDFAST_BIN, else target/release/holdfast, else target/debug/holdfast, else built with
'cargo build --release --bin holdfast'. Extra server flags can be given in \$HOLDFAST_SERVER_ARGS.
\$HOLDFAST_BASE_PORT moves every port (default 7070); \$HOLDFAST_RUN_DIR moves ${RUN_DIR}.
EOF
}

die() {
    echo "cluster.sh: $*" >&2
    exit 1
}

client_port() { echo $((BASE_PORT + 100 * ($1 - 1))); }
peer_port() { echo $((BASE_PORT + 1 + 100 * ($1 - 1))); }
node_dir() { echo "$RUN_DIR/node$1"; }

# Every node's curl goes straight to 127.0.0.1, whatever proxy the environment names.
http() { curl --noproxy '*' -s --max-time 2 "$@"; }

size() {
    [[ -f $RUN_DIR/size ]] || die "no cluster here (run '$(basename "$0") start' first)"
    cat "$RUN_DIR/size"
}

check_node() {
    local n=$1 total
    total=$(size)
    [[ $n =~ ^[0-9]+$ ]] || die "node must be a number, got '$n'"
    ((n >= 1 && n <= total)) || die "no node $n in a cluster of $total"
}

# The pid of node $1 if its process runs, else nothing (and status 1).
running_pid() {
    local pid_file
    pid_file="$(node_dir "$1")/pid"
    [[ -f $pid_file ]] || return 1
    local pid
    pid=$(cat "$pid_file")
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

find_bin() {
    if [[ -n ${HOLDFAST_BIN:-} ]]; then
        [[ -x $HOLDFAST_BIN ]] || die "HOLDFAST_BIN=$HOLDFAST_BIN is not an executable"
        echo "$HOLDFAST_BIN"
    elif [[ -x $TARGET_DIR/release/holdfast ]]; then
        echo "$TARGET_DIR/release/holdfast"
    elif [[ -x $TARGET_DIR/debug/holdfast ]]; then
        echo "$TARGET_DIR/debug/holdfast"
    else
        echo "cluster.sh: building holdfast (release)" >&2
        (cd "$ROOT" && cargo build --release --bin holdfast >&2)
        echo "$TARGET_DIR/release/holdfast"
    fi
}

members() {
    local n=$1 i list=""
    for ((i = 1; i <= n; i++)); do
        list+="${list:+,}$i=127.0.0.1:$(peer_port "$i")"
    done
    echo "$list"
}

spawn_node() {
    local i=$1 n=$2 bin=$3 dir
    dir=$(node_dir "$i")
    mkdir -p "$dir/data"
    echo "===== cluster.sh: starting node $i at $(date -Is) =====" >>"$dir/log"
    # shellcheck disable=SC2086 # HOLDFAST_SERVER_ARGS is a list of words on purpose.
    # The log goes to a file: no colour codes.
    NO_COLOR=1 nohup "$bin" server \
        --id "$i" \
        --members "$(members "$n")" \
        --client-addr "127.0.0.1:$(client_port "$i")" \
        --peer-addr "127.0.0.1:$(peer_port "$i")" \
        --data-dir "$dir/data" \
        ${HOLDFAST_SERVER_ARGS:-} \
        </dev/null >>"$dir/log" 2>&1 &
    echo $! >"$dir/pid"
}

# Waits until every node given is ready (/readyz 200); fails early if one of their processes exits.
wait_ready() {
    local deadline=$((SECONDS + START_TIMEOUT_S)) i pending
    while :; do
        pending=()
        for i in "$@"; do
            running_pid "$i" >/dev/null || {
                echo "cluster.sh: node $i exited while starting; last log lines:" >&2
                tail -n 20 "$(node_dir "$i")/log" >&2
                return 1
            }
            http -f -o /dev/null "http://127.0.0.1:$(client_port "$i")/readyz" || pending+=("$i")
        done
        ((${#pending[@]} == 0)) && return 0
        if ((SECONDS >= deadline)); then
            echo "cluster.sh: nodes ${pending[*]} not ready after ${START_TIMEOUT_S}s" \
                "(see '$(basename "$0") logs N')" >&2
            return 1
        fi
        sleep 0.2
    done
}

# Sends signal $2 to node $1 if it runs and waits (bounded) until it is gone.
signal_node() {
    local i=$1 signal=$2 pid deadline
    pid=$(running_pid "$i") || {
        rm -f "$(node_dir "$i")/pid"
        return 0
    }
    kill "-$signal" "$pid" 2>/dev/null || true
    deadline=$((SECONDS + STOP_TIMEOUT_S))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            if [[ $signal == KILL ]]; then
                die "node $i (pid $pid) still runs after SIGKILL"
            fi
            echo "cluster.sh: node $i (pid $pid) ignored SIG$signal for ${STOP_TIMEOUT_S}s; killing it" >&2
            kill -KILL "$pid" 2>/dev/null || true
            deadline=$((SECONDS + STOP_TIMEOUT_S))
            signal=KILL
        fi
        sleep 0.1
    done
    rm -f "$(node_dir "$i")/pid"
}

endpoints() {
    local n=$1 i
    for ((i = 1; i <= n; i++)); do
        echo "node $i: http://127.0.0.1:$(client_port "$i")  (peer 127.0.0.1:$(peer_port "$i"), log $(node_dir "$i")/log)"
    done
}

cmd_start() {
    local n=${1:-3} i bin
    [[ $n == 3 || $n == 5 ]] || die "a cluster has 3 or 5 nodes, not '$n'"
    if [[ -f $RUN_DIR/size ]]; then
        local old
        old=$(cat "$RUN_DIR/size")
        for ((i = 1; i <= old; i++)); do
            if pid=$(running_pid "$i"); then
                die "node $i already runs (pid $pid); '$(basename "$0") stop' first"
            fi
        done
        [[ $old == "$n" ]] || die "$RUN_DIR holds a cluster of $old nodes; '$(basename "$0") clean' first"
    fi
    for ((i = 1; i <= n; i++)); do
        if http -o /dev/null "http://127.0.0.1:$(client_port "$i")/livez"; then
            die "something already answers on 127.0.0.1:$(client_port "$i")"
        fi
    done
    bin=$(find_bin)
    echo "binary: $bin"
    mkdir -p "$RUN_DIR"
    echo "$n" >"$RUN_DIR/size"
    for ((i = 1; i <= n; i++)); do
        spawn_node "$i" "$n" "$bin"
    done
    local nodes=()
    for ((i = 1; i <= n; i++)); do nodes+=("$i"); done
    if ! wait_ready "${nodes[@]}"; then
        echo "cluster.sh: the cluster did not start; the nodes keep running for inspection" \
            "('$(basename "$0") stop' ends them)" >&2
        exit 1
    fi
    echo "cluster of $n ready:"
    endpoints "$n"
}

cmd_stop() {
    [[ -f $RUN_DIR/size ]] || { echo "no cluster"; return 0; }
    local n i
    n=$(size)
    for ((i = 1; i <= n; i++)); do
        signal_node "$i" TERM
    done
    echo "stopped (data kept in $RUN_DIR)"
}

cmd_status() {
    local n i pid info
    n=$(size)
    for ((i = 1; i <= n; i++)); do
        if pid=$(running_pid "$i"); then
            echo "node $i: running, pid $pid, http://127.0.0.1:$(client_port "$i")"
            if info=$(http -f "http://127.0.0.1:$(client_port "$i")/v1/cluster"); then
                if command -v jq >/dev/null; then
                    jq . <<<"$info"
                else
                    echo "$info"
                fi
            else
                echo "  (GET /v1/cluster failed)"
            fi
        else
            echo "node $i: not running"
        fi
    done
}

cmd_kill() {
    local i=${1:?usage: kill N}
    check_node "$i"
    running_pid "$i" >/dev/null || die "node $i is not running"
    signal_node "$i" KILL
    echo "node $i killed"
}

cmd_restart() {
    local i=${1:?usage: restart N} n bin
    check_node "$i"
    n=$(size)
    signal_node "$i" TERM
    bin=$(find_bin)
    spawn_node "$i" "$n" "$bin"
    wait_ready "$i" || exit 1
    echo "node $i ready: http://127.0.0.1:$(client_port "$i")"
}

cmd_logs() {
    local i=${1:?usage: logs N [-f]}
    check_node "$i"
    local log
    log="$(node_dir "$i")/log"
    [[ -f $log ]] || die "node $i has no log yet"
    if [[ ${2:-} == -f ]]; then
        tail -n 50 -f "$log"
    else
        cat "$log"
    fi
}

cmd_clean() {
    if [[ -f $RUN_DIR/size ]]; then
        cmd_stop
    fi
    rm -rf "$RUN_DIR"
    echo "removed $RUN_DIR"
}

main() {
    local command=${1:-}
    shift || true
    case $command in
    start) cmd_start "$@" ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    kill) cmd_kill "$@" ;;
    restart) cmd_restart "$@" ;;
    logs) cmd_logs "$@" ;;
    clean) cmd_clean ;;
    -h | --help | help) usage ;;
    *)
        usage >&2
        exit 2
        ;;
    esac
}

main "$@"
