# Sourced by cluster/bench-etcd.sh and cluster/zones.sh: installs what etcd's side of a benchmark needs
# (Debian's etcd-server, and protoc with protobuf's own protos for the driver) with apt-get when missing,
# builds cluster/etcd-driver, and sets DRIVER (its binary) and ETCD_VERSION. Needs ROOT and TARGET_DIR.

etcd_setup() {
    local missing=()
    command -v etcd >/dev/null || missing+=(etcd-server)
    command -v protoc >/dev/null || missing+=(protobuf-compiler)
    # etcd's protos import protobuf's own (descriptor.proto, struct.proto), which libprotobuf-dev installs.
    [[ -f /usr/include/google/protobuf/descriptor.proto ]] || missing+=(libprotobuf-dev)
    if ((${#missing[@]} > 0)); then
        echo "installing ${missing[*]}"
        local sudo=()
        ((EUID == 0)) || sudo=(sudo)
        "${sudo[@]}" apt-get update -q
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    fi
    echo "building the etcd driver (cluster/etcd-driver)"
    PROTOC_INCLUDE=/usr/include CARGO_TARGET_DIR=$TARGET_DIR/etcd-driver \
        cargo build -q --release --manifest-path "$ROOT/cluster/etcd-driver/Cargo.toml"
    DRIVER=$TARGET_DIR/etcd-driver/release/holdfast-etcd-driver
    ETCD_VERSION=$(etcd --version | awk '/etcd Version/ { print $3 }')
    echo "etcd $ETCD_VERSION"
}
