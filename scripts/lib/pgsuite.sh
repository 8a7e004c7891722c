# PostgreSQL's own regression suite, run against a cluster with `rag` preloaded and against a vanilla cluster of
# the same binaries: preloading the library must change nothing for databases that never use it (issue 16).
# Sourced by scripts/setup (build_pg_suite) and scripts/test (run_pg_suite); needs scripts/lib/cluster.sh.

PG_SUITE_ROOT=${RAG_PG_SUITE_ROOT:-/usr/local/src/rag-pg-suite}

# The regression directory of the source tree for the server's major version.
pg_suite_dir() {
  local major
  major=$("$PG_BIN/postgres" --version | sed -E 's/.* ([0-9]+)\..*/\1/')
  echo "$PG_SUITE_ROOT/$major/src/test/regress"
}

# build_pg_suite: fetches Debian's postgresql-MAJOR source package once and builds only what the suite needs
# (pg_regress, regress.so, refint.so, autoinc.so), about 45 s on two cores. Idempotent.
build_pg_suite() {
  local dir major work src
  dir=$(pg_suite_dir)
  [ -x "$dir/pg_regress" ] && [ -f "$dir/regress.so" ] && return 0
  major=$("$PG_BIN/postgres" --version | sed -E 's/.* ([0-9]+)\..*/\1/')
  work=$(mktemp -d)
  mkdir -p "$work/lists/partial"
  echo "deb-src http://deb.debian.org/debian bookworm main" >"$work/sources.list"
  local apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
                  -o "Dir::State::Lists=$work/lists")
  apt-get "${apt_opts[@]}" update -qq || return 1
  (cd "$work" && apt-get "${apt_opts[@]}" source -qq "postgresql-$major" >/dev/null 2>&1) || return 1
  src=$(find "$work" -maxdepth 1 -type d -name "postgresql-$major-*" | head -n1)
  [ -n "$src" ] || return 1
  (cd "$src" && ./configure -q --without-icu --without-readline --without-zlib >/dev/null \
     && make -s -C src/test/regress >/dev/null) || return 1
  rm -rf "$PG_SUITE_ROOT/$major"
  mkdir -p "$PG_SUITE_ROOT"
  mv "$src" "$PG_SUITE_ROOT/$major"
  # The server (user postgres) creates the tablespace test's directory under the output directory.
  chown -R postgres:postgres "$PG_SUITE_ROOT/$major"
  rm -rf "$work"
}

# pg_regress reports a test as "test name ... ok" / "     name ... FAILED" up to PostgreSQL 15, and in TAP from 16
# on: "ok 12 + name  35 ms" / "not ok 12 - name  35 ms" (+ in a parallel group, - alone).
PG_SUITE_RESULT_LINE='^((test| )? *[a-z0-9_.]+ +\.\.\. |(not )?ok [0-9]+ +[-+] +[a-z0-9_.]+ )'

# Names of the tests that failed in a pg_regress output file.
pg_suite_failures() {
  { grep -E '\.\.\. FAILED' "$1" | sed -E 's/^(test| )? *([a-z0-9_.]+) +\.\.\..*/\2/'
    grep -E '^not ok [0-9]+ +[-+] +[a-z0-9_.]+' "$1" | sed -E 's/^not ok [0-9]+ +[-+] +([a-z0-9_.]+).*/\1/'
  } | sort -u
}

# run_pg_suite_on KIND WORK_DIR SUITE_DIR: one run of the parallel schedule against a fresh cluster, vanilla or
# with rag preloaded (and a database using it, so the launcher and a worker are alive throughout).
run_pg_suite_on() {
  local kind=$1 work=$2 dir=$3 port
  port=$(free_port)
  if [ "$kind" = rag ]; then
    start_cluster "$work/suite-$kind" "$port" "rag.ollama_url = 'http://127.0.0.1:${PROVIDER_PORT:-9}'" \
      "rag.naptime = '200ms'" "rag.launcher_naptime = '2s'" || return 1
    as_postgres "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
      -c 'CREATE DATABASE rag_in_use' -c '\c rag_in_use' -c 'CREATE EXTENSION rag CASCADE' >/dev/null || return 1
  else
    # The same binaries and settings, nothing of ours loaded.
    RAG_PRELOAD=0 start_cluster "$work/suite-$kind" "$port" || return 1
  fi
  rm -rf "$work/suite-$kind/out" && install -d -o postgres -g postgres "$work/suite-$kind/out"
  (cd "$dir" && as_postgres ./pg_regress --inputdir="$dir" --bindir="$PG_BIN" --dlpath="$dir" --max-concurrent-tests=20 \
     --schedule=parallel_schedule --host=127.0.0.1 --port="$port" --user=postgres \
     --outputdir="$work/suite-$kind/out" >"$work/suite-$kind/pg_regress.log" 2>&1)
  stop_cluster "$work/suite-$kind"
  grep -qE "$PG_SUITE_RESULT_LINE" "$work/suite-$kind/pg_regress.log" || {
    tail -20 "$work/suite-$kind/pg_regress.log"; return 1; }
}

# run_pg_suite WORK_DIR: prints per-cluster results and sets PG_SUITE_TOTAL, PG_SUITE_RAG_ONLY (names of the
# tests that fail only with rag preloaded) and PG_SUITE_VANILLA_FAILED. Returns non-zero if a run did not happen.
run_pg_suite() {
  local work=$1 dir
  dir=$(pg_suite_dir)
  [ -x "$dir/pg_regress" ] || { echo "pg regression suite not built (scripts/setup builds it)"; return 1; }
  run_pg_suite_on vanilla "$work" "$dir" || return 1
  run_pg_suite_on rag "$work" "$dir" || return 1
  local rag_only
  rag_only=$(comm -13 <(pg_suite_failures "$work/suite-vanilla/pg_regress.log") \
                      <(pg_suite_failures "$work/suite-rag/pg_regress.log"))
  if [ -n "$rag_only" ]; then
    # A few of PostgreSQL's tests compare plans that depend on the visibility map, which any concurrent
    # activity can change (on a loaded two-core machine too); a failure counts only if a second run repeats it.
    echo "  failing only with rag preloaded in the first run: $(echo $rag_only | tr '\n' ' '); running again"
    cp "$work/suite-rag/pg_regress.log" "$work/suite-rag-first-run.log"
    run_pg_suite_on rag "$work" "$dir" || return 1
  fi
  PG_SUITE_TOTAL=$(grep -cE "$PG_SUITE_RESULT_LINE" "$work/suite-rag/pg_regress.log")
  PG_SUITE_VANILLA_FAILED=$(pg_suite_failures "$work/suite-vanilla/pg_regress.log" | tr '\n' ' ')
  PG_SUITE_RAG_ONLY=$(comm -12 <(echo "$rag_only" | sort) \
                               <(comm -13 <(pg_suite_failures "$work/suite-vanilla/pg_regress.log") \
                                          <(pg_suite_failures "$work/suite-rag/pg_regress.log")) | tr '\n' ' ')
  echo "  vanilla failures (minor-version drift of the suite): ${PG_SUITE_VANILLA_FAILED:-none}"
  echo "  failing only with rag preloaded: ${PG_SUITE_RAG_ONLY:-none}"
}
