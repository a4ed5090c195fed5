# Sourced by run.sh (EXTRA=scripts/device/cycles.sh) once the server is up and migrated: each
# checkout's own cycle_cost, this one and turn 3 (.devbench/t3, see run.sh), alternately, three times.
G=$OUT/70-cycles.log
{
    psql_ -d postgres -Atc "CREATE DATABASE rl_t3"
    T3URL=postgres://postgres@127.0.0.1:$PGPORT/rl_t3
    (cd .devbench/t3 && DATABASE_URL=$T3URL PYTHONPATH=/tmp/site:$PWD timeout 180 "$PY" manage.py migrate -v0) && echo "t3 migrated"
    for r in 1 2 3; do
        echo "== now, round $r"
        timeout 90 "$PY" manage.py cycle_cost --cycles 2000 --rounds 3
        echo "== turn 3 (70ca3fa), round $r"
        (cd .devbench/t3 && DATABASE_URL=$T3URL PYTHONPATH=/tmp/site:$PWD timeout 90 "$PY" manage.py cycle_cost --cycles 2000 --rounds 3)
    done
} 2>&1 | tee "$G"
