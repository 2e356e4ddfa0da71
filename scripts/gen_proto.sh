#!/bin/sh
# Regenerate the Python modules of proto/epochlog/v1/epochlog.proto into epochlog/grpc/v1/.
#
# The generated files are committed, so running a node needs grpcio and protobuf but not
# grpcio-tools; run this after editing the .proto (tests/epochlog/grpc/test_stubs.py fails until you do).
# Usage: scripts/gen_proto.sh [OUTPUT_DIR]   (PYTHON selects the interpreter; default .venv/bin/python)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
out=${1:-$root/epochlog/grpc/v1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$python" -m grpc_tools.protoc -I "$root/proto" --python_out="$tmp" --pyi_out="$tmp" \
    --grpc_python_out="$tmp" "$root/proto/epochlog/v1/epochlog.proto"
mkdir -p "$out"
# protoc names the modules after the proto's path (package epochlog.v1); here they live in
# epochlog.grpc.v1, so the service module's import of the messages is rewritten to match.
sed 's/^from epochlog\.v1 import epochlog_pb2/from epochlog.grpc.v1 import epochlog_pb2/' \
    "$tmp/epochlog/v1/epochlog_pb2_grpc.py" > "$out/epochlog_pb2_grpc.py"
cp "$tmp/epochlog/v1/epochlog_pb2.py" "$tmp/epochlog/v1/epochlog_pb2.pyi" "$out/"
