#!/bin/sh
# Runs the Node.js example against a real histd on a free loopback port:
#   run_node_example.sh HISTD EXAMPLE_DIR PROTO_DIR WORK_DIR
# Installs the example's pinned packages into WORK_DIR (npm ci), starts
# histd, runs quickstart.js, stops histd with SIGTERM and checks it exits 0.
set -eu
histd=$1 example=$2 proto=$3 work=$4
here=$(dirname "$0")
"$here/npm_install.sh" "$example" "$work"
dir=$(mktemp -d)
pid=
cleanup() {
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT
"$histd" --auth-disabled --driver memory --listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn &
pid=$!
i=0
while [ ! -s "$dir/port" ]; do
	i=$((i + 1))
	[ $i -gt 200 ] && { echo "histd did not start" >&2; exit 1; }
	sleep 0.05
done
NODE_PATH="$work/node_modules" HISTD_PROTO_DIR="$proto" \
	node "$example/quickstart.js" "127.0.0.1:$(cat "$dir/port")"
kill -TERM "$pid"
wait "$pid"
pid=
echo "1 passed, 0 failed"
