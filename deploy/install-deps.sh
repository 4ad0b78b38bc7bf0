#!/bin/sh
# Installs the Debian 12 packages histd needs to build, run and test.
# Run as root. Safe to run again: apt-get skips what is installed.
set -eu

PKGS="
build-essential cmake pkg-config git ca-certificates
libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev grpc-proto
libpq-dev postgresql-15 postgresql-client-15
libcurl4-openssl-dev libjansson-dev libyaml-dev libmicrohttpd-dev
zlib1g-dev uuid-dev libcmocka-dev
python3 python3-grpcio python3-protobuf protobuf-compiler-grpc
valgrind procps openssl
clang libclang-rt-14-dev nodejs
"

missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
		missing="$missing $p"
done
# npm: part of some nodejs builds, a package of its own in Debian's.
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing packages:$missing (run as root to install them)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing
