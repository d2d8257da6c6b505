#!/bin/sh
# First start: initialise PGDATA as the official postgres image does, from POSTGRES_USER
# (default postgres), POSTGRES_PASSWORD, POSTGRES_DB (default: the user's name) and
# POSTGRES_HOST_AUTH_METHOD (default scram-sha-256; "trust" needs no password). Then run the
# command, the server by default, listening on every address.
set -eu
if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    user=${POSTGRES_USER:-postgres}
    database=${POSTGRES_DB:-$user}
    method=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$method" != trust ]; then
        echo "postgres: set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)" >&2
        exit 1
    fi
    password_file=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$password_file"
    initdb --pgdata="$PGDATA" --username="$user" --pwfile="$password_file" \
        --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host="$method" >/dev/null
    rm -f "$password_file"
    echo "host all all all $method" >>"$PGDATA/pg_hba.conf"
    if [ "$database" != postgres ]; then
        # Single-user mode: no server, no socket, nothing to wait for.
        echo "CREATE DATABASE \"$database\" OWNER \"$user\"" \
            | postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
    echo "postgres: initialised $PGDATA (user $user, database $database, host auth $method)"
fi
if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
