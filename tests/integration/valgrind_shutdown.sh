#!/bin/sh
# histd under valgrind, on the memory and the file driver:
#   valgrind_shutdown.sh HISTD HISTCTL
# or on the postgres driver, in a database of its own on the pg fixture's
# cluster (tests/pg/pgtest.sh):
#   valgrind_shutdown.sh HISTD HISTCTL postgres PGTEST.SH STATE
# Each server is driven through histctl over a real channel: sessions,
# appends with tool calls, both views, Export and Import, Reduce,
# resolve, errors, and a live Subscribe (tail -f); SIGTERM arrives with
# the Subscribe open and a loop of Appends running. Passes when histd
# exits 0 and valgrind finds no memory error and nothing definitely,
# indirectly or possibly lost; the stream must have received the live
# message and then ended with UNAVAILABLE; and at --log-level warn,
# histd (its drivers included) writes no info line.
set -eu
histd=$1 histctl=$2 only=${3:-}
dir=$(mktemp -d)
pid=
tailpid=
loadpid=
db=
psql=
cleanup() {
	[ -n "$loadpid" ] && kill "$loadpid" 2>/dev/null || true
	[ -n "$tailpid" ] && kill "$tailpid" 2>/dev/null || true
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	[ -n "$db" ] && $psql -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1
	rm -rf "$dir"
}
trap cleanup EXIT

fail() {
	echo "FAIL ($driver): $*" >&2
	for f in "$dir"/valgrind.log "$dir"/histd.err "$dir"/tail.out \
		"$dir"/cmd.out; do
		[ -s "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }
	done
	exit 1
}

# wait_until WHAT CMD...: runs CMD until it succeeds, for 30 s at most;
# then fails with "WHAT".
wait_until() {
	what=$1
	shift
	i=0
	until "$@"; do
		i=$((i + 1))
		[ $i -gt 600 ] && fail "$what"
		sleep 0.05
	done
}

# Whether histd wrote its port; fails if it exited instead.
serving() {
	[ -s "$dir/port" ] && return 0
	kill -0 "$pid" 2>/dev/null || fail "histd exited at start"
	return 1
}

ended() {
	! kill -0 "$1" 2>/dev/null
}

# Appends until one fails (the server went away).
load() {
	n=0
	while "$histctl" --target "127.0.0.1:$port" --timeout 30 append a \
		"load $n" >/dev/null 2>&1; do
		n=$((n + 1))
		echo "$n" >"$dir/load.count"
	done
}

# ctl ARGS...: must succeed; its output is left in $dir/cmd.out.
ctl() {
	"$histctl" --target "127.0.0.1:$port" --timeout 30 "$@" \
		>"$dir/cmd.out" 2>&1 || fail "histctl $* failed"
}

# ctl_fails PATTERN ARGS...: must fail with PATTERN in its message.
ctl_fails() {
	want=$1
	shift
	if "$histctl" --target "127.0.0.1:$port" --timeout 30 "$@" \
		>"$dir/cmd.out" 2>&1; then
		fail "histctl $* succeeded; expected $want"
	fi
	grep -q "$want" "$dir/cmd.out" || fail "histctl $*: expected $want"
}

# run DRIVER [ARGS...]: one server under valgrind, ARGS for its driver.
run() {
	driver=$1
	shift
	rm -rf "$dir/data" "$dir/port" "$dir/tail.out" "$dir/histd.err"
	valgrind --leak-check=full --show-leak-kinds=definite,indirect,possible \
		--errors-for-leak-kinds=definite,indirect,possible \
		--error-exitcode=99 --log-file="$dir/valgrind.log" \
		"$histd" --auth-disabled --driver "$driver" "$@" \
		--listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn \
		2>"$dir/histd.err" &
	pid=$!
	wait_until "histd did not start under valgrind" serving
	port=$(cat "$dir/port")

	ctl health
	ctl create --id a --label team=x
	ctl append a "What is in the file?"
	printf '%s' '{"role": "assistant", "content": [{"tool_call": {"id": "c1", "name": "read_file", "arguments": "{\"path\": \"a.txt\"}"}}]}' \
		>"$dir/call.json"
	ctl append a --json-input --file "$dir/call.json"
	printf '%s' '{"role": "tool", "content": [{"tool_result": {"tool_call_id": "c1", "content": [{"text": {"text": "the file says hello"}}]}}]}' \
		>"$dir/result.json"
	ctl append a --json-input --file "$dir/result.json"
	ctl append a --role assistant "It says hello."
	ctl get a --view context
	grep -q "It says hello." "$dir/cmd.out" || fail "context view lost a message"
	ctl export a --format anthropic-messages
	cp "$dir/cmd.out" "$dir/export.json"
	ctl create --id b
	ctl import b --format anthropic-messages "$dir/export.json"
	ctl get b
	grep -q "the file says hello" "$dir/cmd.out" || fail "import lost the tool result"
	ctl resolve --key user=u1 --label team=x
	ctl list --label team=x
	ctl session a
	ctl_fails "INVALID_ARGUMENT" append a --role tool "no call to answer"
	ctl_fails "NOT_FOUND" get no-such-session
	ctl_fails "ABORTED" append a --revision 1 "stale"
	ctl reduce a
	ctl delete b

	"$histctl" --target "127.0.0.1:$port" tail a -f >"$dir/tail.out" 2>&1 &
	tailpid=$!
	wait_until "the Subscribe did not replay" \
		grep -q "It says hello." "$dir/tail.out"
	ctl append a "live message"
	wait_until "the Subscribe did not deliver the live message" \
		grep -q "live message" "$dir/tail.out"

	rm -f "$dir/load.count"
	load &
	loadpid=$!
	wait_until "the Append loop did not start" test -s "$dir/load.count"
	kill -TERM "$pid"
	rc=0
	wait "$pid" || rc=$?
	pid=
	[ $rc -eq 0 ] || fail "histd under valgrind exited $rc (99: valgrind found errors)"
	wait_until "the Subscribe stream did not end" ended "$tailpid"
	tailpid=
	wait_until "the Append loop did not end" ended "$loadpid"
	loadpid=
	grep -q "UNAVAILABLE" "$dir/tail.out" ||
		fail "the Subscribe stream did not end with UNAVAILABLE"
	grep -q "ERROR SUMMARY: 0 errors" "$dir/valgrind.log" ||
		fail "valgrind reported errors"
	! grep -q '"level":"info"' "$dir/histd.err" ||
		fail "an info line was written at --log-level warn"
	echo "$driver: exit 0 under valgrind after $(cat "$dir/load.count") Appends of the loop; $(grep -o 'definitely lost: .*' "$dir/valgrind.log" || echo 'no leaks in use at exit')"
}

case "$only" in
"")
	run memory
	run file --data-dir "$dir/data"
	;;
postgres)
	pgtest=$4 state=$5
	dsn=$(sh "$pgtest" dsn "$state")
	[ -n "$dsn" ] || { echo "no PostgreSQL cluster in $state" >&2; exit 1; }
	psql="$(sh "$pgtest" bin)/psql -X -q -d postgres -h $(sed -n 's/^dir=//p' "$state") -p $(sed -n 's/^port=//p' "$state") -U histd"
	db=valgrind_$$
	$psql -c "CREATE DATABASE $db" >/dev/null
	run postgres --dsn "$(echo "$dsn" | sed "s/dbname=[^ ]*/dbname=$db/")" \
		--pool-size 2
	;;
*)
	echo "usage: valgrind_shutdown.sh HISTD HISTCTL [postgres PGTEST.SH STATE]" >&2
	exit 2
	;;
esac
