# Sourced by run.sh (EXTRA=scripts/device/cycle8.sh) once the server is up and migrated: the
# cycle scenario at 8 processes, this checkout's engine against turn 3 (.devbench/t3, see run.sh).
G=$OUT/70-cycle8.log
timeout 150 "$PY" manage.py lease_bench --scenario cycle --processes 8 --rounds 2 --contenders engine,lease-floor,before \
    --before "$REPO/.devbench/t3" --database "$URL" --out "$RES/cycle8" 2>&1 | tail -n 8 | tee "$G"
say "cycle8 done at $(elapsed)s"
