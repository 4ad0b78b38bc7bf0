#!/bin/sh
# A throwaway PostgreSQL 15 cluster for histd's tests and benchmark.
#
#   pgtest.sh start STATE   initdb a cluster in a new temp dir, start it on a
#                           free port, create the database "histd", write
#                           STATE (the dir and the DSN) and print the DSN
#   pgtest.sh dsn STATE     print the DSN of a started cluster
#   pgtest.sh stop STATE    stop it (fast) and remove the dir and STATE
#   pgtest.sh restart STATE stop (fast) and start the same cluster again
#   pgtest.sh halt STATE    stop it, keep the data (outage tests)
#   pgtest.sh resume STATE  start a halted cluster again
#   pgtest.sh freeze STATE  stop (SIGSTOP) every process of the cluster: a
#                           server that accepts nothing and answers nothing
#   pgtest.sh thaw STATE    let a frozen cluster run again (SIGCONT)
#   pgtest.sh bin           print the directory of the PostgreSQL programs
#
# PostgreSQL refuses to run as root, so under root the cluster belongs to
# an unprivileged user (PGTEST_USER, default "postgres", the Debian
# package's system user) and every server command runs through runuser.
# The socket lives in the cluster's dir; the server also listens on
# 127.0.0.1 on a port that was free when it started. Local connections
# are trusted: this is a test cluster, never a deployment.
#
# Settings are the defaults histd expects in production (deploy/postgres.md)
# with durability on (fsync, synchronous_commit): tests and benchmark
# measure what a deployment would get.
set -eu

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
PGTEST_USER=${PGTEST_USER:-postgres}

die() { echo "pgtest: $*" >&2; exit 1; }

# Runs a command as the cluster's owner.
as_owner() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u "$PGTEST_USER" -- "$@"
	else
		"$@"
	fi
}

free_port() {
	python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

state_get() { sed -n "s/^$2=//p" "$1"; }

start_server() {
	dir=$1 port=$2
	as_owner "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
		-o "-p $port -k $dir -c listen_addresses=127.0.0.1" start >/dev/null
}

cmd_start() {
	state=$1
	[ -e "$state" ] && die "$state exists: stop that cluster first"
	dir=$(mktemp -d "${TMPDIR:-/tmp}/histd-pg.XXXXXX")
	chmod 755 "$dir"
	if [ "$(id -u)" -eq 0 ]; then
		chown "$PGTEST_USER" "$dir"
	fi
	as_owner "$PGBIN/initdb" -D "$dir/data" -U histd -A trust -E UTF8 \
		--locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
		{ cat "$dir/initdb.log" >&2; die "initdb failed"; }
	cat >>"$dir/data/postgresql.conf" <<EOF
# histd test cluster
max_connections = 300
shared_buffers = 256MB
fsync = on
synchronous_commit = on
wal_level = replica
max_wal_size = 2GB
checkpoint_timeout = 15min
unix_socket_permissions = 0777
log_min_messages = warning
log_min_error_statement = panic
EOF
	# A port can be taken between the probe and the start: try a few.
	ok=0
	for _ in 1 2 3 4 5; do
		port=$(free_port)
		if start_server "$dir" "$port"; then
			ok=1
			break
		fi
	done
	[ "$ok" -eq 1 ] || { cat "$dir/server.log" >&2; die "server did not start"; }
	"$PGBIN/psql" -X -q -h "$dir" -p "$port" -U histd -d postgres \
		-c "CREATE DATABASE histd" >/dev/null
	dsn="host=$dir port=$port user=histd dbname=histd"
	printf 'dir=%s\nport=%s\ndsn=%s\n' "$dir" "$port" "$dsn" >"$state.tmp"
	mv "$state.tmp" "$state"
	echo "$dsn"
}

cmd_halt() {
	dir=$(state_get "$1" dir)
	[ -n "$dir" ] || die "no cluster in $1"
	as_owner "$PGBIN/pg_ctl" -D "$dir/data" -m "${PGTEST_STOP_MODE:-fast}" \
		-w -t 60 stop >/dev/null
}

cmd_resume() {
	dir=$(state_get "$1" dir)
	port=$(state_get "$1" port)
	[ -n "$dir" ] || die "no cluster in $1"
	start_server "$dir" "$port"
}

# The postmaster, then its children (backends, background workers): the
# postmaster first, so that it forks none after the list is made.
cluster_signal() {
	dir=$(state_get "$1" dir)
	[ -n "$dir" ] || die "no cluster in $1"
	pm=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null) || return 0
	[ -n "$pm" ] || return 0
	kill "-$2" "$pm" 2>/dev/null || true
	for child in $(pgrep -P "$pm"); do
		kill "-$2" "$child" 2>/dev/null || true
	done
}

cmd_stop() {
	state=$1
	[ -e "$state" ] || exit 0
	# A test that failed with its cluster frozen: stop it all the same.
	cluster_signal "$state" CONT
	dir=$(state_get "$state" dir)
	if [ -n "$dir" ] && [ -d "$dir/data" ]; then
		as_owner "$PGBIN/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop \
			>/dev/null 2>&1 || true
	fi
	case "$dir" in
	*/histd-pg.*) rm -rf "$dir" ;;
	esac
	rm -f "$state"
}

[ $# -ge 1 ] || die "usage: pgtest.sh start|dsn|stop|restart|halt|resume|freeze|thaw STATE | bin"
case "$1" in
start) cmd_start "$2" ;;
dsn) state_get "$2" dsn ;;
stop) cmd_stop "$2" ;;
halt) cmd_halt "$2" ;;
resume) cmd_resume "$2" ;;
restart) cmd_halt "$2"; cmd_resume "$2" ;;
freeze) cluster_signal "$2" STOP ;;
thaw) cluster_signal "$2" CONT ;;
bin) echo "$PGBIN" ;;
*) die "unknown command '$1'" ;;
esac
