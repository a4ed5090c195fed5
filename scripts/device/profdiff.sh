# Sourced by run.sh (EXTRA=scripts/device/profdiff.sh) once the server is up and migrated: the
# uncontended cycle under cProfile in this checkout and in turn 3 (.devbench/t3, see run.sh), and
# the functions whose own time per cycle differs most between the two.
G=$OUT/70-profdiff.log
{
    psql_ -d postgres -Atc "CREATE DATABASE rl_t3"
    T3URL=postgres://postgres@127.0.0.1:$PGPORT/rl_t3
    (cd .devbench/t3 && DATABASE_URL=$T3URL PYTHONPATH=/tmp/site:$PWD timeout 120 "$PY" manage.py migrate -v0) && echo "t3 migrated"
    timeout 60 "$PY" scripts/device/profile_cycle.py "$OUT/prof-now.json"
    (cd .devbench/t3 && DATABASE_URL=$T3URL PYTHONPATH=/tmp/site:$PWD timeout 60 "$PY" "$REPO/scripts/device/profile_cycle.py" "$OUT/prof-t3.json")
    "$PY" - "$OUT/prof-now.json" "$OUT/prof-t3.json" <<'PY'
import json, sys
now, t3 = (json.load(open(path)) for path in sys.argv[1:3])
total = lambda d, i: round(sum(v[i] for v in d.values()))
print(f"own time us/cycle: now {total(now, 1)}, turn 3 {total(t3, 1)}; calls: now {total(now, 0)}, turn 3 {total(t3, 0)}")
zero = [0.0, 0.0]
for key in sorted(set(now) | set(t3), key=lambda k: -abs(now.get(k, zero)[1] - t3.get(k, zero)[1]))[:45]:
    a, b = now.get(key, zero), t3.get(key, zero)
    print(f"{a[1] - b[1]:+8.1f} us  now {a[1]:7.1f} ({a[0]:4.1f} calls)  turn 3 {b[1]:7.1f} ({b[0]:4.1f})  {key}")
PY
} 2>&1 | tee "$G"
