#!/usr/bin/env bash
# Runs the README's demo (`python -m batchpart demo`) N times in a row (default 100), each
# under a time limit, and prints how many finished, failed or hung, with the slowest run.
# Usage: scripts/demo_soak.sh [N] [PYTHON]   (PYTHON defaults to .venv/bin/python)
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-100}
python=${2:-.venv/bin/python}
limit=600   # seconds; a run takes 10-30 s on 2 cores
ok=0 failed=0 hung=0 slowest=0
log=$(mktemp)
for i in $(seq 1 "$runs"); do
  start=$SECONDS
  timeout "$limit" "$python" -m batchpart demo >"$log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  (( took > slowest )) && slowest=$took
  if [ "$rc" -eq 0 ]; then
    ok=$((ok + 1))
  elif [ "$rc" -eq 124 ]; then
    hung=$((hung + 1)); echo "run $i: hung (stopped after $limit s); its output:"; tail -5 "$log"
  else
    failed=$((failed + 1)); echo "run $i: exit $rc; its output:"; tail -20 "$log"
  fi
  if grep -q "no result" "$log"; then echo "run $i: $(grep 'no result' "$log")"; fi
  if grep -qE '^[IWEF][0-9]{4} ' "$log"; then echo "run $i: an XLA log line reached the user"; fi
  echo "run $i: rc $rc, ${took} s"
done
rm -f "$log"
echo "demo soak: $runs runs, $ok finished, $failed failed, $hung hung; slowest ${slowest} s"
[ "$ok" -eq "$runs" ]
