# Shared by gpu_check.sh and mac_check.sh: `step NAME CMD...` runs CMD with its output in $LOGS/NAME.log and
# prints one line: PASS NAME, or FAIL NAME with the log's last line; `skip NAME WHY` prints SKIP NAME: WHY.
FAILED=0
PASSED=0
step() {
  local name="$1"; shift
  if "$@" >"$LOGS/$name.log" 2>&1; then
    echo "PASS $name"
    PASSED=$((PASSED + 1))
  else
    echo "FAIL $name: $(tail -n 1 "$LOGS/$name.log") (log: $LOGS/$name.log)"
    FAILED=$((FAILED + 1))
  fi
}
skip() { echo "SKIP $1: $2"; }
finish() {
  echo "$1: $PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
}
