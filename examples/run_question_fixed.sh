#!/bin/sh
# Starts examples/question_fixed.py as 1 ps + 3 workers on this machine and waits for all four.
# Arguments go to every task, e.g. --epochs 2 or --data-dir DIR. Exit status: 0 when every task
# exited 0, else the last non-zero status. Runs with the project's .venv when it exists.
here=$(dirname "$0")
python=$here/../.venv/bin/python
[ -x "$python" ] || python=python3
pids=""
"$python" "$here/question_fixed.py" --job ps --task 0 "$@" & pids="$pids $!"
for task in 0 1 2; do
    "$python" "$here/question_fixed.py" --job worker --task "$task" "$@" & pids="$pids $!"
done
status=0
for pid in $pids; do
    wait "$pid" || status=$?
done
exit "$status"
