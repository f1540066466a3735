#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Runs the lguest selftest programs like the kselftest runner does: one KTAP
# document whose subtests are the programs, each program's own KTAP output
# prefixed with "# ", each under the timeout from ./settings.
#
#   ./run_tests.sh                 all programs; the long ones (fuzzers) in
#                                  their short form (LGUEST_SMOKE=1: a tenth
#                                  of the work, random seeds), or whole with
#                                  LGUEST_LONG=1
#   ./run_tests.sh PROG[:TEST] ... only these programs (or one test of one)
set -o pipefail
cd "$(dirname "$0")"
# In the project's harness the module must be there: no skipping for lack of it.
export LGUEST_REQUIRE=1
timeout=$(sed -n 's/^timeout=//p' settings 2>/dev/null)
timeout=${timeout:-300}
# The long programs run whole (LGUEST_LONG=1) get long_timeout: their work
# is fixed (a million hypercalls, say), and on the debug kernel it takes
# several times as long (2400 hypercalls/s there under TCG).
long_timeout=$(sed -n 's/^long_timeout=//p' settings 2>/dev/null)
long_timeout=${long_timeout:-$timeout}
# tests.list: one program per line; "long" after the name marks the long
# runs (fuzzers), which run whole only with LGUEST_LONG=1.
progs=$(cut -d' ' -f1 tests.list)
long=$(awk '$2 == "long" { print $1 }' tests.list)
default=$progs

if [ $# -gt 0 ]; then
	sel="$*"
else
	sel="$default"
fi
n=$(echo $sel | wc -w)
echo "TAP version 13"
echo "1..$n"
i=0
for s in $sel; do
	i=$((i + 1))
	prog=${s%%:*}
	arg=
	[ "$prog" != "$s" ] && arg=${s#*:}
	if ! echo "$progs" | grep -qx "$prog"; then
		echo "# no such test program: $prog"
		echo "not ok $i selftests: lguest: $prog"
		continue
	fi
	echo "# selftests: lguest: $prog${arg:+ $arg}"
	smoke=0
	limit=$timeout
	# The long runs (make debug-test, make fuzz) give every program the
	# long timeout: on the debug kernel lguest_run_test alone takes more
	# than 900 s (it hit that limit after 21 of its 41 tests, session 14).
	[ "${LGUEST_LONG:-0}" = 1 ] && limit=$long_timeout
	if echo "$long" | grep -qx "$prog" && [ "${LGUEST_LONG:-0}" != 1 ]; then
		smoke=1
		echo "# (short run: LGUEST_SMOKE=1)"
	fi
	LGUEST_SMOKE=$smoke timeout -s KILL "$limit" "./$prog" $arg 2>&1 | sed 's/^/# /'
	rc=$?
	case $rc in
	0) echo "ok $i selftests: lguest: $prog" ;;
	4) echo "ok $i selftests: lguest: $prog # SKIP" ;;
	137) echo "not ok $i selftests: lguest: $prog # TIMEOUT $limit seconds" ;;
	*) echo "not ok $i selftests: lguest: $prog # exit=$rc" ;;
	esac
done
