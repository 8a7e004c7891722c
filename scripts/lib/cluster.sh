# Shared by scripts/test, scripts/demo and scripts/bench: a throw-away PostgreSQL cluster with the extension
# preloaded, and the project's own provider test server. PostgreSQL refuses to run as root, so the cluster
# belongs to the postgres user; everything listens on 127.0.0.1 only.
PG_BIN=$(/usr/bin/pg_config --bindir)

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start_cluster DIR PORT [extra postgresql.conf lines...]; RAG_PRELOAD=0 starts it without the extension loaded.
start_cluster() {
  local dir=$1 port=$2; shift 2
  rm -rf "$dir"
  install -d -o postgres -g postgres "$dir"
  as_postgres "$PG_BIN/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log"; return 1; }
  {
    echo "listen_addresses = '127.0.0.1'"
    echo "port = $port"
    echo "unix_socket_directories = '$dir'"
    [ "${RAG_PRELOAD:-1}" = 1 ] && echo "shared_preload_libraries = 'rag'"
    echo "max_worker_processes = 16"
    echo "fsync = off"
    # synchronous_commit stays on: the crash tests need every committed batch to survive a SIGKILL reset.
    echo "full_page_writes = off"
    echo "log_min_messages = warning"
    echo "log_line_prefix = '%m [%p] %b '"
    for line in "$@"; do echo "$line"; done
  } >>"$dir/data/postgresql.conf"
  # RUST_BACKTRACE=1 on purpose: the extension must keep backtraces out of what clients see whatever the
  # environment says, and every test that compares an error proves it does.
  as_postgres env RUST_BACKTRACE="${RAG_RUST_BACKTRACE:-1}" "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null \
    || { cat "$dir/server.log"; return 1; }
}

stop_cluster() {
  local dir=$1
  [ -f "$dir/data/postmaster.pid" ] && as_postgres "$PG_BIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1
  return 0
}

# start_provider DIR: starts testkit/provider_server.py, sets PROVIDER_PORT and PROVIDER_PID.
start_provider() {
  local dir=$1
  rm -f "$dir/provider.port"
  python3 "$ROOT/testkit/provider_server.py" --port 0 --port-file "$dir/provider.port" --idle-exit 1800 \
    >"$dir/provider.log" 2>&1 &
  PROVIDER_PID=$!
  for _ in $(seq 1 100); do
    [ -s "$dir/provider.port" ] && break
    sleep 0.05
  done
  PROVIDER_PORT=$(cat "$dir/provider.port")
}

stop_provider() {
  [ -n "${PROVIDER_PID:-}" ] && kill "$PROVIDER_PID" 2>/dev/null
  return 0
}
