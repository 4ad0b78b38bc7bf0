#!/bin/sh
# Installs the npm packages a package.json + package-lock.json pin, into a
# work folder outside the source tree:  npm_install.sh SRC_DIR WORK_DIR
# Runs `npm ci` only when the lock file changed since the last install, so
# repeated test runs do not touch the registry.
set -eu
src=$1 work=$2
mkdir -p "$work"
if [ -d "$work/node_modules" ] && cmp -s "$src/package-lock.json" "$work/package-lock.json"; then
	exit 0
fi
command -v npm >/dev/null || { echo "npm is not installed (deploy/install-deps.sh)" >&2; exit 1; }
cp "$src/package.json" "$src/package-lock.json" "$work/"
# No install scripts: nothing here needs one, and none should run in tests.
(cd "$work" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
