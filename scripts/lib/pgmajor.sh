# PostgreSQL majors that Debian 12 does not package, built once from Debian's source archive into their own
# prefix (no system service, no cluster), with pgvector for them and PostgreSQL's regression suite beside.
# Sourced by scripts/setup. Only 18 is reachable from these machines (16 is not listed in any suite's source
# archive, 17's files answer 404), so 18 is what scripts/test runs beside the system's 15.

RAG_PG_PREFIX_ROOT=${RAG_PG_PREFIX_ROOT:-/usr/local/rag-pg}
PG_SUITE_ROOT=${RAG_PG_SUITE_ROOT:-/usr/local/src/rag-pg-suite}

# pg_config of a major: the system's for 15, ours for the others.
pg_config_for() {
  if [ "$1" = 15 ]; then echo /usr/bin/pg_config; else echo "$RAG_PG_PREFIX_ROOT/$1/bin/pg_config"; fi
}

# apt_source_private SUITE PACKAGE DIR: `apt-get source` from SUITE without touching the system's apt sources.
apt_source_private() {
  local suite=$1 package=$2 dir=$3
  mkdir -p "$dir/lists/partial"
  echo "deb-src http://deb.debian.org/debian $suite main" >"$dir/sources.list"
  local apt_opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
                  -o "Dir::State::Lists=$dir/lists")
  apt-get "${apt_opts[@]}" update -qq || return 1
  (cd "$dir" && apt-get "${apt_opts[@]}" source -qq "$package" >/dev/null 2>&1)
}

# build_pg_major MAJOR: server, headers and client tools into $RAG_PG_PREFIX_ROOT/MAJOR (about 5.5 min on two
# cores), and the regression suite in the source tree kept at $PG_SUITE_ROOT/MAJOR. Idempotent.
build_pg_major() {
  local major=$1 prefix work src
  prefix=$RAG_PG_PREFIX_ROOT/$major
  if [ -x "$prefix/bin/postgres" ] && [ -x "$PG_SUITE_ROOT/$major/src/test/regress/pg_regress" ]; then return 0; fi
  work=$(mktemp -d)
  apt_source_private sid "postgresql-$major" "$work" || { rm -rf "$work"; return 1; }
  src=$(find "$work" -maxdepth 1 -type d -name "postgresql-$major-*" | head -n1)
  [ -n "$src" ] || { rm -rf "$work"; return 1; }
  # Without ICU and readline: neither is needed by the extension or its tests, and both would pull -dev
  # packages whose versions must match the system's libraries.
  (cd "$src" && ./configure -q --prefix="$prefix" --without-icu --without-readline >"$work/configure.log" 2>&1 \
     && make -s -j"$(nproc)" >"$work/make.log" 2>&1 \
     && make -s install >"$work/install.log" 2>&1 \
     && make -s -C src/test/regress >>"$work/make.log" 2>&1) \
    || { tail -30 "$work"/*.log; rm -rf "$work"; return 1; }
  rm -rf "${PG_SUITE_ROOT:?}/$major"
  mkdir -p "$PG_SUITE_ROOT"
  mv "$src" "$PG_SUITE_ROOT/$major"
  # The server (user postgres) creates the tablespace test's directory under the suite's output directory.
  chown -R postgres:postgres "$PG_SUITE_ROOT/$major"
  rm -rf "$work"
}

# build_pgvector PG_CONFIG: pgvector from Debian's source package for that server. 0.8.0 is the newest source
# reachable; it predates PostgreSQL 18, whose API changed in two places it uses (see patch_pgvector_for_18).
build_pgvector() {
  local pg_config=$1 work src major
  [ -f "$("$pg_config" --sharedir)/extension/vector.control" ] && return 0
  major=$("$pg_config" --version | sed -E 's/.* ([0-9]+)\..*/\1/')
  work=$(mktemp -d)
  apt_source_private trixie pgvector "$work" || { rm -rf "$work"; return 1; }
  src=$(find "$work" -maxdepth 1 -type d -name 'pgvector-*' | head -n1)
  [ -n "$src" ] || { rm -rf "$work"; return 1; }
  if [ "$major" -ge 18 ]; then patch_pgvector_for_18 "$src" || { rm -rf "$work"; return 1; }; fi
  make -s -C "$src" PG_CONFIG="$pg_config" >"$work/make.log" 2>&1 \
    && make -s -C "$src" PG_CONFIG="$pg_config" install >>"$work/make.log" 2>&1 \
    || { tail -30 "$work/make.log"; rm -rf "$work"; return 1; }
  rm -rf "$work"
}

# PostgreSQL 18 gave vacuum_delay_point() a bool (is this an autovacuum-style delay: no, for index vacuum) and
# removed TupleDescData.attrs in favour of the TupleDescAttr() accessor (which older majors have too). pgvector
# upstream made the same two changes in 0.8.1; the edits are checked so a different source fails loudly.
patch_pgvector_for_18() {
  local src=$1
  grep -q 'vacuum_delay_point()' "$src/src/hnswvacuum.c" || return 0
  sed -i 's/vacuum_delay_point()/vacuum_delay_point(false)/' "$src/src/hnswvacuum.c" "$src/src/ivfvacuum.c"
  sed -i -E 's/([A-Za-z_>.-]+)->attrs\[([^]]+)\]\./TupleDescAttr(\1, \2)->/g; s/&([A-Za-z_>.-]+)->attrs\[([^]]+)\]/TupleDescAttr(\1, \2)/g' \
    "$src/src/ivfbuild.c"
  ! grep -n -- '->attrs\[' "$src/src/"*.c && ! grep -n 'vacuum_delay_point()' "$src/src/"*.c
}
