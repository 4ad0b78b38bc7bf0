#!/bin/sh
# Runs a client example against a real histd on a free loopback port:
#   run_example.sh HISTD PROTOC PLUGIN PROTO_DIR EXAMPLE.py
# Generates the Python stubs as README says, starts histd, runs the
# example, stops histd with SIGTERM and checks it exits 0.
set -eu
histd=$1 protoc=$2 plugin=$3 proto=$4 example=$5
dir=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
"$protoc" -I "$proto" -I /usr/include --python_out="$dir" --grpc_python_out="$dir" \
	--plugin=protoc-gen-grpc_python="$plugin" "$proto/histd/v1/histd.proto"
"$histd" --auth-disabled --driver memory --listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn &
pid=$!
i=0
while [ ! -s "$dir/port" ]; do
	i=$((i + 1))
	[ $i -gt 200 ] && { echo "histd did not start" >&2; exit 1; }
	sleep 0.05
done
PYTHONPATH="$dir" /usr/bin/python3 "$example" "127.0.0.1:$(cat "$dir/port")"
kill -TERM "$pid"
wait "$pid"
pid=
