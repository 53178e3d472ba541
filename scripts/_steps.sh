# Shared by gpu_check.sh and mac_check.sh: `step NAME CMD...` runs CMD with its output in $LOGS/NAME.log and
# prints one line: PASS NAME, FAIL NAME with the log's last line, or INCONCLUSIVE NAME with it when CMD exits 10
# (a check that could decide nothing: neither a pass nor a failure); `skip NAME WHY` prints SKIP NAME: WHY.
# With RECORD set, every line printed and every step's whole log are appended to that file, in order.
FAILED=0
PASSED=0
UNDECIDED=0
say() {
  echo "$1"
  if [ -n "${RECORD:-}" ]; then echo "$1" >>"$RECORD"; fi
}
step() {
  local name="$1" rc=0; shift
  "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  if [ -n "${RECORD:-}" ]; then
    { echo "---- $name: $* (exit $rc)"; cat "$LOGS/$name.log"; } >>"$RECORD"
  fi
  if [ "$rc" -eq 0 ]; then
    say "PASS $name"
    PASSED=$((PASSED + 1))
  elif [ "$rc" -eq 10 ]; then
    say "INCONCLUSIVE $name: $(tail -n 1 "$LOGS/$name.log") (log: $LOGS/$name.log)"
    UNDECIDED=$((UNDECIDED + 1))
  else
    say "FAIL $name: $(tail -n 1 "$LOGS/$name.log") (log: $LOGS/$name.log)"
    FAILED=$((FAILED + 1))
  fi
  return "$rc"
}
skip() { say "SKIP $1: $2"; }
finish() {
  say "$1: $PASSED passed, $FAILED failed$([ "$UNDECIDED" -gt 0 ] && echo ", $UNDECIDED inconclusive")"
  [ "$FAILED" -eq 0 ]
}
