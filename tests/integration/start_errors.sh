#!/bin/sh
# Options that are wrong only as histd uses them stop it at start with a
# line naming them: a default pipeline that does not parse, a summarizer
# or embedding provider without its key, an API keys file histd refuses
# and a --metrics-listen port that is not one (or a host that does not
# resolve) exit 2, as every bad option
# does; a metrics port file that cannot be written exits 1 (the file
# system, not the option), like --port-file, and so do a --listen or
# --metrics-listen port another histd holds (gRPC would share the first
# through SO_REUSEPORT).
#   start_errors.sh HISTD
histd=$1
dir=$(mktemp -d /tmp/histd-start-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail=0

# expect CODE PATTERN ARGS...: histd exits CODE and its output holds PATTERN.
expect() {
	code=$1 pattern=$2
	shift 2
	timeout 30 "$histd" --auth-disabled --driver memory \
		--listen 127.0.0.1:0 "$@" >"$dir/out" 2>&1
	rc=$?
	if [ $rc -ne "$code" ]; then
		echo "histd $*: exit $rc, expected $code"
		cat "$dir/out"
		fail=1
	elif ! grep -q -- "$pattern" "$dir/out"; then
		echo "histd $*: no '$pattern' in its output:"
		cat "$dir/out"
		fail=1
	fi
}

expect 2 "default-pipeline" --default-pipeline "nosuch:x=1"
expect 2 "default-pipeline" --default-pipeline "window:max_tokens=-5"
unset OPENAI_API_KEY HISTD_TEST_NO_KEY
expect 2 "HISTD_TEST_NO_KEY" --embedding-provider openai \
	--openai-api-key-env HISTD_TEST_NO_KEY
unset HISTD_TEST_NO_KEY2
expect 2 "HISTD_TEST_NO_KEY2" --anthropic-model claude-test \
	--anthropic-api-key-env HISTD_TEST_NO_KEY2
# An API keys file histd refuses is a bad option too, named with its line.
printf 'short acme\n' >"$dir/keys"
expect 2 "api-keys-file $dir/keys line 1" --auth-disabled=false \
	--api-keys-file "$dir/keys"
# strtol would read the port as 0 and bind a random one.
expect 2 "metrics-listen '127.0.0.1:9O9O' needs a port" \
	--metrics-listen 127.0.0.1:9O9O
expect 2 "metrics-listen 'nosuch.invalid:9090'" \
	--metrics-listen nosuch.invalid:9090
expect 1 "cannot write metrics port file" --metrics-listen 127.0.0.1:0 \
	--metrics-port-file "$dir/missing/dir/port"

# A second histd on the port of a running one must not start and take a
# share of its connections.
timeout 60 "$histd" --auth-disabled --driver memory --listen 127.0.0.1:0 \
	--port-file "$dir/port" --metrics-listen 127.0.0.1:0 \
	--metrics-port-file "$dir/mport" 2>"$dir/first.log" &
first=$!
for _ in $(seq 100); do
	[ -s "$dir/port" ] && break
	sleep 0.1
done
if [ -s "$dir/port" ]; then
	expect 1 "cannot listen on 127.0.0.1:$(cat "$dir/port")" \
		--listen "127.0.0.1:$(cat "$dir/port")"
	# A metrics port in use: libmicrohttpd's complaint is a JSON line too.
	expect 1 "cannot serve metrics on 127.0.0.1:$(cat "$dir/mport")" \
		--metrics-listen "127.0.0.1:$(cat "$dir/mport")"
	if grep -v '^{.*}$' "$dir/out"; then
		echo "histd wrote lines that are not JSON (above)"
		fail=1
	fi
else
	echo "the first histd did not start"
	cat "$dir/first.log"
	fail=1
fi
kill "$first"
wait "$first"
exit $fail
