-- Every statement of rag's own SQL runs with pg_catalog first, then rag, and nothing else. PostgreSQL runs an
-- extension's script with search_path set to the extension's schema (public, usually), which the database's
-- owner may create objects in (before PostgreSQL 15, everyone): pg_catalog first keeps out a function or operator
-- of the same signature as a built-in, but not one matching a call more closely (`format(text, text)` against
-- the built-in `format(text, VARIADIC "any")`, `>=(real, integer)` where pg_catalog converts the integer). Such an
-- object ran as the superuser installing or updating rag, inside the script's DO blocks, and CHECK constraints,
-- policies and views made here stayed bound to it. So public objects are named with @extschema@ (PostgreSQL
-- puts the extension's schema there) and pgvector's through its schema looked up in pg_extension, and each
-- file ends by giving back the extension's schema as the place where the Rust functions pgrx declares between
-- these files are created. Nothing made here may land in pg_catalog (tests/upgrade checks).
SET LOCAL search_path = pg_catalog, rag, pg_temp;

-- The store: every table the extension owns lives in schema rag. User-facing functions are created in the
-- extension's schema (public by default) so they can be called unqualified; helpers start with an
-- underscore and live in rag.
CREATE SCHEMA rag;
COMMENT ON SCHEMA rag IS 'Tables, views and internal functions of the rag extension';

-- Named provider configurations. A URL decides where the database sends document text, so only rag_admin
-- (through rag_create_provider) may add one. Keys are never stored here: api_key_setting says where the key
-- is, 'rag.openai_api_key' (a setting no SQL route displays) or 'file:NAME' (an entry of rag.secrets_file).
CREATE TABLE rag.providers (
    name            text PRIMARY KEY CHECK (name ~ '^[A-Za-z][A-Za-z0-9_.-]{0,62}$'),
    kind            text NOT NULL CHECK (kind IN ('ollama', 'openai', 'local')),
    base_url        text CHECK (base_url IS NULL OR base_url ~ '^https?://'),
    api_key_setting text CHECK (api_key_setting IS NULL OR api_key_setting = 'rag.openai_api_key'
                                OR api_key_setting ~ '^file:[A-Za-z0-9_.-]{1,63}$'),
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- Its creator: the name, as the record, and the role, which every decision reads (a role created later
    -- under the name, after a DROP ROLE in another database, is another role). NULL: the extension's own, or
    -- made under 0.1.0, which kept no creator.
    created_by      name,
    created_by_id   regrole
);
COMMENT ON COLUMN rag.providers.base_url IS 'NULL for kind ollama means the rag.ollama_url setting';
-- 'local' runs a sentence-embedding model inside PostgreSQL (models under rag.model_path): no server at all.
INSERT INTO rag.providers (name, kind) VALUES ('ollama', 'ollama'), ('local', 'local');

-- Which key may be sent to which server, as a superuser decided. A URL decides who receives the key in the
-- Authorization header, so a rag_admin may name a key setting only for a base URL a superuser allowed it for.
CREATE TABLE rag.key_grants (
    api_key_setting text NOT NULL,
    base_url        text NOT NULL,
    granted_by      name NOT NULL,
    granted_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (api_key_setting, base_url)
);

CREATE TABLE rag.collections (
    id                 integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name               text NOT NULL UNIQUE CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$'),
    embedding_provider text NOT NULL REFERENCES rag.providers (name),
    embedding_model    text NOT NULL CHECK (embedding_model <> ''),
    -- Learned from the first embedding when not given; never changes while vectors exist.
    dimensions         integer CHECK (dimensions BETWEEN 1 AND 16000),
    document_prefix    text NOT NULL DEFAULT '',
    query_prefix       text NOT NULL DEFAULT '',
    chunk_size         integer NOT NULL,
    chunk_overlap      integer NOT NULL,
    chunk_unit         text NOT NULL DEFAULT 'characters' CHECK (chunk_unit IN ('characters', 'tokens')),
    max_distance       double precision NOT NULL CHECK (max_distance > 0 AND max_distance <= 2),
    retry_deadline     interval CHECK (retry_deadline > interval '0'),
    -- Answering. No chat model means extractive answers: sentences quoted from the sources, no LLM.
    chat_provider      text NOT NULL DEFAULT 'ollama' REFERENCES rag.providers (name),
    chat_model         text,
    prompt_template    text CHECK (prompt_template IS NULL OR (prompt_template LIKE '%{{context}}%' AND prompt_template LIKE '%{{query}}%')),
    -- Their ranges and defaults are src/limits.rs's: the checks are added in ingest.sql, once rag._limit exists.
    context_budget     integer NOT NULL,
    max_answer_tokens  integer NOT NULL,
    -- The partial HNSW index for this collection's vectors, once the dimension is known.
    index_name         text,
    -- Which of rag.chunks' two vector columns holds the vectors searches use (see rag.migrations).
    vector_column      text NOT NULL DEFAULT 'embedding' CHECK (vector_column IN ('embedding', 'embedding_alt')),
    -- Retrieval: 'hybrid' fuses the vector and the full-text rankings (reciprocal rank fusion), 'vector' and
    -- 'keyword' use one of them; the distance ceiling applies in every mode. The text-search configuration
    -- turns chunks and questions into lexemes for the full-text side.
    search_mode        text NOT NULL DEFAULT 'hybrid' CHECK (search_mode IN ('hybrid', 'vector', 'keyword')),
    -- A text search configuration's name, cast to regconfig where it is used: pg_upgrade refuses a table with a
    -- regconfig column (its oids are not kept across an upgrade), and rag's are user tables to it. Written by
    -- rag_create_collection from a regconfig under rag's own search_path, so a configuration outside
    -- pg_catalog is schema-qualified and is read back the same way.
    text_search_config text NOT NULL DEFAULT 'english',
    -- pgvector's hnsw.ef_search for this collection's searches (candidates the HNSW scan keeps: recall against
    -- latency); NULL: the server's setting.
    ef_search          integer CHECK (ef_search BETWEEN 1 AND 1000),
    -- pgvector's HNSW build parameters for this collection's index (m: links per vector, ef_construction:
    -- candidates kept while building; a better graph, so better recall at the same ef_search, against build time
    -- and size); NULL: pgvector's defaults (16 and 64).
    hnsw_m               integer CHECK (hnsw_m BETWEEN 2 AND 100),
    hnsw_ef_construction integer CHECK (hnsw_ef_construction BETWEEN 4 AND 1000),
    -- Reranking: a cross-encoder rescores the search's best rerank_candidates chunks; a reranked chunk is used
    -- when its relevance is at least min_relevance, which then replaces the distance ceiling as the refusal
    -- threshold. The reranker is a model directory under rag.model_path (reranker_provider 'local'), or a model
    -- of an OpenAI-compatible server with /rerank. NULL: no reranking. The range of rerank_candidates is
    -- src/limits.rs's (checked in collections.sql). The reranker's first candidate also passes when it leads
    -- the second candidate by min_lead or more and is the vector side's nearest too, if it is at most min_lead
    -- below min_relevance or within max_distance (rag._close_enough; min_lead 0: the threshold alone).
    reranker           text CHECK (reranker <> ''),
    reranker_provider  text NOT NULL DEFAULT 'local' REFERENCES rag.providers (name),
    rerank_candidates  integer NOT NULL,
    min_relevance      real NOT NULL,
    min_lead           real NOT NULL CHECK (min_lead BETWEEN 0 AND 100),
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- The role that created it: it, its members and superusers hold every privilege on it.
    owner              regrole NOT NULL,
    -- How many of the collection's watches have ended (rag_unwatch, or a table dropped). Each ledger row and
    -- conversation records the count its call read before searching; an admin reads another role's only while
    -- the count is unchanged. An answer may quote rows of a table the collection no longer watches, and the rule
    -- that lets an admin read others' answers (every row the collection indexes readable to them) cannot be
    -- checked against it any more. A count rather than a time: an answer whose search saw the watch still there
    -- (its snapshot taken before the rag_unwatch committed) is caught however late it is written.
    watches_ended      integer NOT NULL DEFAULT 0
);
COMMENT ON COLUMN rag.collections.max_distance IS 'Cosine-distance ceiling: chunks farther from the question are never returned';

-- A model change in progress. The collection keeps being searched in its vector_column with its current model
-- while the worker embeds every chunk into the other column with this model; once every chunk of a ready
-- document has its vector there, one transaction builds that space's HNSW index and switches the collection to
-- it (rag._advance_migrations). 'failed': a document could not be embedded with the new model (failure_reason);
-- the collection stays as it was. 'clearing': switched or cancelled, the column left behind is being emptied.
CREATE TABLE rag.migrations (
    collection_id      integer PRIMARY KEY REFERENCES rag.collections (id) ON DELETE CASCADE,
    state              text NOT NULL DEFAULT 'embedding' CHECK (state IN ('embedding', 'failed', 'clearing')),
    embedding_provider text NOT NULL REFERENCES rag.providers (name),
    embedding_model    text NOT NULL CHECK (embedding_model <> ''),
    dimensions         integer CHECK (dimensions BETWEEN 1 AND 16000),
    document_prefix    text NOT NULL DEFAULT '',
    query_prefix       text NOT NULL DEFAULT '',
    -- The distance ceiling the collection takes when it switches: the new model's default when the collection
    -- had the old model's; NULL when its ceiling was chosen otherwise (by argument or setting), which it keeps.
    max_distance       double precision CHECK (max_distance > 0 AND max_distance <= 2),
    started_at         timestamptz NOT NULL DEFAULT now(),
    failure_reason     text
);

-- Who else may use a collection (rag_grant): read (query, prompt, ask, and its rows through SELECT), write
-- (ingest, delete documents) or admin (drop, watch, reindex, change the model, grant). One row per grantee with
-- the highest level; each level includes the ones below. Grantee 0 ('-'::regrole) is PUBLIC.
CREATE TABLE rag.collection_grants (
    collection_id integer NOT NULL REFERENCES rag.collections (id) ON DELETE CASCADE,
    grantee       regrole NOT NULL,
    privilege     text NOT NULL CHECK (privilege IN ('read', 'write', 'admin')),
    granted_by    name NOT NULL,
    granted_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (collection_id, grantee)
);

-- Content tables kept indexed by triggers (rag_watch). Expressions are SQL over the table's row, checked
-- when the watch is made; the worker evaluates them as the table's owner, never as a superuser.
CREATE TABLE rag.watches (
    id               integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- regclass, not oid: a dump stores the table's name, and a restore finds the table's new oid by it.
    source           regclass NOT NULL UNIQUE,
    source_name      text NOT NULL,
    collection_id    integer NOT NULL REFERENCES rag.collections (id) ON DELETE CASCADE,
    content_expr     text NOT NULL,
    title_expr       text,
    filter_expr      text,
    key_columns      text[] NOT NULL,
    metadata_columns text[] NOT NULL DEFAULT '{}',
    format           text NOT NULL DEFAULT 'text' CHECK (format IN ('text', 'html', 'markdown')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    -- The columns the expressions read, as PostgreSQL's analyzer found them when the watch was made or its
    -- table last altered (rag._watch_read_columns); NULL for every column. rag._watch_columns reads it.
    read_columns     text[],
    -- Who wrote the expressions (rag_watch's caller), by name so that a dump restores into a cluster without
    -- that role; NULL when not known. The expressions run as the table's owner, and never as a superuser
    -- unless a superuser wrote them (rag._watch_runs_as).
    written_by       name
);

-- Keys of watched rows whose indexed content may have changed. One row per key: a burst of updates to a row
-- bumps its version and pushes not_before back, so the worker embeds the final text once.
CREATE TABLE rag.row_queue (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    watch_id    integer NOT NULL REFERENCES rag.watches (id) ON DELETE CASCADE,
    key         jsonb NOT NULL,
    version     bigint NOT NULL DEFAULT 1,
    enqueued_at timestamptz NOT NULL DEFAULT now(),
    not_before  timestamptz NOT NULL DEFAULT now(),
    claimed_by  integer,
    last_error  text,
    -- Failures in a row: each one doubles the wait before the next try (30 s, 1 min, ... up to an hour), so a
    -- row whose expressions always time out costs the worker little.
    attempts    integer NOT NULL DEFAULT 0,
    -- A write queued the key (false: only rag_reindex re-reads it). Until the row is synced its document may
    -- hold an earlier version's text, which readers under the table's row-level security are not shown
    -- (rag._row_visible).
    changed     boolean NOT NULL DEFAULT true,
    UNIQUE (watch_id, key)
);
CREATE INDEX row_queue_due ON rag.row_queue (not_before, id);
-- A watch's due rows, for the turns rag._claim_row gives watches.
CREATE INDEX row_queue_watch_due ON rag.row_queue (watch_id, not_before, id);

-- What a trigger writes: the changed keys of one statement, as one row, so a 100,000-row INSERT costs the
-- writer one queue row, not 100,000. The worker spreads them into rag.row_queue. Its key is its one unique
-- index: the triggers insert with ON CONFLICT DO NOTHING and try again with the next id (rag._row_batch_free_id
-- says why), which another unique index would turn into a loop.
CREATE TABLE rag.row_batches (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    watch_id   integer NOT NULL,
    -- One {"column": value} object per key (keys of several columns) ...
    keys       jsonb,
    -- ... or, for a key of one column, its values as the text of an array of the column's type: the cheapest
    -- thing a trigger can make of 100,000 keys (array_agg(key)::text). The worker makes them jsonb.
    key_values text,
    not_before timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT row_batches_keys_check CHECK ((keys IS NULL) <> (key_values IS NULL)),
    -- A table's owner may write batches for their own watch (the triggers run as them): whatever they write
    -- must be something the worker can spread, or one batch would stop every watch's (rag._spread_batches).
    CONSTRAINT row_batches_keys_array CHECK (jsonb_typeof(keys) = 'array')
);
-- A reader's row check asks whether a watch has batches waiting (rag._row_visible), per candidate: without it
-- each check read the whole table, which any writer of any watched table can fill (red team 25).
CREATE INDEX row_batches_watch ON rag.row_batches (watch_id);

CREATE TABLE rag.documents (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    collection_id   integer NOT NULL REFERENCES rag.collections (id) ON DELETE CASCADE,
    title           text NOT NULL DEFAULT '',
    source          text,
    metadata        jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
    body            text NOT NULL,
    -- Character offset at which each page starts, when the document came with pages.
    page_offsets    integer[],
    -- What citations call each page when it is not a page number: 'slide 3', 'sheet "Q3"', 'p. 12'.
    page_labels     text[],
    content_sha256  bytea NOT NULL,
    status          text NOT NULL DEFAULT 'processing' CHECK (status IN ('processing', 'ready', 'failed')),
    failure_reason  text,
    chunks_total    integer NOT NULL DEFAULT 0,
    chunks_embedded integer NOT NULL DEFAULT 0,
    embed_calls     integer NOT NULL DEFAULT 0,
    embed_tokens    bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    ready_at        timestamptz,
    -- Documents made from watched rows: the table and the row's key, so results join back to the rows.
    watch_id        integer REFERENCES rag.watches (id) ON DELETE SET NULL,
    source_key      jsonb,
    CHECK ((watch_id IS NULL) OR (source_key IS NOT NULL))
);
-- Identical text is stored once per collection; rows of a watched table are documents of their own, even
-- when two rows say the same thing.
CREATE UNIQUE INDEX documents_dedup ON rag.documents (collection_id, content_sha256) WHERE source_key IS NULL;
-- Per-collection counts (the full-text side's collection size, rag.status) without a scan of every document.
CREATE INDEX documents_by_collection ON rag.documents (collection_id);
CREATE UNIQUE INDEX documents_by_row ON rag.documents (watch_id, source_key) WHERE source_key IS NOT NULL;
ALTER TABLE rag.documents ALTER COLUMN body SET STORAGE EXTENDED;
-- Compressed with lz4 where the server was built with it (PostgreSQL's packages are): pglz took an eighth of
-- each rag_ingest of a 2 kB document (perf, scripts/bench's first load), lz4 compresses several times faster for
-- a slightly larger result. A server without lz4 keeps its default_toast_compression.
DO $$
BEGIN
    ALTER TABLE rag.documents ALTER COLUMN body SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    NULL;
END $$;

-- Partitioned by collection: each collection's chunks and indexes are a table of their own
-- (rag._ensure_partition says what each holds and why), and a search with its collection's id is planned over
-- that table alone. Made with pgvector's schema in the search_path, for its type: the statement has no
-- expression to resolve, and the schema's `vector` can only be pgvector's (one type of a name per schema).
SELECT pg_catalog.set_config('search_path', pg_catalog.format('pg_catalog, rag, %I, pg_temp', n.nspname), true)
       AS path_for_rag_chunks
  FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'vector';
CREATE TABLE rag.chunks (
    id             bigint GENERATED ALWAYS AS IDENTITY,
    -- Its document's chunks go with it (rag._documents_deleted; no foreign key: rag._ensure_partition).
    document_id    bigint NOT NULL,
    -- Denormalised from the document: the partition key.
    collection_id  integer NOT NULL,
    ordinal        integer NOT NULL,
    content        text NOT NULL,
    -- What the chunk sits under: its document's title and the section heading above it ("Routine Vacuuming >
    -- Cost-based Vacuum Delay"), put in front of the content where the chunk is embedded, indexed for full text
    -- and reranked (rag._with_header), never in what is quoted. NULL when neither says anything, and for chunks
    -- stored before 0.2.0 (embedded without one).
    header         text,
    token_estimate integer NOT NULL,
    page           integer,
    char_start     integer NOT NULL,
    char_end       integer NOT NULL,
    embedding      vector,
    -- The collection's other vector space. A model change (rag_set_embedding_model) embeds every chunk into
    -- the column its collection does not search, then switches to it (collections.vector_column), and the
    -- column left behind is cleared: queries never wait for a model change, and never mix two models.
    embedding_alt  vector,
    -- The content's lexemes in the collection's text-search configuration, for the full-text side of the
    -- search (the GIN index on each collection's partition).
    tsv            tsvector
) PARTITION BY LIST (collection_id);
-- The vectors of a changed document's old chunks while its new chunks are stored a batch at a time
-- (rag._set_aside_chunks says how): rows live only inside the transaction that replaces the chunks, which
-- deletes them before it commits. So it is unlogged (nothing of it needs the WAL, and it is empty after a
-- crash), and never dumped.
CREATE UNLOGGED TABLE rag.set_aside_chunks (
    document_id   bigint NOT NULL,
    content       text NOT NULL,
    header        text,
    embedding     vector,
    embedding_alt vector
);
-- By the text's hash too, so that finding a new chunk's old vectors is an index probe whatever the plan.
CREATE INDEX set_aside_chunks_text ON rag.set_aside_chunks (document_id, hashtextextended(content, 0));
SELECT pg_catalog.set_config('search_path', 'pg_catalog, rag, pg_temp', true) AS path_after_rag_chunks;
-- A chunk's row stays whole in the heap up to a full page rather than the default quarter: a 384-d vector
-- (1.5 kB) with a 1,000-character chunk and its lexemes passes the default target, and PostgreSQL then
-- compressed the text and lexemes and moved every vector into the TOAST table, so that each store wrote two
-- tables and two indexes, and every exact search and index build fetched each vector through the TOAST index
-- (measured at 9,055 such chunks: an exact scan 50-63 ms inline against 82-107 ms toasted, the HNSW build
-- 2.2 s against 2.5-2.6 s). The price is disk: the text is no longer compressed (35 MB against 24 MB for
-- those chunks). Rows past a page (a 1,536-d vector and a long chunk) are still toasted as before (not measured).
-- Set on each partition (rag._ensure_partition): a partitioned table takes no storage parameters.

-- How common a collection's lexemes are, for the full-text side (rag._keyword_query): the share of its chunks
-- holding each lexeme found in more than rag._limit('lexeme_share_floor') of them, measured on a sample by the
-- idle worker (rag._measure_lexemes). Derived data, so not dumped: a restored database measures again.
CREATE TABLE rag.lexeme_shares (
    collection_id integer NOT NULL REFERENCES rag.collections (id) ON DELETE CASCADE,
    lexeme        text NOT NULL,
    share         real NOT NULL,
    PRIMARY KEY (collection_id, lexeme)
);
-- When each collection's lexemes were last measured, and how many chunks it had then.
CREATE TABLE rag.lexeme_measures (
    collection_id integer PRIMARY KEY REFERENCES rag.collections (id) ON DELETE CASCADE,
    chunks        bigint NOT NULL,
    measured_at   timestamptz NOT NULL
);

-- A collection's upkeep step that failed (building its missing HNSW index, rebuilding it with new build
-- parameters, a model change's switch or clearing: out of disk, an event trigger refusing CREATE INDEX). The
-- workers leave that step of that collection alone until next_try, a pause that doubles with each failure in a
-- row up to an hour (rag._upkeep_pause), and rag.status shows the error. A table rather than the worker's
-- memory: a worker that left its slot to another database, or was restarted, forgot the pause and built again
-- at once, and a database whose only due work was a failing step never let its worker go. Derived state, so
-- not dumped: a restored database tries again. No foreign key: a failure is written while the step's
-- transaction may still hold the collection's row and partition, and its key check must not wait behind a drop
-- under way; rows of dropped collections, and of steps no longer due, go at the next upkeep
-- (rag._settle_upkeep). Nothing waits for a row of it another transaction holds (rag._upkeep_failed).
CREATE TABLE rag.upkeep_failures (
    collection_id integer NOT NULL,
    step          text NOT NULL CHECK (step IN ('index build', 'index rebuild', 'model change')),
    failures      integer NOT NULL CHECK (failures > 0),
    last_error    text NOT NULL,
    next_try      timestamptz NOT NULL,
    PRIMARY KEY (collection_id, step)
);

-- The dedicated queue. A row is a document still to chunk and embed; it goes away when the document is
-- ready or has failed for good.
CREATE TABLE rag.queue (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    document_id      bigint NOT NULL UNIQUE REFERENCES rag.documents (id) ON DELETE CASCADE,
    -- Denormalised so the worker can take turns between collections without scanning the whole queue.
    collection_id    integer NOT NULL,
    enqueued_at      timestamptz NOT NULL DEFAULT now(),
    not_before       timestamptz NOT NULL DEFAULT now(),
    -- Transient provider failures since the last progress, and when the first of them happened.
    attempts         integer NOT NULL DEFAULT 0,
    first_failure_at timestamptz,
    -- Claims that ended without an outcome (the worker died or crashed): a document that keeps killing
    -- its worker is failed instead of being retried for ever.
    unfinished_claims integer NOT NULL DEFAULT 0,
    claimed_by       integer,
    claimed_at       timestamptz,
    last_error       text
);
CREATE INDEX queue_due ON rag.queue (not_before, id);
CREATE INDEX queue_by_collection ON rag.queue (collection_id, not_before, id);

------------------------------------------------------------------------------------------------------------
-- Collection privileges. Enforced twice: every function checks the caller's privilege through
-- rag._require_privilege, and row-level security on the tables below shows plain SELECTs only the rows of
-- collections the querying role may read (SECURITY DEFINER code runs as the tables' owner, which bypasses it).

CREATE FUNCTION rag._privilege_rank(p_privilege text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_privilege WHEN 'read' THEN 1 WHEN 'write' THEN 2 WHEN 'admin' THEN 3 END
$$;

-- Does role p_role hold p_privilege on the collection? Superusers and roles with the owning role's privileges
-- hold all. 'USAGE', as PostgreSQL's own ownership checks (has_privs_of_role) count: a member that does not
-- inherit the owner's privileges (NOINHERIT; from PostgreSQL 16 also WITH INHERIT FALSE) is not the owner.
-- A role that no longer exists (an owner or grantee dropped since) holds nothing and breaks nothing.
CREATE FUNCTION rag._has_collection_privilege(p_collection_id integer, p_owner regrole, p_role oid,
                                              p_privilege text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = p_role AND r.rolsuper)
        OR (EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = p_owner)
            AND pg_catalog.pg_has_role(p_role, p_owner, 'USAGE'))
        OR EXISTS (SELECT 1 FROM rag.collection_grants g
                    WHERE g.collection_id = p_collection_id
                      AND rag._privilege_rank(g.privilege) >= rag._privilege_rank(p_privilege)
                      AND (g.grantee = 0
                           OR (EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = g.grantee)
                               AND pg_catalog.pg_has_role(p_role, g.grantee, 'USAGE'))))
$$;

-- The ids of the collections p_role holds p_privilege on; policies call it once per query (an InitPlan) with
-- current_user. Every reader may call it, so it answers only for the caller or a role whose privileges the
-- caller has (rag._acting_for; a superuser for any): another role's list is not the caller's to learn. It and
-- the three below are entered through wrappers (sql/security.sql) so that rag._acting_for can tell who asks.
-- PL/pgSQL because this file is run before the Rust functions exist, and a SQL body is checked when created.
CREATE FUNCTION rag._collections_with(p_role name, p_privilege text) RETURNS integer[]
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    v_role name := rag._acting_for(p_role);
BEGIN
    RETURN (SELECT coalesce(array_agg(c.id), '{}')
              FROM rag.collections c, pg_catalog.pg_roles r
             WHERE r.rolname = v_role AND rag._has_collection_privilege(c.id, c.owner, r.oid, p_privilege));
END $$;

-- The collections every row of which p_role may read: for each table the collection watches, p_role has the
-- privileges of its owner (the worker reads it as them) or may read it whole (rag._watches_readable_whole). An
-- admin of a collection is not trusted with the rows of another owner's table that its row-level security or
-- column privileges keep from them: the ledger's answers and the choice of where the collection's texts are
-- sent (a provider of the admin's choosing would be sent every chunk) follow this. Only collections p_role may
-- read at all are listed.
CREATE FUNCTION rag._collections_held_whole(p_role name) RETURNS integer[]
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    v_role name := rag._acting_for(p_role);
    v_whole integer[] := rag._watches_readable_whole(v_role);
    v_readable integer[] := rag._collections_with(v_role, 'read');
BEGIN
    RETURN (SELECT coalesce(array_agg(c.id), '{}')
              FROM rag.collections c
             WHERE c.id = ANY (v_readable)
               AND NOT EXISTS (SELECT 1 FROM rag.watches w JOIN pg_catalog.pg_class t ON t.oid = w.source
                                WHERE w.collection_id = c.id AND NOT w.id = ANY (v_whole)
                                  AND NOT pg_catalog.pg_has_role(v_role, t.relowner, 'USAGE')));
END $$;

-- Whose ledger rows and conversations p_role may read besides its own: those of the collections it administers
-- and holds whole (above), written under the collection's current count of ended watches (watches_ended), as
-- one bigint per collection (its id times 2^32 plus the count) that a row's own pair is looked up in. One
-- array, computed once per query (an InitPlan): a subquery per row instead made the policies' plans cost enough
-- for JIT compilation, about 0.2 s on a 200,000-row ledger (BENCHMARKS.md §4). It asks about p_role itself
-- first: the functions it calls are called from rag's own code (as rag's owner), where their own check can no
-- longer tell who asked.
CREATE FUNCTION rag._ledger_keys_visible(p_role name) RETURNS bigint[]
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    v_role name := rag._acting_for(p_role);
BEGIN
    RETURN (SELECT coalesce(array_agg(c.id::bigint * 4294967296 + c.watches_ended), '{}')
              FROM rag.collections c
             WHERE c.id = ANY (rag._collections_with(v_role, 'admin'))
               AND c.id = ANY (rag._collections_held_whole(v_role)));
END $$;

-- Whether a provider sends text only where the server's administrators chose: in-process models, the
-- extension's own ollama (rag.ollama_url, a superuser's setting) and providers a superuser created. Providers
-- made under 0.1.0 have no creator on record (any rag_admin could make one then), so they do not count.
CREATE FUNCTION rag._provider_is_the_servers(p_provider text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM rag.providers p
                    WHERE p.name = p_provider
                      AND (p.kind = 'local'
                           OR (p.name = 'ollama' AND p.kind = 'ollama' AND p.base_url IS NULL AND p.created_by IS NULL
                               AND p.created_by_id IS NULL)
                           OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = p.created_by_id AND r.rolsuper)))
$$;

-- Raises unless the caller may read every row of the collection, when p_provider is one that sends text to a
-- server a role other than a superuser chose (rag_create_provider). In-process models and the providers a
-- superuser made (the defaults among them) are the server's own destinations.
CREATE FUNCTION rag._require_collection_whole_for(p_collection_id integer, p_provider text, p_action text)
RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    v_caller name := rag._calling_role();
    v_table regclass;
BEGIN
    IF rag._provider_is_the_servers(p_provider) OR p_collection_id = ANY (rag._collections_held_whole(v_caller)) THEN
        RETURN;
    END IF;
    SELECT w.source INTO v_table FROM rag.watches w JOIN pg_catalog.pg_class t ON t.oid = w.source
     WHERE w.collection_id = p_collection_id AND NOT w.id = ANY (rag._watches_readable_whole(v_caller))
       AND NOT pg_catalog.pg_has_role(v_caller, t.relowner, 'USAGE')
     ORDER BY w.id LIMIT 1;
    RAISE EXCEPTION 'permission denied to %', p_action
        USING ERRCODE = 'insufficient_privilege',
              DETAIL = format('The collection indexes rows of %s that %s may not read, and provider "%s" would be sent them.',
                              v_table, v_caller, p_provider),
              HINT = format('The owner of %s, or a superuser, may do it; or use a provider a superuser made.', v_table);
END $$;

-- No column statistics on the columns of a table whose rows a reader sees only in part (row-level security)
-- but keys and flags: the planner estimates a condition from a column's statistics for every role when its
-- operator is leakproof (text's = and <, tsvector's @@ as well), so EXPLAIN's row counts told any rag_reader
-- which words other collections' chunks and hidden rows held, and a search on `<` rebuilt other people's
-- questions and documents a letter at a time (red team 16). Statistics of such columns are no use to rag's own
-- plans, which find rows by key. security.sql applies it to every such table, rag._ensure_partition to each
-- new partition of rag.chunks; statistics gathered before are removed.
CREATE FUNCTION rag._hide_statistics(p_table regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_column name;
BEGIN
    FOR v_column IN SELECT a.attname FROM pg_catalog.pg_attribute a
                     WHERE a.attrelid = p_table AND a.attnum > 0 AND NOT a.attisdropped
                       AND a.atttypid <> ALL (rag._statistics_kept_types())
                       AND coalesce(a.attstattarget, -1) <> 0 LOOP
        EXECUTE format('ALTER TABLE %s ALTER COLUMN %I SET STATISTICS 0', p_table, v_column);
    END LOOP;
END $$;

-- The column types whose statistics rag keeps on those tables: keys, counts and flags.
CREATE FUNCTION rag._statistics_kept_types() RETURNS oid[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['pg_catalog.int2'::pg_catalog.regtype, 'pg_catalog.int4'::pg_catalog.regtype,
                 'pg_catalog.int8'::pg_catalog.regtype, 'pg_catalog.bool'::pg_catalog.regtype,
                 'pg_catalog.oid'::pg_catalog.regtype, 'pg_catalog.regclass'::pg_catalog.regtype]::oid[]
$$;

-- Raises unless the caller holds p_privilege on the collection, as the active snapshot sees the collection
-- and its grants: rag._require_privilege (src/api/roles.rs) calls it under the latest snapshot in a
-- REPEATABLE READ or SERIALIZABLE transaction. The caller's oid is looked up once, into a variable: passed to
-- the check as a subquery, it made every call cost about half of what rag_ingest did (BENCHMARKS.md §3).
CREATE FUNCTION rag._check_privilege(p_collection_id integer, p_privilege text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    c rag.collections;
    v_caller name := rag._calling_role();
    v_caller_oid oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = v_caller);
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = p_collection_id;
    -- The privilege asked for first: it implies read, so a caller that holds it (every call that goes on) is
    -- checked once; which error a refusal gets is worked out after.
    IF NOT FOUND OR rag._has_collection_privilege(c.id, c.owner, v_caller_oid, p_privilege) THEN
        RETURN;
    END IF;
    IF NOT rag._has_collection_privilege(c.id, c.owner, v_caller_oid, 'read') THEN
        -- Not even a reader: neither its name nor its owner is told (rag.collections hides both from the caller;
        -- functions that take an id, rag._rows_waiting say, would otherwise name every collection: red team 16).
        RAISE EXCEPTION 'permission denied for a collection you may not read'
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('%s needs the %s privilege on it.', v_caller, p_privilege),
                  HINT = 'Its owner or an admin of it can grant it with rag_grant.';
    END IF;
    RAISE EXCEPTION 'permission denied for collection "%"', c.name
        USING ERRCODE = 'insufficient_privilege',
              DETAIL = format('%s needs the %s privilege on it.', v_caller, p_privilege),
              HINT = format('Its owner (%s) or an admin of it can grant it: SELECT rag_grant(%L, %L, %L);',
                            c.owner, c.name, v_caller, p_privilege);
END $$;

DO $$
DECLARE
    v_table text;
BEGIN
    -- documents and chunks also hold rows of watched tables: their policies are in watch.sql.
    FOREACH v_table IN ARRAY ARRAY['collections', 'collection_grants', 'watches', 'migrations',
                                   'lexeme_shares', 'lexeme_measures'] LOOP
        EXECUTE format('ALTER TABLE rag.%I ENABLE ROW LEVEL SECURITY', v_table);
        -- The scalar subquery runs once per query (an InitPlan), not once per row. The lexemes are measured
        -- over every chunk, those of watched rows a reader may not see included: which words occur and how
        -- often is shown only to roles that may read every row the collection indexes, as PostgreSQL shows a
        -- column's statistics (pg_stats) only to roles that may read the column.
        EXECUTE format($p$CREATE POLICY readable ON rag.%I FOR SELECT
                          USING (%I = ANY ((SELECT rag._collections_with(current_user, 'read'))::integer[])%s)$p$,
                       v_table, CASE v_table WHEN 'collections' THEN 'id' ELSE 'collection_id' END,
                       CASE WHEN v_table LIKE 'lexeme%'
                            THEN ' AND collection_id = ANY ((SELECT rag._collections_held_whole(current_user))::integer[])'
                            ELSE '' END);
    END LOOP;
END $$;

------------------------------------------------------------------------------------------------------------
-- Answering: prices, conversations and the ledger (written by sql/answer.sql's functions).

CREATE TABLE rag.prices (
    model                  text NOT NULL,
    input_usd_per_million  numeric NOT NULL DEFAULT 0 CHECK (input_usd_per_million >= 0),
    output_usd_per_million numeric NOT NULL DEFAULT 0 CHECK (output_usd_per_million >= 0),
    valid_from             timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, valid_from)
);
COMMENT ON TABLE rag.prices IS 'Price per million tokens by model; a model with no row costs 0 (local models)';

CREATE TABLE rag.conversations (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    collection_id integer NOT NULL REFERENCES rag.collections (id) ON DELETE CASCADE,
    -- The owner's name (as the ledger's role) and the owner itself, which decides who reads it.
    owner         name NOT NULL,
    owner_id      regrole,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- rag.collections.watches_ended when it was started, lowered to that of any answer added to it since.
    watches_ended integer NOT NULL DEFAULT 0
);

CREATE TABLE rag.queries (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- No foreign key: its check would lock the collection's row at the end of rag_query and rag_ask, after their
    -- search holds rag.chunks, the opposite order to rag_drop_collection (the row, then the collection's indexes),
    -- and a drop that came in between deadlocked with the query. rag_drop_collection sets it NULL instead.
    collection_id      integer,
    collection         text NOT NULL,
    kind               text NOT NULL CHECK (kind IN ('query', 'ask')),
    question           text NOT NULL,
    rewritten_question text,
    conversation_id    bigint REFERENCES rag.conversations (id) ON DELETE SET NULL,
    outcome            text NOT NULL CHECK (outcome IN ('retrieved', 'answered', 'refused', 'failed')),
    answer             text,
    reason             text,
    nearest_distance   double precision,
    -- The reranker's best relevance among the candidates; NULL when the collection does not rerank.
    best_relevance     real,
    sources_sent       integer NOT NULL DEFAULT 0,
    citations          jsonb NOT NULL DEFAULT '[]',
    citations_kept     integer NOT NULL DEFAULT 0,
    citations_stripped integer NOT NULL DEFAULT 0,
    embedding_model    text,
    chat_model         text,
    embed_tokens       bigint,
    prompt_tokens      bigint,
    completion_tokens  bigint,
    chat_calls         integer NOT NULL DEFAULT 0,
    embed_ms           double precision,
    search_ms          double precision,
    generate_ms        double precision,
    latency_ms         double precision NOT NULL,
    cost_usd           numeric NOT NULL DEFAULT 0,
    -- The price rows in force when the call ran, so old amounts stay explainable after a price change.
    prices             jsonb NOT NULL DEFAULT '{}',
    -- Who asked: the name, as the record (renamed with the role by ALTER ROLE … RENAME in this database,
    -- src/api/roles.rs), and the role itself, which decides who reads the row (a role created later under the
    -- same name, here or after a DROP ROLE in another database, is another role). regrole, not oid: a dump
    -- writes the name, and a restore finds the role's new oid by it. NULL once the role is dropped (from this
    -- database; elsewhere its bare oid names no role of the cluster again).
    role               name NOT NULL,
    role_id            regrole,
    -- rag.collections.watches_ended as the call read it before its search.
    watches_ended      integer NOT NULL DEFAULT 0
);
CREATE INDEX queries_by_collection_day ON rag.queries (collection, created_at);

CREATE TABLE rag.messages (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id    bigint NOT NULL REFERENCES rag.conversations (id) ON DELETE CASCADE,
    role               text NOT NULL CHECK (role IN ('user', 'assistant')),
    content            text NOT NULL,
    rewritten_question text,
    query_id           bigint REFERENCES rag.queries (id) ON DELETE SET NULL,
    created_at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- A turn reads its conversation's last messages (src/api/ask.rs), and dropping a conversation deletes them.
CREATE INDEX messages_by_conversation ON rag.messages (conversation_id, id);
-- The ledger's rows go (rag.ledger_retention, rag._prune_ledger), and each takes its mention off the messages
-- (ON DELETE SET NULL): by this index, not a scan of every message for every row.
CREATE INDEX messages_by_query ON rag.messages (query_id) WHERE query_id IS NOT NULL;

-- Ledger rows and conversations are the questions of people: a role sees its own, and admins of a collection
-- see all of that collection's when they may read every row it indexes (an answer quotes rows the asker saw).
-- Rows from before a watch of the collection ended are their askers' and superusers' only (watches_ended).
ALTER TABLE rag.queries ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_or_administered ON rag.queries FOR SELECT
    USING (role_id = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
           OR collection_id::bigint * 4294967296 + watches_ended
              = ANY ((SELECT rag._ledger_keys_visible(current_user))::bigint[]));
ALTER TABLE rag.conversations ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_or_administered ON rag.conversations FOR SELECT
    USING (owner_id = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)
           OR collection_id::bigint * 4294967296 + watches_ended
              = ANY ((SELECT rag._ledger_keys_visible(current_user))::bigint[]));
ALTER TABLE rag.messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY of_visible_conversations ON rag.messages FOR SELECT
    USING (conversation_id IN (SELECT c.id FROM rag.conversations c));

------------------------------------------------------------------------------------------------------------

-- How many of a collection's chunks have their vector in the space a model change fills. A function, so that
-- its look into rag.chunks is planned over the collection's partition: the view's own join, with the
-- collection not a constant, was planned over every partition (200 ms for one collection's row beside 1,000
-- others). It runs as the caller, so a reader counts the chunks rag.chunks' policy shows them.
CREATE FUNCTION rag._migration_chunks_embedded(p_collection_id integer) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_column text := (SELECT c.vector_column FROM rag.collections c WHERE c.id = p_collection_id);
BEGIN
    RETURN (SELECT count(*) FILTER (WHERE CASE v_column WHEN 'embedding' THEN ch.embedding_alt IS NOT NULL
                                                                         ELSE ch.embedding IS NOT NULL END)
              FROM rag.chunks ch WHERE ch.collection_id = p_collection_id);
END $$;

-- The extension's schema again, where pgrx creates the Rust functions declared after this file.
SET LOCAL search_path = @extschema@, pg_temp;
