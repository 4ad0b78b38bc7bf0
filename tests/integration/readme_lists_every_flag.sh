#!/bin/sh
# Every option histd --help lists is in README's configuration table, with
# its environment variable, so the reference cannot fall behind the code.
#   readme_lists_every_flag.sh HISTD README
histd=$1 readme=$2
pass=0 fail=0
for flag in $("$histd" --help | sed -n 's/^  --\([a-z0-9-]*\)  (\(HISTD_[A-Z0-9_]*\)).*/\1:\2/p'); do
	name=${flag%%:*} env=${flag#*:}
	if grep -q -- "| \`--$name\` | \`$env\` |" "$readme"; then
		pass=$((pass + 1))
	else
		echo "missing from README: --$name ($env)"
		fail=$((fail + 1))
	fi
done
echo "$pass passed, $fail failed"
[ "$pass" -gt 0 ] && [ "$fail" -eq 0 ]
