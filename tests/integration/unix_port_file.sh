#!/bin/sh
# A unix: listener has no port: histd writes 0 to --port-file (still the
# sign that it serves) and logs port 0, never gRPC's placeholder 1.
#   unix_port_file.sh HISTD
histd=$1
dir=$(mktemp -d /tmp/histd-unix-XXXXXX)
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
"$histd" --auth-disabled --driver memory --listen "unix:$dir/sock" \
	--port-file "$dir/port" 2>"$dir/log" &
pid=$!
i=0
while [ ! -s "$dir/port" ] && [ $i -lt 300 ]; do
	sleep 0.1
	i=$((i + 1))
done
fail=0
if [ "$(cat "$dir/port" 2>/dev/null)" != 0 ]; then
	echo "port file holds '$(cat "$dir/port" 2>/dev/null)', not 0"
	fail=1
fi
if ! grep -q '"msg":"serving".*"port":"0"' "$dir/log"; then
	echo "no serving line with port 0"
	fail=1
fi
[ -S "$dir/sock" ] || { echo "no socket at $dir/sock"; fail=1; }
kill -TERM "$pid"
wait "$pid"
rc=$? pid=
[ $rc -eq 0 ] || { echo "histd exited $rc on SIGTERM"; fail=1; }
[ $fail -eq 0 ] || cat "$dir/log"
exit $fail
