#!/bin/sh
# histctl end to end against a real histd on a free loopback port:
#   test_histctl.sh HISTD HISTCTL
# Each check prints "ok - ..." or "not ok - ..."; the last line is
# "N passed, N failed" and the exit code is 1 if any failed.
set -u
histd=$1 histctl=$2
dir=$(mktemp -d)
pid= tailpid=
pass=0 fail=0
cleanup() {
	[ -n "$tailpid" ] && kill -9 "$tailpid" 2>/dev/null
	[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
	rm -rf "$dir"
}
trap cleanup EXIT

ok() { pass=$((pass + 1)); echo "ok - $1"; }
bad() { fail=$((fail + 1)); echo "not ok - $1"; }
check() { # check NAME COMMAND...: passes when the command succeeds
	name=$1; shift
	if "$@"; then ok "$name"; else bad "$name"; fi
}
expect_exit() { # expect_exit NAME CODE histctl-args...
	name=$1 want=$2; shift 2
	"$histctl" --target "$target" "$@" >"$dir/out" 2>"$dir/err" </dev/null
	got=$?
	if [ "$got" -eq "$want" ]; then ok "$name (exit $got)"
	else bad "$name: exit $got, want $want: $(cat "$dir/err")"; fi
}
expect_usage() { # expect_usage NAME MESSAGE histctl-args...: exit 2, MESSAGE on stderr
	name=$1 want=$2; shift 2
	"$histctl" --target "$target" "$@" >"$dir/out" 2>"$dir/err" </dev/null
	got=$?
	if [ "$got" -eq 2 ] && grep -qF -- "$want" "$dir/err"; then ok "$name (exit 2)"
	else bad "$name: exit $got, want 2 and '$want': $(cat "$dir/err")"; fi
}
ctl() { "$histctl" --target "$target" "$@"; }
json_get() { # json_get FILE PYTHON-EXPR-ON-d: prints the value
	/usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
wait_for() { # wait_for FILE PATTERN: up to 10 s
	i=0
	while ! grep -q "$2" "$1" 2>/dev/null; do
		i=$((i + 1)); [ $i -gt 200 ] && return 1; sleep 0.05
	done
}

start_histd() { # start_histd ARGS...: histd on a free port; sets pid, target
	rm -f "$dir/port"
	"$histd" --driver memory --listen 127.0.0.1:0 --port-file "$dir/port" "$@" &
	pid=$!
	i=0
	while [ ! -s "$dir/port" ]; do
		i=$((i + 1)); [ $i -gt 200 ] && { echo "histd did not start"; exit 1; }
		sleep 0.05
	done
	target="127.0.0.1:$(cat "$dir/port")"
}

start_histd --auth-disabled --log-level warn

# Sessions.
sid=$(ctl create --label app=test --key user=u1)
check "create prints the new session id" [ -n "$sid" ]
check "resolve by the same keys gives the same session" [ "$(ctl resolve --key user=u1)" = "$sid" ]
ctl create --id fixed-id >/dev/null
expect_exit "create with an existing id is ALREADY_EXISTS" 4 create --id fixed-id
expect_exit "delete removes a session" 0 delete fixed-id
expect_exit "session of an unknown id is NOT_FOUND" 3 session fixed-id
ctl list >"$dir/list"
check "list shows the session with its labels" grep -q "$sid .*app=test" "$dir/list"
ctl list --json >"$dir/list.json"
check "list --json holds the session" [ "$(json_get "$dir/list.json" 'd["sessions"][0]["id"]')" = "$sid" ]

# Append: plain text from arguments and from standard input, and JSON.
ctl append "$sid" "hello from histctl" >/dev/null
check "append text from arguments" [ $? -eq 0 ]
printf 'line one\nline two\n' | ctl append "$sid" --role assistant --author bot >"$dir/a2"
check "append text from stdin reports its seq" grep -q "^seq 2..2 revision" "$dir/a2"
cat >"$dir/msgs.json" <<'JSON'
[{"role": "assistant", "content": [{"toolCall": {"id": "call_1", "name": "get_weather",
  "arguments": "{\"city\": \"Paris\"}"}}]},
 {"role": "ROLE_TOOL", "content": [{"tool_result": {"tool_call_id": "call_1",
  "content": ["18 C, clear"]}}]},
 {"role": "assistant", "text": "18 C and clear.", "metadata": {"k": "v"}}]
JSON
ctl append "$sid" --json-input --file "$dir/msgs.json" --json >"$dir/a3.json"
check "append JSON messages as one batch" [ "$(json_get "$dir/a3.json" 'd["first_seq"]+".."+d["last_seq"]')" = "3..5" ]
echo '{"role": "robot", "text": "x"}' >"$dir/badrole.json"
expect_exit "append JSON with an unknown role is invalid input" 6 append "$sid" -J --file "$dir/badrole.json"
echo '{"role": "user"' >"$dir/broken.json"
expect_exit "append of broken JSON is invalid input" 6 append "$sid" -J --file "$dir/broken.json"
expect_exit "append with a stale revision is a conflict" 5 append "$sid" late --revision 1
expect_exit "append to an unknown session is NOT_FOUND" 3 append no-such-session hi
ctl append "$sid" again --idempotency-key k1 >/dev/null
ctl append "$sid" again --idempotency-key k1 >"$dir/replay"
check "an idempotent retry says replayed" grep -q "(replayed)" "$dir/replay"
expect_exit "the same key with another request is a conflict" 5 append "$sid" other --idempotency-key k1

# Get: table and JSON.
ctl get "$sid" >"$dir/table"
check "get prints a header" grep -q "^ *SEQ  ROLE .*CONTENT" "$dir/table"
check "get shows text on one line" grep -q "assistant  bot .*line one\\\\nline two" "$dir/table"
check "get shows tool calls and results" grep -q "tool_call call_1 get_weather" "$dir/table"
check "get shows a tool result's text" grep -q "tool_result call_1: 18 C, clear" "$dir/table"
ctl get "$sid" --json >"$dir/get.json"
check "get --json holds every message" [ "$(json_get "$dir/get.json" 'len(d["messages"])')" = 6 ]
check "get --json keeps metadata" [ "$(json_get "$dir/get.json" 'd["messages"][4]["metadata"]["k"]')" = v ]
check "get --json names roles" [ "$(json_get "$dir/get.json" 'd["messages"][3]["role"]')" = ROLE_TOOL ]
ctl get "$sid" --json --last 2 >"$dir/last.json"
check "get --last 2 returns the last two" [ "$(json_get "$dir/last.json" '[m["seq"] for m in d["messages"]]')" = "['5', '6']" ]
ctl get "$sid" --json --after 2 --limit 2 >"$dir/page.json"
check "get --after --limit pages" [ "$(json_get "$dir/page.json" '[m["seq"] for m in d["messages"]]')" = "['3', '4']" ]
ctl get "$sid" --view context >/dev/null
check "get --view context answers" [ $? -eq 0 ]
expect_exit "get with an unknown view is a usage error" 2 get "$sid" --view sideways

# Search: by words, in one session, in sessions by label, or in all.
sa=$(ctl create --label app=search)
sb=$(ctl create)
ctl append "$sa" --author finder "the zanzibar quokka report" >/dev/null
ctl append "$sa" "nothing to see" >/dev/null
ctl append "$sb" --role assistant "a quokka again" >/dev/null
ctl search quokka --session "$sa" >"$dir/search"
rc=$?
check "search prints a table of hits (exit 0)" [ "$rc" -eq 0 ]
check "search's table has a header" grep -q "^ *SCORE  SESSION .* SEQ  ROLE .*CONTENT" "$dir/search"
check "search's table shows the appended message" \
	grep -q "$sa  *1  user  *finder .*the zanzibar quokka report" "$dir/search"
check "search --session finds nothing in other sessions" [ "$(grep -c quokka "$dir/search")" -eq 1 ]
ctl search zanzibar quokka --json >"$dir/search.json"
check "search --json holds the hit with session, seq and message" \
	[ "$(json_get "$dir/search.json" 'd["hits"][0]["session_id"], d["hits"][0]["seq"], d["hits"][0]["message"]["content"][0]["text"]["text"]')" = \
	  "('$sa', '1', 'the zanzibar quokka report')" ]
check "search --json: the best hit first, every session in scope" \
	[ "$(json_get "$dir/search.json" 'sorted(h["session_id"] for h in d["hits"]) == sorted(["'"$sa"'", "'"$sb"'"]) and d["hits"][0]["score"] >= d["hits"][1]["score"]')" = True ]
ctl search quokka --label app=search --json >"$dir/search.json"
check "search --label keeps to the labelled sessions" \
	[ "$(json_get "$dir/search.json" '[h["session_id"] for h in d["hits"]]')" = "['$sa']" ]
ctl search quokka --role assistant --json >"$dir/search.json"
check "search --role keeps to that role" \
	[ "$(json_get "$dir/search.json" '[h["session_id"] for h in d["hits"]]')" = "['$sb']" ]
ctl search quokka --limit 1 --json >"$dir/search.json"
check "search --limit caps the hits" [ "$(json_get "$dir/search.json" 'len(d["hits"])')" = 1 ]
ctl search quokka --mode hybrid --json >"$dir/search.json" 2>/dev/null
check "search --mode is sent (hybrid without embeddings falls back to words)" \
	[ "$(json_get "$dir/search.json" 'd["mode"], len(d["hits"]), {"'"$sa"'", "'"$sb"'"} <= set(d.get("lexical_fallback_sessions", []))')" = \
	  "('SEARCH_MODE_LEXICAL', 2, True)" ]
expect_usage "search refuses an option it does not take" "search: unknown option --revision" \
	search quokka --revision 1
expect_usage "search refuses an unknown mode" "unknown mode 'sideways'" search quokka --mode sideways
expect_usage "search refuses an unknown role" "unknown role 'robot'" search quokka --role robot
expect_usage "search needs a query" "search: needs a query" search
expect_usage "search takes --session or --label, not both" "not both" \
	search quokka --session "$sa" --label app=search
ctl help search >"$dir/out"
check "help search lists its options" grep -q -- "--include-tool-results" "$dir/out"
ctl help >"$dir/out"
check "help lists search" grep -q "^  search QUERY" "$dir/out"

# tail -f: replays the last N, then receives live appends.
"$histctl" --target "$target" tail "$sid" -n 1 -f >"$dir/tail" 2>"$dir/tail.err" &
tailpid=$!
check "tail -f replays the last message" wait_for "$dir/tail" "again"
ctl append "$sid" "live append one" >/dev/null
ctl append "$sid" --role assistant "live append two" >/dev/null
check "tail -f receives a live append" wait_for "$dir/tail" "live append one"
check "tail -f receives a second live append" wait_for "$dir/tail" "assistant .*live append two"
kill -TERM "$tailpid"
wait "$tailpid"
rc=$?
tailpid=
check "tail -f stops with 0 on SIGTERM" [ "$rc" -eq 0 ]
"$histctl" --target "$target" tail "$sid" -n 0 -f --json >"$dir/tail.json" &
tailpid=$!
sleep 0.3
ctl append "$sid" "before delete" >/dev/null
wait_for "$dir/tail.json" "before delete"
ctl delete "$sid"
i=0
while kill -0 "$tailpid" 2>/dev/null && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.05; done
wait "$tailpid"
rc=$?
tailpid=
check "tail -f ends with 0 when the session is deleted" [ "$rc" -eq 0 ]
check "tail -f --json prints one event per line" [ "$(grep -c '"session_id"' "$dir/tail.json")" -eq 2 ]
check "tail -f --json ends with the deleted event" grep -q '"deleted"' "$dir/tail.json"

# Exit codes of the tool itself.
expect_exit "no command is a usage error" 2
expect_exit "an unknown command is a usage error" 2 frobnicate
expect_exit "an unknown option is a usage error" 2 list --frobnicate
expect_exit "a missing session id is a usage error" 2 get
expect_exit "help exits 0" 0 help
check "help text names every command" grep -q "tail ID" "$dir/out"
expect_exit "a --timeout above a day is a usage error" 2 --timeout 100000 health
check "a --timeout above a day is named in the error" grep -q -- "--timeout" "$dir/err"
expect_exit "health of a serving server is 0" 0 health
"$histctl" --target 127.0.0.1:1 --timeout 2 list >"$dir/listout" 2>"$dir/err"
rc=$?
check "an unreachable server is exit 7 (UNAVAILABLE)" [ "$rc" -eq 7 ]
check "errors are one line on stderr" [ "$(wc -l <"$dir/err")" -eq 1 ]
check "a failed list prints no table header" [ ! -s "$dir/listout" ]
sid2=$(ctl create)

# Each command takes the global options and its own, and refuses any other
# (another command's too) as a usage error naming both, before any call.
ctl session "$sid2" --json >"$dir/before.json"
expect_exit "session refuses --revision (delete's)" 2 session "$sid2" --revision 3
check "the error names the command and the option" \
	grep -q "^histctl: session: unknown option --revision" "$dir/err"
expect_exit "an option before the command is held against it too" 2 --revision 3 session "$sid2"
expect_exit "get refuses tail's -f" 2 get "$sid2" -f
check "the error names -f" grep -q "get: unknown option -f" "$dir/err"
expect_exit "list refuses --revision" 2 list --revision 1
expect_exit "health refuses --limit" 2 health --limit 1
expect_exit "a foreign option without its value is refused as foreign" 2 session "$sid2" --revision
check "... and named as such" grep -q "session: unknown option --revision" "$dir/err"
expect_exit "append refuses get's --view" 2 append "$sid2" "must not land" --view raw
check "the error names append and --view" grep -q "append: unknown option --view" "$dir/err"
expect_exit "delete refuses get's --limit" 2 delete "$sid2" --limit 1
ctl session "$sid2" --json >"$dir/after.json"
check "a refused append or delete changed nothing on the server" \
	[ "$(json_get "$dir/after.json" 'd.get("revision"), d.get("stats", {}).get("message_count")')" = \
	  "$(json_get "$dir/before.json" 'd.get("revision"), d.get("stats", {}).get("message_count")')" ]
check "a refused append appended nothing" [ "$(json_get "$dir/after.json" 'd.get("stats", {}).get("message_count", "0")')" = 0 ]
ctl help session >"$dir/out"
rc=$?
check "help COMMAND prints that command only, and exits 0" sh -c \
	"[ $rc -eq 0 ] && grep -q '^  session ID' '$dir/out' && ! grep -q -- --revision '$dir/out'"
expect_exit "help of an unknown command is a usage error" 2 help frobnicate

# The same for every command and every option of the others: the usage
# text's commands and the options each one's help lists are what it takes.
ctl help | sed -n '/^Sessions:/,/^Formats:/p' >"$dir/usage"
ctl help | sed -n '/^Options/,/^$/p' | grep -o -- '--[a-z][a-z-]*' | sort -u >"$dir/global"
flags=$(grep -o -- '--[a-z][a-z-]*' "$dir/usage" | sort -u | grep -vxF -f "$dir/global")
commands=$(sed -n 's/^  \([a-z][a-z]*\)\( .*\)\{0,1\}$/\1/p' "$dir/usage")
refused=0 taken=0 wrong=
for cmd in $commands; do
	own=$(ctl help "$cmd" | sed '/^$/q' | grep -o -- '--[a-z][a-z-]*' | sort -u)
	for flag in $flags; do
		if printf '%s\n' "$own" | grep -qx -- "$flag"; then
			# Its own: whatever else fails, not as an unknown option
			# (a closed port: nothing is changed anywhere).
			"$histctl" --target 127.0.0.1:1 --timeout 2 "$cmd" x "$flag" 1 \
				>/dev/null 2>"$dir/err" </dev/null
			if grep -q "unknown option" "$dir/err"; then wrong="$wrong $cmd:$flag"
			else taken=$((taken + 1)); fi
			continue
		fi
		"$histctl" --target "$target" "$cmd" x "$flag" 1 >/dev/null 2>"$dir/err" </dev/null
		rc=$?
		if [ "$rc" -eq 2 ] && grep -q "^histctl: $cmd: unknown option $flag " "$dir/err"; then
			refused=$((refused + 1))
		else
			wrong="$wrong $cmd$flag(exit $rc)"
		fi
	done
done
if [ -z "$wrong" ] && [ "$refused" -gt 100 ] && [ "$taken" -gt 20 ]; then
	ok "every command refuses the others' options ($refused) and takes its own ($taken)"
else
	bad "options of the wrong command ($refused refused, $taken taken):$wrong"
fi
expect_exit "export with an unknown format is a usage error" 2 export "$sid2" --format klingon
# Export, import and reduce, on a session whose compaction keeps one
# message verbatim (the default keeps 10: nothing would be reduced).
sid3=$(ctl create --config '{"pipeline": {"plugins": [{"name": "compaction", "options": {"keep_recent": "1"}}]}}')
ctl append "$sid3" "export me first" >/dev/null
ctl append "$sid3" --role assistant "export me second" >/dev/null
expect_exit "export answers OK" 0 export "$sid3" --format openai-chat
check "export's JSON holds the session's messages" \
	[ "$(json_get "$dir/out" '[(m["role"], m["content"]) for m in d["messages"]]')" = \
	  "[('user', 'export me first'), ('assistant', 'export me second')]" ]
echo '{"messages": [{"role": "user", "content": "imported hi"}]}' >"$dir/chat.json"
expect_exit "import answers OK" 0 import "$sid3" --format openai-chat "$dir/chat.json"
check "import reports the seq it appended" grep -q "^seq 3\.\.3 revision" "$dir/out"
ctl get "$sid3" --json >"$dir/get.json"
check "get shows the imported message after the others" \
	[ "$(json_get "$dir/get.json" '[m["content"][0]["text"]["text"] for m in d["messages"]]')" = \
	  "['export me first', 'export me second', 'imported hi']" ]
expect_exit "reduce answers OK" 0 reduce "$sid3" --max-entries 1
check "reduce prints the summary of all but the newest message" \
	grep -q "^summary of seq 1\.\.2 (.*): user: export me first" "$dir/out"
ctl session "$sid3" --json >"$dir/reduced.json"
check "the session counts the summary" \
	[ "$(json_get "$dir/reduced.json" 'd["stats"].get("summary_count")')" = 1 ]

kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
check "histd exits 0 on SIGTERM" [ "$rc" -eq 0 ]

# Bearer token: only where this histd has API keys.
if "$histd" --help 2>&1 | grep -q -- "--api-keys-file"; then
	printf 'key-rw-0123456789abcdef tenant-a\nkey-ro-0123456789abcdef tenant-a read-only\n' >"$dir/keys"
	start_histd --log-level warn --api-keys-file "$dir/keys"
	expect_exit "no token is UNAUTHENTICATED (exit 8)" 8 list
	expect_exit "a wrong token is UNAUTHENTICATED (exit 8)" 8 --token nope list
	expect_exit "--token is sent as a bearer token" 0 --token key-rw-0123456789abcdef create
	HISTD_TOKEN=key-rw-0123456789abcdef "$histctl" --target "$target" list >/dev/null 2>&1
	check "HISTD_TOKEN is used when --token is not given" [ $? -eq 0 ]
	expect_exit "a read-only key may not write (exit 8)" 8 --token key-ro-0123456789abcdef create
	kill -TERM "$pid"; wait "$pid"; pid=
else
	echo "# skipped: this histd has no --api-keys-file"
fi

# A histd with tiny limits: a subscriber queue of 2, pages of 5.
start_histd --auth-disabled --log-level error --subscriber-queue 2 \
	--max-page-size 5
ctl create --id small >/dev/null
for i in 1 2 3 4 5 6 7 8; do ctl append small "short $i" >/dev/null; done
ctl get small --last 8 >"$dir/last8" 2>"$dir/last8.err"
check "get --last above the page size says that fewer came back" \
	grep -q "only the newest 5 of the last 8" "$dir/last8.err"
ctl get small --json >"$dir/small.json"
check "get --json's token_estimate is the sum over every page" \
	[ "$(json_get "$dir/small.json" 'sum(int(m["token_estimate"]) for m in d["messages"]) == int(d["token_estimate"]) and len(d["messages"]) == 8')" = True ]
POSIXLY_CORRECT=1 "$histctl" --target "$target" append small "said by" --role assistant >/dev/null
ctl get small --last 1 --json >"$dir/posix.json"
check "options after arguments are read under POSIXLY_CORRECT too" \
	[ "$(json_get "$dir/posix.json" 'd["messages"][0]["role"]')" = ROLE_ASSISTANT ]
if [ -w /dev/full ]; then
	"$histctl" --target "$target" session small >/dev/full 2>"$dir/full.err"
	rc=$?
	check "output that cannot be written is exit 1 (got $rc)" [ "$rc" -eq 1 ]
fi
# tail -f that falls behind (stopped while 150 large appends go by) is
# ended by the server with where to resume, and goes on from there:
# every message is printed.
/usr/bin/python3 -c 'print("x" * 60000)' >"$dir/big.txt"
"$histctl" --target "$target" tail small -n 0 -f --json >"$dir/behind.json" 2>"$dir/behind.err" &
tailpid=$!
sleep 0.5
kill -STOP "$tailpid"
for i in $(seq 1 150); do ctl append small --file "$dir/big.txt" >/dev/null; done
kill -CONT "$tailpid"
ctl append small "the last one" >/dev/null
wait_for "$dir/behind.json" "the last one"
kill -TERM "$tailpid"; wait "$tailpid"; rc=$?; tailpid=
check "tail -f that fell behind resumes and prints every message (exit $rc)" \
	[ "$(/usr/bin/python3 -c '
import json, sys
seqs = set()
for line in open(sys.argv[1]):
    e = json.loads(line)
    for k in ("appended", "replaced"):
        for m in e.get(k, {}).get("messages", []):
            seqs.add(int(m["seq"]))
print(seqs >= set(range(10, 161)))' "$dir/behind.json")" = True ]
check "tail -f that fell behind ends with 0" [ "$rc" -eq 0 ]
kill -TERM "$pid"; wait "$pid"; pid=

# TLS and mutual TLS: a histd serving TLS is reachable (certificates made
# here by openssl, the server's for 127.0.0.1).
sh_ssl() { openssl "$@" >/dev/null 2>&1; }
sh_ssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ca \
	-keyout "$dir/ca.key" -out "$dir/ca.crt"
for who in server client; do
	if [ $who = server ]; then echo "subjectAltName=IP:127.0.0.1" >"$dir/$who.ext"
	else echo "extendedKeyUsage=clientAuth" >"$dir/$who.ext"; fi
	sh_ssl req -newkey rsa:2048 -nodes -subj "/CN=$who" \
		-keyout "$dir/$who.key" -out "$dir/$who.csr"
	sh_ssl x509 -req -in "$dir/$who.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
		-CAcreateserial -days 2 -extfile "$dir/$who.ext" -out "$dir/$who.crt"
done
start_histd --auth-disabled --log-level error --tls-cert "$dir/server.crt" \
	--tls-key "$dir/server.key" --tls-client-ca "$dir/ca.crt"
tls="--tls-ca $dir/ca.crt --tls-cert $dir/client.crt --tls-key $dir/client.key"
expect_exit "mutual TLS: --tls-ca, --tls-cert and --tls-key reach a TLS histd" 0 \
	$tls --timeout 10 health
expect_exit "mutual TLS: a call works" 0 $tls --timeout 10 create --id over-tls
expect_exit "TLS: a plaintext histctl is refused (UNAVAILABLE)" 7 --timeout 5 health
expect_exit "TLS: no client certificate is refused" 7 --timeout 5 \
	--tls-ca "$dir/ca.crt" health
expect_exit "--tls-cert without --tls-key is a usage error" 2 \
	--tls-ca "$dir/ca.crt" --tls-cert "$dir/client.crt" health
expect_exit "a --tls-ca file that cannot be read is an error" 1 \
	--tls-ca "$dir/missing.crt" health
check "a --tls-ca file that cannot be read is named" grep -q missing.crt "$dir/err"
kill -TERM "$pid"; wait "$pid"; pid=

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
