# Sourced by run.sh (EXTRA=scripts/device/gap.sh) once the server is up and migrated: the disk's
# fsync, then where a hand-off's time goes (handoff_probe.py), with synchronous_commit on and off,
# and the CPU per grant of 8 processes on one lock.
G=$OUT/60-gap.log
{
    echo "== pg_test_fsync"
    as_pg "$PGBIN/pg_test_fsync" -s 1 -f "$PGROOT/fsync.test" 2>&1 | head -40
    cd "$REPO" || exit 1
    P=scripts/device/handoff_probe.py
    for sc in on off; do
        psql_ -d postgres -Atc "ALTER DATABASE rl_bench SET synchronous_commit = $sc"
        echo "== synchronous_commit=$sc: 1 process (a release hands nothing off), then 2 (each release hands off)"
        rm -f "/tmp/gap1-$sc.log" "/tmp/gap2-$sc.log"
        timeout 60 "$PY" $P cycle 5 0.005 "/tmp/gap1-$sc.log"
        "$PY" $P summary "/tmp/gap1-$sc.log"
        for _ in 1 2; do timeout 60 "$PY" $P cycle 8 0.005 "/tmp/gap2-$sc.log" & done
        wait
        "$PY" $P summary "/tmp/gap2-$sc.log"
        echo "== synchronous_commit=$sc: 8 processes on one lock, hold 5 ms, 10 s"
        for _ in 1 2 3 4 5 6 7 8; do timeout 60 "$PY" $P cycle 10 0.005 /dev/null "l8-$sc" & done
        wait
    done
} 2>&1 | tee "$G"
