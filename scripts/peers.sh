#!/usr/bin/env bash
# Peers for scripts/bench_peers.py: PostgreSQL and Redis from Debian's packages,
# listening on loopback (127.0.0.1) only, with their data in a private temporary directory.
#
#   scripts/peers.sh start    # install if missing (apt-get, needs root), start, print settings
#   scripts/peers.sh status   # print settings and whether each server answers
#   scripts/peers.sh stop     # shut both down and remove the temporary data
#
# Durability, matched to fdbqueue's embedded engine:
#   PostgreSQL  port 55432  fsync=on, synchronous_commit=on (the client may lower it per session)
#   Redis       port 56379  appendonly yes, appendfsync always   (matches sync=full)
#   Redis       port 56380  appendonly yes, appendfsync everysec (matches sync=normal)
# Both Redis servers have RDB snapshots off (--save '').
#
# Idempotent: start on running servers only prints the settings; stop on stopped ones only
# cleans up. Every wait is bounded (PEERS_WAIT seconds, default 30). Ports and the directory
# can be changed with PEERS_PG_PORT, PEERS_REDIS_PORT, PEERS_REDIS_FAST_PORT and PEERS_DIR.
# Authentication is "trust" for local connections: fine for a benchmark on one machine,
# not for anything else.
set -euo pipefail

HOST=127.0.0.1
PG_PORT=${PEERS_PG_PORT:-55432}
REDIS_PORT=${PEERS_REDIS_PORT:-56379}
REDIS_FAST_PORT=${PEERS_REDIS_FAST_PORT:-56380}
WAIT=${PEERS_WAIT:-30}
DIR=${PEERS_DIR:-${TMPDIR:-/tmp}/fdbqueue-peers-$(id -u)}
PG_DB=bench
PG_USER=postgres

