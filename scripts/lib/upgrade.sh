# The upgrade test (tests/upgrade): the previous release built from its tag, installed, filled with data, then
# replaced by this release's files and brought up with ALTER EXTENSION rag UPDATE. Sourced by scripts/test;
# needs scripts/lib/cluster.sh and ROOT.

# The release this one upgrades from, its tag, and the commit the tag names (for a clone without tags).
PREVIOUS_RELEASE=0.1.0
PREVIOUS_RELEASE_TAG=v0.1.0
PREVIOUS_RELEASE_COMMIT=54c491d02006f7b8b908596bd85229a6eedfccb2

# Its source tree, build and package, under target/ so they are kept between runs like every build.
previous_release_dir() { echo "$ROOT/target/v$PREVIOUS_RELEASE"; }

# build_previous_release PG_CONFIG: the previous release's library and install script, built once from its
# source (a few minutes the first time; kept under target/ like every build).
build_previous_release() {
  local pg_config=$1 dir ref built
  dir=$(previous_release_dir)
  built="$dir/package$("$pg_config" --pkglibdir)/rag.so"
  if [ ! -f "$built" ]; then
    ref=$PREVIOUS_RELEASE_TAG
    git -C "$ROOT" rev-parse -q --verify "$ref^{commit}" >/dev/null || ref=$PREVIOUS_RELEASE_COMMIT
    git -C "$ROOT" rev-parse -q --verify "$ref^{commit}" >/dev/null \
      || { echo "neither tag $PREVIOUS_RELEASE_TAG nor commit $PREVIOUS_RELEASE_COMMIT is in this clone"; return 1; }
    rm -rf "$dir/package" && mkdir -p "$dir"
    git -C "$ROOT" archive "$ref" | tar -x -C "$dir" || return 1
    (cd "$dir" && cargo pgrx package --debug --pg-config "$pg_config" \
       --out-dir "$dir/package" >"$dir/build.log" 2>&1) || { tail -30 "$dir/build.log"; return 1; }
  fi
  # The install script kept in the repository must be the one that release really ran. pgrx orders its blocks by
  # a dependency graph whose ties it does not keep stable, so the blocks are compared as a set.
  python3 - "$dir/package$("$pg_config" --sharedir)/extension/rag--$PREVIOUS_RELEASE.sql" \
            "$ROOT/sql/rag--$PREVIOUS_RELEASE.sql" <<'PY' \
    || { echo "sql/rag--$PREVIOUS_RELEASE.sql differs from what release $PREVIOUS_RELEASE generates"; return 1; }
import sys
blocks = [sorted(open(p).read().split("/* <begin connected objects> */")) for p in sys.argv[1:]]
sys.exit(blocks[0] != blocks[1])
PY
}

# install_previous_release PG_CONFIG: its library, control file and install script, as its package had them.
install_previous_release() {
  local pg_config=$1 dir
  dir=$(previous_release_dir)
  install -m 0755 "$dir/package$("$pg_config" --pkglibdir)/rag.so" "$("$pg_config" --pkglibdir)/rag.so"
  install -m 0644 "$dir/package$("$pg_config" --sharedir)/extension/"rag* "$("$pg_config" --sharedir)/extension/"
}

# install_release_scripts PG_CONFIG: every released install script kept in sql/ (cargo pgrx install copies only
# this version's and the upgrade scripts), so CREATE EXTENSION rag VERSION '<old>' works as it did.
install_release_scripts() {
  local pg_config=$1 script
  for script in "$ROOT"/sql/rag--*.sql; do
    case "$(basename "$script")" in
      rag--*--*) ;;
      *) install -m 0644 "$script" "$("$pg_config" --sharedir)/extension/" ;;
    esac
  done
}

# upgrade_fill PG_CONFIG: phase one, with the previous release installed. Leaves the cluster stopped.
upgrade_fill() {
  local pg_config=$1
  build_previous_release "$pg_config" || return 1
  install_previous_release "$pg_config"
  UPGRADE_PORT=$(free_port)
  start_cluster "$WORK/upgrade" "$UPGRADE_PORT" \
    "rag.ollama_url = 'http://127.0.0.1:$PROVIDER_PORT'" "rag.naptime = '200ms'" "rag.launcher_naptime = '1s'" || return 1
  PGPORT=$UPGRADE_PORT python3 "$ROOT/tests/upgrade/test_upgrade.py" fill >"$WORK/upgrade/fill.log" 2>&1
  local status=$?
  as_postgres "$PG_BIN/pg_ctl" -D "$WORK/upgrade/data" -m fast -w stop >/dev/null 2>&1
  [ $status -eq 0 ] || { tail -30 "$WORK/upgrade/fill.log"; return 1; }
}

# upgrade_check LOG: phase two, after this release's files were installed: the same data directory started
# again, then tests/upgrade/test_upgrade.py. Writes unittest's output to LOG.
upgrade_check() {
  local log=$1 status
  as_postgres env RUST_BACKTRACE=1 "$PG_BIN/pg_ctl" -D "$WORK/upgrade/data" -l "$WORK/upgrade/server.log" -w -t 60 \
    start >/dev/null || { tail -20 "$WORK/upgrade/server.log"; return 1; }
  (cd "$ROOT/tests/upgrade" && PGPORT=$UPGRADE_PORT RAG_UPGRADE_LOG="$WORK/upgrade/server.log" \
     RAG_NEW_VERSION=$(cargo metadata --no-deps --format-version 1 \
                       | python3 -c 'import json,sys; print([p for p in json.load(sys.stdin)["packages"] if p["name"] == "rag"][0]["version"])') \
     python3 -m unittest -v test_upgrade >"$log" 2>&1)
  status=$?
  stop_cluster "$WORK/upgrade"
  return $status
}
