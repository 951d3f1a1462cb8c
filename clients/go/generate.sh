#!/bin/sh
# Generates holdfastpb/ (the gRPC API's Go types and client) from proto/holdfast/v1/locks.proto with
# Debian's protoc, protoc-gen-go and protoc-gen-go-grpc; into OUT_DIR/holdfastpb if given (the test that
# compares), else into this directory. The proto has no go_package option, so the import path is given here.
set -eu
cd "$(dirname "$0")"
out=${1:-.}
module=github.com/holdfast/holdfast/clients/go
map="Mholdfast/v1/locks.proto=$module/holdfastpb"
mkdir -p "$out/holdfastpb"
protoc -I ../../proto \
    --go_out="$out" --go_opt=module=$module --go_opt="$map" \
    --go-grpc_out="$out" --go-grpc_opt=module=$module --go-grpc_opt="$map" \
    holdfast/v1/locks.proto