say() { printf 'peers: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# Run a command as the given service user when we are root (initdb and postgres refuse root).
as_user() {
    local user=$1
    shift
    if is_root && [ "$user" != root ]; then
        runuser -u "$user" -- "$@"
    else
        "$@"
    fi
}

pg_bindir() {
    local d
    d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && printf '%s\n' "$d"
}

have_redis() { command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; }

# A daemon a package's maintainer script may have started on its default port (Debian's
# defaults also listen on loopback only); we stop it again if it was not running before.
service_running() { command -v pgrep >/dev/null 2>&1 && pgrep -x "$1" >/dev/null 2>&1; }

install_missing() {
    local pkgs=()
    [ -n "$(pg_bindir || true)" ] || pkgs+=(postgresql)
    have_redis || pkgs+=(redis-server redis-tools)
    [ ${#pkgs[@]} -eq 0 ] && return 0
    is_root || die "missing ${pkgs[*]}: run as root (apt-get) or install them first"
    command -v apt-get >/dev/null 2>&1 || die "missing ${pkgs[*]} and no apt-get"
    local redis_before=no pg_before=no
    service_running redis-server && redis_before=yes
    service_running postgres && pg_before=yes
    say "installing ${pkgs[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    timeout 600 apt-get update -q >/dev/null
    timeout 900 apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null
    # Leave no system-wide server behind that we did not ask for.
    if [ "$redis_before" = no ] && service_running redis-server; then
        say "stopping the redis-server service the package started"
        timeout "$WAIT" service redis-server stop >/dev/null 2>&1 || true
    fi
    if [ "$pg_before" = no ] && service_running postgres && command -v pg_ctlcluster >/dev/null; then
        say "stopping the postgresql service the package started"
        timeout "$WAIT" service postgresql stop >/dev/null 2>&1 || true
    fi
    [ -n "$(pg_bindir || true)" ] || die "PostgreSQL binaries not found after install"
    have_redis || die "redis-server not found after install"
}

# Bounded wait: wait_for SECONDS CMD... (polls every 0.2 s).
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

port_free() {
    # True when nothing listens on HOST:port (bash's /dev/tcp; loopback only).
    ! (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

make_dir() {
    if [ -e "$DIR" ]; then
        [ -O "$DIR" ] || die "$DIR exists and belongs to someone else"
    else
        mkdir -p "$DIR"
    fi
    chmod 0755 "$DIR"
}

# -- PostgreSQL ----------------------------------------------------------------------------

pg_running() {
    local bin
    bin=$(pg_bindir) || return 1
    [ -f "$DIR/pg/PG_VERSION" ] && as_user "$PG_USER" "$bin/pg_ctl" -D "$DIR/pg" status >/dev/null 2>&1
}

pg_start() {
    local bin
    bin=$(pg_bindir)
    if pg_running; then
        say "PostgreSQL already running on $HOST:$PG_PORT"
        return 0
    fi
    port_free "$PG_PORT" || die "port $PG_PORT on $HOST is taken by another program"
    if [ ! -f "$DIR/pg/PG_VERSION" ]; then
        rm -rf "$DIR/pg" "$DIR/pgsock"
        mkdir -p "$DIR/pg" "$DIR/pgsock"
        is_root && chown "$PG_USER:" "$DIR/pg" "$DIR/pgsock"
        chmod 0700 "$DIR/pg"
        as_user "$PG_USER" "$bin/initdb" -D "$DIR/pg" -U "$PG_USER" -E UTF8 --locale=C \
            --auth-local=trust --auth-host=trust >"$DIR/initdb.log" 2>&1 ||
            die "initdb failed, see $DIR/initdb.log"
        cat >>"$DIR/pg/postgresql.conf" <<EOF

# fdbqueue peers (scripts/peers.sh): loopback only, durable commits.
listen_addresses = '$HOST'
port = $PG_PORT
unix_socket_directories = '$DIR/pgsock'
fsync = on
synchronous_commit = on
full_page_writes = on
max_connections = 40
EOF
        # Only loopback and the private socket may connect.
        cat >"$DIR/pg/pg_hba.conf" <<EOF
local all all trust
host all all 127.0.0.1/32 trust
EOF
    fi
    touch "$DIR/pg.log"
    is_root && chown "$PG_USER:" "$DIR/pg.log"
    as_user "$PG_USER" "$bin/pg_ctl" -D "$DIR/pg" -l "$DIR/pg.log" -w -t "$WAIT" start >/dev/null ||
        die "PostgreSQL did not start within ${WAIT}s, see $DIR/pg.log"
    wait_for "$WAIT" as_user "$PG_USER" "$bin/pg_isready" -h "$HOST" -p "$PG_PORT" ||
        die "PostgreSQL does not answer on $HOST:$PG_PORT"
    if ! as_user "$PG_USER" "$bin/psql" -h "$HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
        as_user "$PG_USER" "$bin/psql" -h "$HOST" -p "$PG_PORT" -U "$PG_USER" -d postgres -q \
            -c "CREATE DATABASE $PG_DB" >/dev/null
    fi
    say "PostgreSQL started on $HOST:$PG_PORT"
}

pg_stop() {
    local bin
    bin=$(pg_bindir 2>/dev/null) || return 0
    if pg_running; then
        as_user "$PG_USER" "$bin/pg_ctl" -D "$DIR/pg" -m fast -w -t "$WAIT" stop >/dev/null ||
            die "PostgreSQL did not stop within ${WAIT}s"
        say "PostgreSQL stopped"
    fi
}

# -- Redis ---------------------------------------------------------------------------------

redis_user() { if is_root && id redis >/dev/null 2>&1; then echo redis; else id -un; fi; }

redis_running() { # port
    [ -f "$DIR/redis-$1.pid" ] && kill -0 "$(cat "$DIR/redis-$1.pid")" 2>/dev/null &&
        timeout 5 redis-cli -h "$HOST" -p "$1" ping 2>/dev/null | grep -q PONG
}

redis_start() { # port fsync-policy
    local port=$1 policy=$2 user
    if redis_running "$port"; then
        say "Redis (appendfsync $policy) already running on $HOST:$port"
        return 0
    fi
    port_free "$port" || die "port $port on $HOST is taken by another program"
    user=$(redis_user)
    mkdir -p "$DIR/redis-$port"
    is_root && chown "$user:" "$DIR/redis-$port"
    touch "$DIR/redis-$port.log" "$DIR/redis-$port.pid"
    is_root && chown "$user:" "$DIR/redis-$port.log" "$DIR/redis-$port.pid"
    as_user "$user" redis-server --port "$port" --bind "$HOST" --protected-mode yes \
        --appendonly yes --appendfsync "$policy" --save '' \
        --dir "$DIR/redis-$port" --daemonize yes \
        --pidfile "$DIR/redis-$port.pid" --logfile "$DIR/redis-$port.log" ||
        die "redis-server failed to start on $HOST:$port, see $DIR/redis-$port.log"
    wait_for "$WAIT" redis_running "$port" ||
        die "Redis did not answer on $HOST:$port within ${WAIT}s, see $DIR/redis-$port.log"
    say "Redis (appendfsync $policy) started on $HOST:$port"
}

redis_stop() { # port
    local port=$1 pid
    [ -f "$DIR/redis-$port.pid" ] || return 0
    pid=$(cat "$DIR/redis-$port.pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    # Only our own server: the pid file lives in our directory.
    timeout 10 redis-cli -h "$HOST" -p "$port" shutdown nosave >/dev/null 2>&1 || true
    if ! wait_for "$WAIT" bash -c "! kill -0 $pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        wait_for 10 bash -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null || true
    fi
    say "Redis on $HOST:$port stopped"
}

# -- Commands ------------------------------------------------------------------------------

settings() {
    cat <<EOF
PEERS_PG_DSN=postgresql://$PG_USER@$HOST:$PG_PORT/$PG_DB
PEERS_REDIS_URL=redis://$HOST:$REDIS_PORT/0
PEERS_REDIS_FAST_URL=redis://$HOST:$REDIS_FAST_PORT/0
EOF
}

versions() {
    local bin
    bin=$(pg_bindir 2>/dev/null || true)
    [ -n "$bin" ] && say "$("$bin/postgres" --version)"
    have_redis && say "$(redis-server --version | cut -d' ' -f1-3)"
    return 0
}

cmd=${1:-}
case "$cmd" in
start)
    install_missing
    make_dir
    pg_start
    redis_start "$REDIS_PORT" always
    redis_start "$REDIS_FAST_PORT" everysec
    versions
    say "data in $DIR; stop with: scripts/peers.sh stop"
    settings
    ;;
stop)
    redis_stop "$REDIS_PORT"
    redis_stop "$REDIS_FAST_PORT"
    pg_stop
    if [ -e "$DIR" ]; then
        [ -O "$DIR" ] || die "$DIR belongs to someone else; not removing it"
        rm -rf "$DIR"
        say "removed $DIR"
    fi
    ;;
status)
    if pg_running; then say "PostgreSQL: running"; else say "PostgreSQL: not running"; fi
    for p in "$REDIS_PORT" "$REDIS_FAST_PORT"; do
        if redis_running "$p"; then say "Redis $p: running"; else say "Redis $p: not running"; fi
    done
    settings
    ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
