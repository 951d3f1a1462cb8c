#!/usr/bin/env bash
# Cuts one follower of a local 3-node cluster off from its leader only (the other links work), on real
# processes and real TCP, and shows what requests sent through that follower get. A manual check, not a
# test: it needs root, iptables and setpriv. Each node runs as its own uid (7000 + its id), so that
# iptables can tell the nodes' packets apart on 127.0.0.1.
#
#   cluster/cut-follower.sh                      # target/release/holdfast, a 7 s cut
#   CUT=3 cluster/cut-follower.sh /tmp/holdfast-old
#
# Before the cut, 16 writes go through the follower side by side, so that it keeps connections to its
# leader as a busy follower does. Then: a read through it 0.2 s into the cut, a write 1 s into it, the
# heal after CUT seconds; it prints each answer and when it came, whether the write's lock is held
# afterwards, and every node's leader and term. A cut longer than the requests' 5 s bound shows what a
# client is told when nothing reaches the leader in time (docs/ARCHITECTURE.md, "The life of a request").
#
# Settings (environment): CUT=7 (seconds), CUT_BASE_PORT=29370 (node i's client port is this + 100*(i-1),
# its peer port one more), CUT_DIR=target/cut-follower (the cluster's data and logs).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$(realpath "${1:-$ROOT/target/release/holdfast}")
CUT=${CUT:-7}
BASE=${CUT_BASE_PORT:-29370}
DIR=${CUT_DIR:-$ROOT/target/cut-follower}

((EUID == 0)) || { echo "cut-follower.sh: needs root (iptables, setpriv)" >&2; exit 1; }
for tool in iptables setpriv curl jq; do
    command -v "$tool" >/dev/null || { echo "cut-follower.sh: needs $tool" >&2; exit 1; }
done
[[ -x $BIN ]] || { echo "cut-follower.sh: no binary at $BIN (cargo build --release)" >&2; exit 1; }

mkdir -p "$DIR"
# cluster.sh starts the nodes through this wrapper, which runs each as uid 7000 + id.
cat >"$DIR/as-own-uid" <<'WRAP'
#!/usr/bin/env bash
id="" data="" args=("$@")
for ((k = 0; k < ${#args[@]}; k++)); do
    [[ ${args[k]} == --id ]] && id=${args[k + 1]}
    [[ ${args[k]} == --data-dir ]] && data=${args[k + 1]}
done
[[ -n $id && -n $data ]] || exec "$CUT_REAL_BIN" "$@"
chown -R $((7000 + id)):$((7000 + id)) "$data"
exec setpriv --reuid=$((7000 + id)) --regid=$((7000 + id)) --clear-groups "$CUT_REAL_BIN" "$@"
WRAP
chmod +x "$DIR/as-own-uid"

export CUT_REAL_BIN=$BIN HOLDFAST_BIN=$DIR/as-own-uid HOLDFAST_RUN_DIR=$DIR/run HOLDFAST_BASE_PORT=$BASE
export HOLDFAST_SERVER_ARGS=${HOLDFAST_SERVER_ARGS:-"--election-timeout 250ms --worker-threads 1"}
cluster=$ROOT/cluster/cluster.sh
client_port() { echo $((BASE + 100 * ($1 - 1))); }
peer_port() { echo $((BASE + 1 + 100 * ($1 - 1))); }
http() { curl --noproxy '*' -s --max-time 10 "$@"; }

rules=()
heal() {
    for rule in "${rules[@]}"; do
        # shellcheck disable=SC2086 # a rule is a list of words
        iptables -D OUTPUT $rule 2>/dev/null || true
    done
    rules=()
}
trap 'heal; "$cluster" stop >/dev/null 2>&1 || true' EXIT

"$cluster" clean >/dev/null 2>&1 || true
"$cluster" start 3 >/dev/null
leader=$(http "localhost:$(client_port 1)/v1/cluster" | jq -e .leader)
follower=$((leader == 1 ? 2 : 1))
echo "binary $BIN; node $leader leads; node $follower is cut off from it for ${CUT}s"

for k in $(seq 16); do
    http -o /dev/null -X POST "localhost:$(client_port "$follower")/v1/locks/warm-$k?ttl=60s" &
done
wait

rules=("-m owner --uid-owner $((7000 + follower)) -p tcp --dport $(peer_port "$leader") -j DROP"
    "-m owner --uid-owner $((7000 + leader)) -p tcp --dport $(peer_port "$follower") -j DROP")
start=$(date +%s%N)
since() { echo "$((($(date +%s%N) - start) / 1000000)) ms"; }
for rule in "${rules[@]}"; do
    # shellcheck disable=SC2086
    iptables -A OUTPUT $rule
done
through="localhost:$(client_port "$follower")/v1/locks"
(
    sleep 0.2
    answer=$(http -w ' %{http_code}' "$through/cut-read")
    echo "read sent at 200 ms, answered at $(since): $answer"
) &
(
    sleep 1
    answer=$(http -w ' %{http_code}' -X POST "$through/cut-write?ttl=60s")
    echo "write sent at 1000 ms, answered at $(since): $answer"
) &
sleep "$CUT"
heal
echo "healed at $(since)"
wait
# Long enough for a write the follower sent into the cut to reach the leader by TCP's retransmission.
sleep 3
echo "the write's lock afterwards, on the leader: $(http "localhost:$(client_port "$leader")/v1/locks/cut-write")"
for i in 1 2 3; do
    http "localhost:$(client_port "$i")/v1/cluster" | jq -c '{id, leader, term}'
done
