-- Run with pg_catalog first, then rag, and nothing else: schema.sql says why.
SET LOCAL search_path = pg_catalog, rag, pg_temp;

-- Collections: creating, granting, dropping, reindexing and changing a collection's model, and the
-- per-collection HNSW index. Documents and the queue are in ingest.sql, watched tables in watch.sql.

-- The answering limits of a collection are src/limits.rs's (rag._limit), so the table's own checks say the same
-- as rag_create_collection and the Rust that reads the columns.
ALTER TABLE rag.collections
    ADD CONSTRAINT collections_context_budget_check
        CHECK (context_budget BETWEEN rag._limit('context_budget_min')::integer
                                  AND rag._limit('context_budget_max')::integer),
    ADD CONSTRAINT collections_max_answer_tokens_check
        CHECK (max_answer_tokens BETWEEN rag._limit('max_answer_tokens_min')::integer
                                     AND rag._limit('max_answer_tokens_max')::integer),
    ADD CONSTRAINT collections_rerank_candidates_check
        CHECK (rerank_candidates BETWEEN rag._limit('rerank_candidates_min')::integer
                                     AND rag._limit('rerank_candidates_max')::integer);

-- Every function that writes says so first, on a hot standby and in a read-only transaction alike, instead of
-- PostgreSQL's "cannot execute INSERT in a read-only transaction" from somewhere inside it (red team 21). On a
-- standby it gives the primary's address (host and port from primary_conninfo, never its password) to a caller
-- who may read that setting (pg_read_all_settings): rag's owner reads it for everyone, and it is not everyone's
-- to read (red team 15). Its keywords are matched at their starts, so another keyword's value (a password) is
-- never taken.
-- Raises unless the transaction is READ COMMITTED, for the calls that read what others commit while they run
-- (red team 29): rag_watch queues the rows its table has once its triggers are in place, and a row committed
-- while it waited for the table, unseen by an older snapshot, was never indexed; rag_set_embedding_model
-- queues the documents it finds, and one ready since the snapshot left the change waiting for ever;
-- rag_wait never saw the worker's progress; rag_process_queue claimed what the worker had done already.
CREATE FUNCTION rag._require_read_committed(p_what text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION '% needs a READ COMMITTED transaction, not %', p_what,
                        pg_catalog.upper(pg_catalog.current_setting('transaction_isolation'))
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'It reads what other sessions commit while it runs. Call it in BEGIN ISOLATION LEVEL READ COMMITTED; … COMMIT; (also where default_transaction_isolation says otherwise).';
    END IF;
END $$;

CREATE FUNCTION rag._require_writable(p_what text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_conninfo text;
    v_primary text;
BEGIN
    IF NOT pg_catalog.pg_is_in_recovery() THEN
        IF current_setting('transaction_read_only')::boolean THEN
            RAISE EXCEPTION '% needs a read-write transaction: this one is read-only', p_what
                USING ERRCODE = 'read_only_sql_transaction',
                      HINT = 'Run it outside BEGIN READ ONLY (and with default_transaction_read_only off); rag_query, rag_prompt, rag_ask without a conversation, rag_embed and rag_explain work in a read-only one.';
        END IF;
        RETURN;
    END IF;
    -- Read here, not in DECLARE: every write on a primary passes through this function and needs none of it.
    v_conninfo := coalesce(current_setting('primary_conninfo', true), '');
    IF pg_catalog.pg_has_role(rag._calling_role(), 'pg_read_all_settings', 'USAGE') THEN
        v_primary := nullif(concat_ws(' ', 'host=' || substring(v_conninfo FROM '(?:^|\s)host\s*=\s*''?([^'' ]+)'),
                                           'port=' || substring(v_conninfo FROM '(?:^|\s)port\s*=\s*''?([0-9]+)')), '');
    ELSE
        v_primary := 'the address in primary_conninfo, which members of pg_read_all_settings may read';
    END IF;
    RAISE EXCEPTION '% needs the primary: this server is a read-only standby', p_what
        USING ERRCODE = 'read_only_sql_transaction',
              DETAIL = coalesce('The primary is at ' || v_primary || '.', 'This standby does not know its primary.'),
              HINT = 'Run it on the primary; rag_query, rag_prompt, rag_ask without a conversation, rag_embed and rag_explain work here.';
END $$;

-- The reranker arguments of rag_create_collection and rag_set_reranker, checked in one place. A local reranker
-- must load here (so a typo fails now, not at the first question); a server's is not called until a question
-- needs it, as an embedding model is not; the candidates are within src/limits.rs's range.
CREATE FUNCTION rag._validate_reranker(p_provider text, p_reranker text, p_candidates integer, p_min_relevance real,
                                       p_min_lead real)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_kind text := (SELECT p.kind FROM rag.providers p WHERE p.name = p_provider);
BEGIN
    IF v_kind IS NULL THEN
        RAISE EXCEPTION 'reranker provider "%" does not exist', p_provider
            USING ERRCODE = 'undefined_object', HINT = 'SELECT name, kind FROM rag.providers lists them.';
    END IF;
    IF p_reranker IS NOT NULL AND v_kind = 'ollama' THEN
        RAISE EXCEPTION 'provider "%" is an Ollama server, which has no rerank API', p_provider
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use the local reranker (reranker_provider => ''local'') or an OpenAI-compatible server with /rerank (llama.cpp, vLLM).';
    END IF;
    IF p_candidates IS NULL OR p_candidates NOT BETWEEN rag._limit('rerank_candidates_min')::integer
                                                 AND rag._limit('rerank_candidates_max')::integer THEN
        RAISE EXCEPTION 'rerank_candidates must be between % and %, not %', rag._limit('rerank_candidates_min'),
                        rag._limit('rerank_candidates_max'), coalesce(p_candidates::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = format('It is how many of the search''s best chunks the reranker reads; the default is %s.',
                                rag._limit('rerank_candidates_default'));
    END IF;
    IF p_min_relevance IS NULL OR p_min_relevance = 'NaN'::real OR abs(p_min_relevance) > 100 THEN
        RAISE EXCEPTION 'min_relevance must be a number between -100 and 100, not %', coalesce(p_min_relevance::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = format('It is a threshold on the reranker''s logit; the default, %s, is calibrated in the README.',
                                rag._limit('min_relevance_default'));
    END IF;
    IF p_min_lead IS NULL OR p_min_lead = 'NaN'::real OR p_min_lead NOT BETWEEN 0 AND 100 THEN
        RAISE EXCEPTION 'min_lead must be a number between 0 and 100, not %', coalesce(p_min_lead::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = format('It is how many logits the reranker''s first chunk must lead the second by to pass below '
                                'min_relevance (0: never); the default is %s.', rag._limit('min_lead_default'));
    END IF;
    IF p_reranker IS NOT NULL AND v_kind = 'local' THEN
        PERFORM rag._check_reranker(p_reranker);
    END IF;
END $$;

-- Model names and prefixes go into provider requests (a prefix before every chunk and every question), and are
-- shown with every answer: bounded, so that an admin's 10 MB prefix does not make the worker build 320 MB
-- requests, or every reader's question a 50 MB one (red team 20).
CREATE FUNCTION rag._require_short_model_texts(p_models text[], p_prefixes text[]) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_models) m WHERE octet_length(m) > rag._limit('model_name_max_bytes')::integer) THEN
        RAISE EXCEPTION 'a model name may be at most % bytes', rag._limit('model_name_max_bytes')
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Give the name the provider lists the model under.';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_prefixes) x WHERE octet_length(x) > rag._limit('prefix_max_bytes')::integer) THEN
        RAISE EXCEPTION 'a document or query prefix may be at most % bytes', rag._limit('prefix_max_bytes')
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'A prefix is a short instruction put before each text, such as ''search_query: ''.';
    END IF;
END $$;

CREATE FUNCTION @extschema@.rag_create_collection(
    name               text,
    embedding_provider text DEFAULT 'ollama',
    embedding_model    text DEFAULT NULL,
    dimensions         integer DEFAULT NULL,
    document_prefix    text DEFAULT NULL,
    query_prefix       text DEFAULT NULL,
    chunk_size         integer DEFAULT NULL,
    chunk_overlap      integer DEFAULT NULL,
    chunk_unit         text DEFAULT 'characters',
    max_distance       double precision DEFAULT NULL,
    retry_deadline     interval DEFAULT NULL,
    chat_provider      text DEFAULT 'ollama',
    chat_model         text DEFAULT NULL,
    prompt_template    text DEFAULT NULL,
    context_budget     integer DEFAULT NULL,
    max_answer_tokens  integer DEFAULT NULL,
    search_mode        text DEFAULT 'hybrid',
    text_search_config regconfig DEFAULT 'english',
    reranker           text DEFAULT NULL,
    rerank_candidates  integer DEFAULT NULL,
    min_relevance      real DEFAULT NULL,
    reranker_provider  text DEFAULT 'local'
) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id integer;
    v_min_lead real;
    v_size integer := coalesce(chunk_size, rag._setting('rag.chunk_size')::integer);
    v_overlap integer := coalesce(chunk_overlap, rag._setting('rag.chunk_overlap')::integer);
    v_window integer;
    v_local_default text := rag._limit('local_model_default');
BEGIN
    PERFORM rag._require_writable('rag_create_collection');
    context_budget := coalesce(context_budget, rag._limit('context_budget_default')::integer);
    max_answer_tokens := coalesce(max_answer_tokens, rag._limit('max_answer_tokens_default')::integer);
    IF name IS NULL OR name !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}$' THEN
        RAISE EXCEPTION 'invalid collection name %', coalesce(quote_literal(left(name, 100) || CASE WHEN char_length(name) > 100 THEN '…' ELSE '' END), 'NULL')  -- at most 100 characters of it back (red team 21)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A name is 1 to 63 letters, digits, "_", ".", ":" or "-", starting with a letter or digit.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM rag.providers p WHERE p.name = embedding_provider) THEN
        RAISE EXCEPTION 'provider "%" does not exist', embedding_provider
            USING ERRCODE = 'undefined_object', HINT = 'SELECT name, kind FROM rag.providers lists them.';
    END IF;
    IF dimensions IS NOT NULL AND (dimensions < 1 OR dimensions > 16000) THEN
        RAISE EXCEPTION 'dimensions must be between 1 and 16000, not %', dimensions
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Leave it NULL to learn it from the first embedding.';
    END IF;
    IF max_distance IS NOT NULL AND (max_distance <= 0 OR max_distance > 2) THEN
        RAISE EXCEPTION 'max_distance must be in (0, 2], not %', max_distance
            USING ERRCODE = 'invalid_parameter_value', HINT = 'It is a cosine distance: 0 is identical, 2 is opposite.';
    END IF;
    IF (SELECT kind FROM rag.providers p WHERE p.name = embedding_provider) = 'local' THEN
        -- A local model reads a bounded window of tokens; a chunk must fit in it, never be cut silently. The
        -- default takes 3 characters a token (prose runs about 4; the worker splits what the tokenizer still finds
        -- too long, src/worker/chunking.rs): 768 for MiniLM ranked better than 512 in scripts/eval (BENCHMARKS §5).
        embedding_model := coalesce(nullif(embedding_model, ''), v_local_default);
        v_window := rag._local_model_window(embedding_model);
        IF chunk_size IS NULL THEN
            v_size := least(v_size, v_window * 3);
            v_overlap := least(v_overlap, v_size / 5);
        ELSIF (CASE chunk_unit WHEN 'tokens' THEN chunk_size::bigint * rag._limit('chars_per_token')::integer
                               ELSE chunk_size END) > v_window * 3 THEN
            RAISE EXCEPTION 'chunk_size % is too large for model "%", which reads at most % tokens', chunk_size, embedding_model, v_window
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = format('Use chunk_size => %s characters or less.', v_window * 3);
        END IF;
    END IF;
    -- Prefixes: the caller's, else the settings' (when set), else what the model itself expects (known models;
    -- none for others: a wrong instruction hurts more than a missing one).
    embedding_model := coalesce(nullif(embedding_model, ''), rag._setting('rag.embedding_model'));
    SELECT coalesce(rag_create_collection.document_prefix, nullif(rag._setting('rag.document_prefix'), ''),
                    m.document_prefix),
           coalesce(rag_create_collection.query_prefix, nullif(rag._setting('rag.query_prefix'), ''), m.query_prefix)
      INTO document_prefix, query_prefix
      FROM rag._model_prefixes(rag_create_collection.embedding_model) m;
    IF (SELECT kind FROM rag.providers p WHERE p.name = embedding_provider) = 'local' THEN
        PERFORM rag._require_local_prefixes_fit(embedding_model, document_prefix, query_prefix);
    END IF;
    IF chunk_unit IS NULL THEN
        RAISE EXCEPTION 'chunk_unit must be characters or tokens, not NULL'
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Leave it out for characters.';
    END IF;
    IF retry_deadline < interval '0' THEN
        RAISE EXCEPTION 'retry_deadline must not be negative, not %', retry_deadline
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'It is how long a document keeps being retried after its first failure; NULL keeps the setting.';
    END IF;
    PERFORM rag._validate_chunking(v_size, v_overlap, chunk_unit);
    IF NOT EXISTS (SELECT 1 FROM rag.providers p WHERE p.name = chat_provider) THEN
        RAISE EXCEPTION 'chat provider "%" does not exist', chat_provider
            USING ERRCODE = 'undefined_object', HINT = 'SELECT name, kind FROM rag.providers lists them.';
    END IF;
    chat_model := nullif(coalesce(chat_model, rag._setting('rag.chat_model')), '');
    -- Once the settings (which any role may SET) have filled in what the arguments left out.
    PERFORM rag._require_short_model_texts(ARRAY[embedding_model, chat_model, reranker],
                                           ARRAY[document_prefix, query_prefix]);
    IF chat_model IS NOT NULL
       AND chat_model = coalesce(nullif(embedding_model, ''), rag._setting('rag.embedding_model')) THEN
        RAISE EXCEPTION 'chat_model "%" is the embedding model', chat_model
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Name a chat model (rag_models() lists them), or leave it NULL for extractive answers.';
    END IF;
    IF prompt_template IS NOT NULL AND (strpos(prompt_template, '{{context}}') = 0 OR strpos(prompt_template, '{{query}}') = 0) THEN
        RAISE EXCEPTION 'prompt_template must contain both {{context}} and {{query}}'
            USING ERRCODE = 'invalid_parameter_value', HINT = 'They are replaced by the sources and the question.';
    END IF;
    -- Each copy of {{context}} is the whole context again: a rendering must stay bounded (rag_answer's
    -- validate_template checks the same before every rendering).
    IF octet_length(prompt_template) > rag._limit('prompt_template_max_bytes')::integer
       OR (length(prompt_template) - length(replace(prompt_template, '{{context}}', ''))) / 11 > 1
       OR (length(prompt_template) - length(replace(prompt_template, '{{query}}', ''))) / 9
          > rag._limit('prompt_query_placeholders_max')::integer THEN
        RAISE EXCEPTION 'prompt_template must have {{context}} once and {{query}} at most % times, in at most % bytes',
                        rag._limit('prompt_query_placeholders_max'), rag._limit('prompt_template_max_bytes')
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'The sources are put in once; shorten the template.';
    END IF;
    IF context_budget NOT BETWEEN rag._limit('context_budget_min')::integer AND rag._limit('context_budget_max')::integer
       OR max_answer_tokens NOT BETWEEN rag._limit('max_answer_tokens_min')::integer
                                    AND rag._limit('max_answer_tokens_max')::integer THEN
        RAISE EXCEPTION 'context_budget must be % to % tokens and max_answer_tokens % to %, not % and %',
                        rag._limit('context_budget_min'), rag._limit('context_budget_max'),
                        rag._limit('max_answer_tokens_min'), rag._limit('max_answer_tokens_max'),
                        context_budget, max_answer_tokens
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = format('The defaults are %s and %s.', rag._limit('context_budget_default'),
                                rag._limit('max_answer_tokens_default'));
    END IF;
    IF search_mode IS NULL OR search_mode NOT IN ('hybrid', 'vector', 'keyword') THEN
        RAISE EXCEPTION 'search_mode must be hybrid, vector or keyword, not %', coalesce(quote_literal(search_mode), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'hybrid fuses the vector and full-text rankings (reciprocal rank fusion).';
    END IF;
    IF text_search_config IS NULL THEN
        RAISE EXCEPTION 'text_search_config must not be NULL'
            USING ERRCODE = 'invalid_parameter_value', HINT = 'SELECT cfgname FROM pg_ts_config lists them; ''simple'' stems nothing.';
    END IF;
    -- Reranking is on by default for collections embedded in process, whose questions already run locally;
    -- 'none' turns it off. Without the default model installed the collection is made without it, and says so.
    rerank_candidates := coalesce(rerank_candidates, rag._limit('rerank_candidates_default')::integer);
    min_relevance := coalesce(min_relevance, rag._limit('min_relevance_default')::real);
    v_min_lead := rag._limit('min_lead_default')::real;
    IF reranker = 'none' THEN
        reranker := NULL;
    ELSIF reranker IS NULL AND reranker_provider = 'local'
          AND (SELECT kind FROM rag.providers p WHERE p.name = embedding_provider) = 'local' THEN
        reranker := rag._limit('reranker_default');
        IF NOT rag._reranker_installed(reranker) THEN
            RAISE NOTICE 'collection "%" is made without a reranker: % is not installed', name, reranker
                USING HINT = format('Run scripts/fetch-model, then rag_set_reranker(%L, %L).', name, reranker);
            reranker := NULL;
        END IF;
    END IF;
    PERFORM rag._validate_reranker(coalesce(reranker_provider, 'local'), reranker, rerank_candidates, min_relevance,
                                   v_min_lead);
    IF EXISTS (SELECT 1 FROM rag.collections c WHERE c.name = rag_create_collection.name) THEN
        RAISE EXCEPTION 'collection "%" already exists', name
            USING ERRCODE = 'duplicate_object', HINT = 'Drop it with rag_drop_collection, or pick another name.';
    END IF;
    INSERT INTO rag.collections (name, embedding_provider, embedding_model, dimensions, document_prefix,
                                 query_prefix, chunk_size, chunk_overlap, chunk_unit, max_distance, retry_deadline,
                                 chat_provider, chat_model, prompt_template, context_budget, max_answer_tokens, owner,
                                 search_mode, text_search_config, reranker, rerank_candidates, min_relevance,
                                 min_lead, reranker_provider)
    VALUES (name, embedding_provider,
            embedding_model, dimensions, document_prefix, query_prefix,
            v_size, v_overlap, chunk_unit,
            coalesce(max_distance, rag._default_max_distance(embedding_model)),
            retry_deadline, chat_provider, chat_model, prompt_template, context_budget, max_answer_tokens,
            rag._lock_role((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = rag._calling_role()))::regrole, search_mode, text_search_config, reranker, rerank_candidates,
            min_relevance, v_min_lead, coalesce(reranker_provider, 'local'))
    RETURNING id INTO v_id;
    -- A new collection's partition does not exist yet. One that does belongs to a collection a restore is
    -- bringing back (pg_restore --section=pre-data makes the partitions; the collections' rows and their id
    -- sequence come with the data section): taking its id, as any rag_admin connected in between could, gave
    -- the new collection the restored one's chunks, documents and grants, and failed the restore's rows
    -- (red team 14).
    -- Once no restore is under way, an empty partition with no collection is what a dump that left rag's rows
    -- out (pg_dump --exclude-table-data 'rag.*') restores: the partitions are tables of the dump, the
    -- collections' rows and their sequence's value are data. Its id is passed over and the partition left as it
    -- is: the same state is also a schema restored before its data (pg_restore --schema-only, then
    -- --data-only), whose rows will want it.
    WHILE to_regclass(format('rag.%I', rag._chunk_partition(v_id))) IS NOT NULL LOOP
        IF (rag._restore_under_way() OR NOT rag._partition_left_empty(v_id))
           -- The worker may drop a dropped collection's partition meanwhile.
           AND to_regclass(format('rag.%I', rag._chunk_partition(v_id))) IS NOT NULL THEN
            RAISE EXCEPTION 'the chunks of collection id % already exist (rag.%): a restore of this database seems to be under way',
                            v_id, rag._chunk_partition(v_id)
                USING ERRCODE = 'object_in_use',
                      HINT = 'Create collections once the restore has ended; a restore should run with no other connection to the database (README, Backups).';
        END IF;
        UPDATE rag.collections c SET id = DEFAULT WHERE c.id = v_id RETURNING c.id INTO v_id;
    END LOOP;
    PERFORM rag._ensure_index(v_id);
    -- A served model that reads fewer tokens than a chunk holds refuses or truncates it; said now, not at the
    -- first failed document. (A local model's window is enforced when it is chosen.)
    v_window := rag._model_window(embedding_model);
    IF (SELECT kind FROM rag.providers p WHERE p.name = embedding_provider) <> 'local'
       AND (CASE chunk_unit WHEN 'tokens' THEN v_size ELSE v_size / rag._limit('chars_per_token')::integer END) > v_window THEN
        RAISE NOTICE 'chunks of up to % % may exceed the % tokens model "%" reads', v_size, chunk_unit, v_window, embedding_model
            USING HINT = format('Pass chunk_size => %s (characters) or less, or check the window the server runs the model with.',
                                v_window * rag._limit('chars_per_token')::integer);
    END IF;
    RETURN v_id;
END $$;

-- The role a grant names: the role of exactly that name, else 0 for public in any case (as GRANT … TO PUBLIC
-- reads it), else NULL.
CREATE FUNCTION rag._grantee_oid(p_grantee text) RETURNS oid
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = p_grantee),
                    CASE WHEN pg_catalog.lower(p_grantee) = 'public' THEN 0::oid END)
$$;

-- Lets `grantee` (a role name, or 'public') read, write or administer a collection. Owners, superusers and
-- admins of the collection may grant; granting again replaces the level.
CREATE FUNCTION @extschema@.rag_grant(collection text, grantee text, privilege text DEFAULT 'read') RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_collection integer := rag._collection_id(collection, 'admin');
    v_grantee oid;
BEGIN
    PERFORM rag._require_writable('rag_grant');
    IF privilege IS NULL OR privilege NOT IN ('read', 'write', 'admin') THEN
        RAISE EXCEPTION 'privilege must be read, write or admin, not %', coalesce(quote_literal(privilege), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'read: query and ask; write: also ingest and delete; admin: also drop, watch, reindex and grant.';
    END IF;
    -- A role's exact name first: "Public" and "PUBLIC" may be roles of their own (only public cannot).
    v_grantee := rag._grantee_oid(rag_grant.grantee);
    -- Held against a DROP ROLE until the grant commits (rag._lock_role); public is no role.
    IF v_grantee <> 0 THEN
        v_grantee := rag._lock_role(v_grantee);
    END IF;
    IF v_grantee IS NULL THEN
        RAISE EXCEPTION 'role "%" does not exist', rag_grant.grantee USING ERRCODE = 'undefined_object',
            HINT = 'Name an existing role, or public.';
    END IF;
    INSERT INTO rag.collection_grants AS g (collection_id, grantee, privilege, granted_by)
    VALUES (v_collection, v_grantee::regrole, rag_grant.privilege, rag._calling_role())
    ON CONFLICT ON CONSTRAINT collection_grants_pkey DO UPDATE
       SET privilege = EXCLUDED.privilege, granted_by = EXCLUDED.granted_by, granted_at = now();
END $$;

-- Takes a grant back; returns whether there was one.
CREATE FUNCTION @extschema@.rag_revoke(collection text, grantee text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_collection integer := rag._collection_id(collection, 'admin');
BEGIN
    PERFORM rag._require_writable('rag_revoke');
    DELETE FROM rag.collection_grants g
     WHERE g.collection_id = v_collection
       AND g.grantee = rag._grantee_oid(rag_revoke.grantee);
    RETURN FOUND;
END $$;

-- Roles, as PostgreSQL treats the objects a role owns or is granted (rag's role columns are oids its
-- dependency tracking does not see; src/api/roles.rs calls these from rag's utility hook, and no role may
-- execute them). REASSIGN OWNED hands the old roles' collections to the new role, and gives a watched
-- table's new owner what its watch's triggers need.
CREATE FUNCTION rag._reassign_owned(p_old oid[], p_new oid[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_new pg_catalog.pg_roles;
BEGIN
    SELECT * INTO v_new FROM pg_catalog.pg_roles r WHERE r.oid = p_new[1];
    -- Held against a DROP ROLE of the new role until this commits, as every writer of a role's oid holds it
    -- (rag._lock_role): PostgreSQL locks it only when it moves objects of its own (review of session 38).
    PERFORM rag._lock_role(p_new[1]);
    UPDATE rag.collections c SET owner = p_new[1]::regrole WHERE c.owner::oid = ANY (p_old);
    -- Providers and conversations go to the new role. Providers not to a superuser, though: a provider a
    -- superuser created counts as the server's own, and one made by an ordinary role must not become that by
    -- the usual clean-up before its creator is dropped (no creator on record: only a superuser may drop it).
    UPDATE rag.providers p
       SET created_by = CASE WHEN v_new.rolsuper THEN NULL ELSE v_new.rolname END,
           created_by_id = CASE WHEN v_new.rolsuper THEN NULL ELSE p_new[1]::regrole END
     WHERE p.created_by_id::oid = ANY (p_old);
    UPDATE rag.conversations c SET owner = v_new.rolname, owner_id = p_new[1]::regrole
     WHERE c.owner_id::oid = ANY (p_old);
    PERFORM rag._grant_watch_owners();
END $$;

-- After ALTER ROLE … RENAME, with the new name: providers, conversations and the ledger keep the role's name
-- beside the role, as the record; whose they are is the role's oid, which the rename kept.
CREATE FUNCTION rag._rename_role(p_new text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_role oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = p_new);
BEGIN
    UPDATE rag.providers p SET created_by = p_new WHERE p.created_by_id::oid = v_role;
    UPDATE rag.conversations c SET owner = p_new WHERE c.owner_id::oid = v_role;
    UPDATE rag.queries q SET role = p_new WHERE q.role_id::oid = v_role;
END $$;

-- After ALTER ROLE … RENAME: the watches the role wrote are recorded by name (rag.watches.written_by, which
-- rag._watch_runs_as reads), and keep their author under the new one.
CREATE FUNCTION rag._rename_watch_author(p_old text, p_new text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    -- PL/pgSQL: the hook calls it through fmgr, which refuses the NULL an SQL function returning void gives.
    UPDATE rag.watches w SET written_by = p_new WHERE w.written_by = p_old;
END $$;

-- DROP OWNED takes back what the roles were granted on the collections the caller administers and drops their
-- conversations (the ledger keeps its rows: it is the record of what was asked). Providers they made stay,
-- since collections of others may use them; the role then cannot be dropped until they are reassigned.
CREATE FUNCTION rag._drop_owned(p_roles oid[], p_caller oid) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    -- Only the grants the caller could take back with rag_revoke (an admin of the collection): PostgreSQL lets
    -- any member of a group run DROP OWNED BY the group, and its own part revokes only what the caller could;
    -- every member of rag_reader emptied every collection's grants to rag_reader (red team 28).
    DELETE FROM rag.collection_grants g USING rag.collections c
     WHERE c.id = g.collection_id AND g.grantee::oid = ANY (p_roles)
       AND rag._has_collection_privilege(c.id, c.owner, p_caller, 'admin');
    DELETE FROM rag.conversations c WHERE c.owner_id::oid = ANY (p_roles);
END $$;

-- How many of rag's rows name one of p_roles, as the active snapshot sees them: DROP ROLE in a REPEATABLE READ
-- or SERIALIZABLE transaction asks under the latest snapshot, after rag._refuse_drop_role (src/api/roles.rs).
CREATE FUNCTION rag._rows_naming_roles(p_roles oid[]) RETURNS bigint
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT (SELECT count(*) FROM rag.collections c WHERE c.owner::oid = ANY (p_roles))
         + (SELECT count(*) FROM rag.collection_grants g WHERE g.grantee::oid = ANY (p_roles))
         + (SELECT count(*) FROM rag.providers p WHERE p.created_by_id::oid = ANY (p_roles))
         + (SELECT count(*) FROM rag.conversations v WHERE v.owner_id::oid = ANY (p_roles))
         + (SELECT count(*) FROM rag.queries q WHERE q.role_id::oid = ANY (p_roles))
$$;

-- DROP ROLE of a role that owns a collection, holds a grant on one, made a provider or owns a conversation
-- here is undone: an oid left behind would name whichever role a restore elsewhere gives it, and a name
-- whichever role is next created with it. Called after the command, so only a caller whom
-- PostgreSQL let drop the roles learns what depends on them; p_names are the dropped roles' names, which the
-- catalog no longer has. Only this database can be seen from here.
CREATE FUNCTION rag._refuse_drop_role(p_roles oid[], p_names text[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_role text;
    v_owned text;
    v_granted text;
    v_providers text;
    v_conversations bigint;
BEGIN
    SELECT d.name, d.owned, d.granted, d.providers, d.conversations
      INTO v_role, v_owned, v_granted, v_providers, v_conversations
      FROM (SELECT r.name,
                   (SELECT string_agg(format('%L', c.name), ', ' ORDER BY c.name)
                      FROM rag.collections c WHERE c.owner::oid = r.oid) AS owned,
                   (SELECT string_agg(format('%L', c.name), ', ' ORDER BY c.name)
                      FROM rag.collection_grants g JOIN rag.collections c ON c.id = g.collection_id
                     WHERE g.grantee::oid = r.oid) AS granted,
                   (SELECT string_agg(format('%L', p.name), ', ' ORDER BY p.name)
                      FROM rag.providers p WHERE p.created_by_id::oid = r.oid) AS providers,
                   (SELECT count(*) FROM rag.conversations c WHERE c.owner_id::oid = r.oid) AS conversations
              FROM unnest(p_roles, p_names) AS r(oid, name)) d
     WHERE d.owned IS NOT NULL OR d.granted IS NOT NULL OR d.providers IS NOT NULL OR d.conversations > 0
     ORDER BY d.name LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'role "%" cannot be dropped because objects of rag depend on it', v_role
            USING ERRCODE = 'dependent_objects_still_exist',
                  DETAIL = concat_ws(E'\n', 'owner of collections ' || v_owned, 'privileges on collections ' || v_granted,
                                     'creator of providers ' || v_providers,
                                     CASE WHEN v_conversations > 0 THEN format('owner of %s conversations', v_conversations) END),
                  HINT = format('REASSIGN OWNED BY %I TO another role moves its collections, providers and conversations, and DROP OWNED BY %I takes back its grants and drops its conversations.',
                                v_role, v_role);
    END IF;
    -- The roles are gone: their questions stay in the ledger under their names, for no role (a bare oid left
    -- behind would be dumped as a number, and a restore elsewhere would give the rows to whichever role has it).
    UPDATE rag.queries q SET role_id = NULL WHERE q.role_id::oid = ANY (p_roles);
END $$;

CREATE FUNCTION @extschema@.rag_drop_collection(name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    c rag.collections;
BEGIN
    PERFORM rag._require_writable('rag_drop_collection');
    SELECT * INTO c FROM rag.collections WHERE collections.name = rag_drop_collection.name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM rag._require_privilege(c.id, 'admin');
    -- The collection's watches end with it, and their triggers are left doing nothing (rag._silence_watch).
    PERFORM rag._silence_watch(x.id) FROM rag.watches x WHERE x.collection_id = c.id ORDER BY x.id;
    -- The collection's chunks and every index on them go with its partition of rag.chunks, whole (the documents'
    -- cascade leaves them: rag._documents_deleted). Dropping a partition locks rag.chunks itself (ACCESS
    -- EXCLUSIVE) until the transaction ends, and first waits for every transaction that holds the partition (a
    -- pg_dump holds it for the whole dump) while holding rag.chunks: every search and every worker step of every
    -- collection waited that long. So the partition is marked here and the worker drops it in a moment of its
    -- own, when nothing holds it (rag._drop_partitions). Without the workers, at once as before.
    IF rag._workers_available() THEN
        IF to_regclass(format('rag.%I', rag._chunk_partition(c.id))) IS NOT NULL THEN
            EXECUTE format('COMMENT ON TABLE rag.%I IS %L', rag._chunk_partition(c.id),
                           rag._dropped_partition_mark(
                               (SELECT count(*)::integer FROM pg_catalog.pg_index i
                                 WHERE i.indrelid = pg_catalog.to_regclass(format('rag.%I', rag._chunk_partition(c.id))))));
        END IF;
        PERFORM rag._wake_worker();
    ELSE
        EXECUTE format('DROP TABLE IF EXISTS rag.%I', rag._chunk_partition(c.id));
    END IF;
    DELETE FROM rag.collections WHERE id = c.id;
    -- The ledger keeps its rows, without the id (no foreign key there: see rag.queries).
    UPDATE rag.queries SET collection_id = NULL WHERE collection_id = c.id;
    RETURN true;
END $$;

-- What rag_drop_collection writes on the partition of a collection it dropped: a comment, because only the
-- partition's owner may write one, it takes no lock that stops readers or writers of other collections, and it
-- goes with the partition into a dump (a dump taken before the worker dropped it restores it marked, and the
-- worker drops it then). It counts the partition's indexes: a restore makes them last (post-data, well after
-- the rows), and a partition the worker dropped before then failed the restore at the next of them ("relation
-- does not exist"; a restore that stops at its first error stopped there, the other tables' indexes and
-- constraints never made). So the worker drops it only once it has as many as when it was marked.
CREATE FUNCTION rag._dropped_partition_mark(p_indexes integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('rag: the collection of these chunks was dropped; the rag worker drops this table (%s indexes)',
                  p_indexes)
$$;

-- Partitions of rag.chunks that rag_drop_collection marked and whose collection is gone (its row is the proof: a
-- mark on a live collection's partition, which only rag's owner could write, is ignored). Only ids the
-- collections' sequence has given out: a restore makes the partitions (pre-data) before the collections' rows
-- and the sequence's value (data), and a marked partition it brings back (a dump taken before the worker dropped
-- it) must not be dropped under the restore's COPY into it.
CREATE FUNCTION rag._partitions_to_drop() RETURNS text[]
LANGUAGE sql STABLE AS $$
    -- The worker looks every naptime: the collection by its key (not each collection's partition name computed
    -- for each partition), and the comment only of partitions whose collection is gone.
    SELECT coalesce(array_agg(p.relname::text ORDER BY p.relname), '{}')
      FROM (SELECT x.oid, x.relname, substring(x.relname FROM '^chunks_c([0-9]+)$')::integer AS collection_id
              FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class x ON x.oid = i.inhrelid
             WHERE i.inhparent = 'rag.chunks'::pg_catalog.regclass) p
     WHERE NOT EXISTS (SELECT 1 FROM rag.collections c WHERE c.id = p.collection_id)
       AND p.collection_id <= coalesce(pg_catalog.pg_sequence_last_value('rag.collections_id_seq'), 0)
       AND pg_catalog.obj_description(p.oid, 'pg_class')
           = rag._dropped_partition_mark((SELECT count(*)::integer FROM pg_catalog.pg_index i WHERE i.indrelid = p.oid))
$$;

-- Whether the table named as a collection's partition is one a finished restore left without its collection:
-- attached to rag.chunks, with its primary key (the restore's post-data section ran), empty, and with no
-- comment but rag_drop_collection's mark. Anything else by that name (a partition still without its key, a
-- table not attached, one with chunks) may be a restore's under way.
CREATE FUNCTION rag._partition_left_empty(p_collection_id integer) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_has_rows boolean;
BEGIN
    -- Read in this order: the table may not exist, and only an attached partition is read (as rag's owner,
    -- whom no policy hides a row from).
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i
                    WHERE i.inhparent = 'rag.chunks'::pg_catalog.regclass
                      AND i.inhrelid = pg_catalog.to_regclass(format('rag.%I', rag._chunk_partition(p_collection_id)))
                      AND coalesce(pg_catalog.obj_description(i.inhrelid, 'pg_class'), '')
                          IN ('', rag._dropped_partition_mark((SELECT count(*)::integer FROM pg_catalog.pg_index x
                                                                WHERE x.indrelid = i.inhrelid)))
                      AND EXISTS (SELECT 1 FROM pg_catalog.pg_index x
                                   WHERE x.indrelid = i.inhrelid AND x.indisprimary)) THEN
        RETURN false;
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM rag.%I)', rag._chunk_partition(p_collection_id)) INTO v_has_rows;
    RETURN NOT v_has_rows;
END $$;

-- The worker's drop of those partitions (rag._partitions_to_drop). rag.chunks is taken first, as DROP TABLE takes
-- it, waiting at most lock_timeout (100 ms) for running searches, during which new ones queue behind it; the
-- partition then without waiting at all: whoever holds it (a pg_dump, a long search of the dropped collection)
-- holds it for long, and waiting for it would keep rag.chunks locked meanwhile. Not tried while someone holds
-- the partition, or holds rag.chunks from a transaction left open or a statement running for over a second
-- (the worker looks every naptime when idle, and each try would queue every search behind it for nothing). A
-- partition not dropped now is tried again at the worker's next upkeep; two workers may both try (the second
-- finds it gone). Returns how many it dropped.
CREATE FUNCTION rag._drop_partitions() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_partition text;
    v_dropped integer := 0;
BEGIN
    PERFORM set_config('lock_timeout', '100ms', true);
    FOREACH v_partition IN ARRAY rag._partitions_to_drop() LOOP
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'relation' AND l.pid <> pg_catalog.pg_backend_pid()
               AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
               AND (l.relation = pg_catalog.to_regclass(format('rag.%I', v_partition))
                    OR (l.relation = 'rag.chunks'::pg_catalog.regclass
                        AND (a.state LIKE 'idle in transaction%' OR a.query_start < now() - interval '1 second'))));
        BEGIN
            LOCK TABLE ONLY rag.chunks IN ACCESS EXCLUSIVE MODE;
            IF pg_catalog.to_regclass(format('rag.%I', v_partition)) IS NULL THEN
                CONTINUE;
            END IF;
            EXECUTE format('LOCK TABLE ONLY rag.%I IN ACCESS EXCLUSIVE MODE NOWAIT', v_partition);
            EXECUTE format('DROP TABLE rag.%I', v_partition);
            v_dropped := v_dropped + 1;
        EXCEPTION WHEN lock_not_available OR undefined_table THEN
            NULL;
        END;
    END LOOP;
    RETURN v_dropped;
END $$;

-- The GIN index of a collection's full-text side, on its partition of rag.chunks (like its HNSW index).
CREATE FUNCTION rag._keyword_index_name(p_collection_id integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'chunks_tsv_c' || p_collection_id
$$;

-- The GIN index of a collection's full-text side, made with its partition, and again by rag_reindex if it has
-- gone; nothing else makes it, so that a worker never races a restore that is about to.
CREATE FUNCTION rag._ensure_keyword_index(p_collection_id integer) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass(format('rag.%I', rag._keyword_index_name(p_collection_id))) IS NULL THEN
        EXECUTE format('CREATE INDEX %I ON rag.%I USING gin (tsv)', rag._keyword_index_name(p_collection_id),
                       rag._chunk_partition(p_collection_id));
    END IF;
END $$;

-- A collection's partition of rag.chunks, which holds its chunks and their indexes. rag.chunks is partitioned
-- by collection so that a search is planned over one collection's table and indexes: with every collection's
-- partial indexes on one table, the planner opened and tested all of them for each question (at 1,000
-- collections, 100 ms of a 103 ms search: BENCHMARKS.md §3, "Many collections").
CREATE FUNCTION rag._chunk_partition(p_collection_id integer) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'chunks_c' || p_collection_id
$$;

-- Makes a collection's partition of rag.chunks if it has none, with what every partition has: its keys, the
-- worker's index of chunks still to embed and the full-text side's GIN index. It is made apart and then attached,
-- which takes only a SHARE UPDATE EXCLUSIVE lock on rag.chunks: CREATE TABLE ... PARTITION OF would take an ACCESS
-- EXCLUSIVE one, waiting for every search under way (a rag_ask holds its lock through the chat call) while
-- every new one queued behind it. The partition is not an extension member (it is made at run time, not by the
-- extension's script), so pg_dump writes it, its rows and its indexes like any table of the database, and
-- restores attach it again. Its rows belong to documents (the keys are the partition's own: a foreign key on
-- rag.chunks would be restored before the documents it names); deleting documents deletes their chunks
-- (rag._documents_deleted).
CREATE FUNCTION rag._ensure_partition(p_collection_id integer) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_partition text := rag._chunk_partition(p_collection_id);
BEGIN
    IF to_regclass(format('rag.%I', v_partition)) IS NULL THEN
        -- Its rows stay whole in the heap up to a page (schema.sql says why).
        EXECUTE format('CREATE TABLE rag.%I (LIKE rag.chunks INCLUDING DEFAULTS INCLUDING STORAGE INCLUDING COMPRESSION,
                                             PRIMARY KEY (id), UNIQUE (document_id, ordinal))
                            WITH (toast_tuple_target = 8160)', v_partition);
        -- The worker's question, "what is still to embed for this document?", must not scan the partition.
        EXECUTE format('CREATE INDEX %I ON rag.%I (document_id, ordinal) WHERE embedding IS NULL',
                       v_partition || '_pending', v_partition);
        PERFORM rag._hide_statistics(format('rag.%I', v_partition)::regclass);
        -- Read through rag.chunks, whose policies apply to it; named directly, it shows its rows to rag's owner
        -- and superusers only: pg_read_all_data, which passes no policy, read hidden rows' text and other
        -- collections' chunks straight from the partition, which had none (helper-101). A dump keeps it.
        EXECUTE format('ALTER TABLE rag.%I ENABLE ROW LEVEL SECURITY', v_partition);
        PERFORM rag._ensure_keyword_index(p_collection_id);
        EXECUTE format('ALTER TABLE rag.chunks ATTACH PARTITION rag.%I FOR VALUES IN (%s)', v_partition,
                       p_collection_id);
    END IF;
    RETURN v_partition;
END $$;

-- The distance ceiling of a new collection that names none: rag.max_distance when it is set (in the session, the
-- database, the server), else the one measured for the model (rag_known_models()), else rag.max_distance's
-- default.
CREATE FUNCTION rag._default_max_distance(p_model text) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN (SELECT s.source FROM pg_catalog.pg_settings s WHERE s.name = 'rag.max_distance') <> 'default'
                THEN rag._setting('rag.max_distance')::double precision
                ELSE coalesce(rag._model_max_distance(p_model), rag._setting('rag.max_distance')::double precision) END
$$;

-- The schema pgvector is installed in, quoted for SQL text. rag's functions keep it off their search_path (a
-- schema others may create objects in: sql/security.sql) and name pgvector's type, operator and operator
-- class through it.
CREATE FUNCTION rag._vector_schema() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT pg_catalog.quote_ident(n.nspname)
      FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'vector'
$$;

-- The statement that builds the HNSW index of one of a collection's vector spaces, with the collection's build
-- parameters (rag_set_search); every HNSW index of the extension is made from it.
CREATE FUNCTION rag._hnsw_index_sql(c rag.collections, p_index text, p_column text, p_dimensions integer)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format('CREATE INDEX IF NOT EXISTS %1$I ON rag.%5$I USING hnsw ((%2$I::%6$s.vector(%3$s)) '
                  '%6$s.vector_cosine_ops)%4$s',
                  p_index, p_column, p_dimensions,
                  CASE WHEN c.hnsw_m IS NOT NULL OR c.hnsw_ef_construction IS NOT NULL
                       THEN format(' WITH (%s)', concat_ws(', ', 'm = ' || c.hnsw_m,
                                                           'ef_construction = ' || c.hnsw_ef_construction))
                       ELSE '' END,
                  rag._chunk_partition(c.id), rag._vector_schema())
$$;

-- One HNSW index per collection, on its partition, on the embedding cast to the collection's dimension: pgvector
-- indexes only fixed-dimension vectors, and collections of different models share one table.
CREATE FUNCTION rag._ensure_index(p_collection_id integer) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    c rag.collections;
    v_index text;
    v_m integer;
    v_ef_construction integer;
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = p_collection_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- The partition and the full-text side's index need no dimension: they exist from the start.
    PERFORM rag._ensure_partition(c.id);
    IF c.dimensions IS NULL THEN
        RETURN NULL;
    END IF;
    IF c.index_name IS NOT NULL THEN
        RETURN c.index_name;
    END IF;
    IF c.dimensions > 2000 THEN
        -- pgvector's HNSW takes at most 2000 dimensions for vector; such collections are searched exactly.
        RAISE NOTICE 'collection "%" has % dimensions, above HNSW''s 2000: searches will scan', c.name, c.dimensions;
        RETURN NULL;
    END IF;
    v_index := (rag._hnsw_index_names(c.id, c.vector_column))[1];
    EXECUTE rag._hnsw_index_sql(c, v_index, c.vector_column, c.dimensions);
    -- A build takes minutes at a million chunks, without a lock on the collection's row; rag_set_search may
    -- change the build parameters meanwhile, and it drops only an index it can see. The row as it is now decides
    -- (this UPDATE waits for such a change to commit, and one that comes after it finds the index and drops it):
    -- an index built with parameters no longer wanted is dropped again here and the idle worker builds the
    -- right one.
    UPDATE rag.collections u SET index_name = v_index WHERE u.id = c.id
    RETURNING u.hnsw_m, u.hnsw_ef_construction INTO v_m, v_ef_construction;
    IF v_m IS DISTINCT FROM c.hnsw_m OR v_ef_construction IS DISTINCT FROM c.hnsw_ef_construction THEN
        EXECUTE format('DROP INDEX rag.%I', v_index);
        UPDATE rag.collections SET index_name = NULL WHERE id = c.id;
        RETURN NULL;
    END IF;
    RETURN v_index;
END $$;

-- Whether a collection is in a bulk load: at least rag._limit('bulk_load_documents') of its documents are
-- queued while it has no HNSW index or fewer ready documents than that (a first load, a rag_reindex, a large
-- load into a small collection). Its vectors are then stored without the index, whose per-row upkeep costs more
-- than the rest of the pipeline, and the index is built once as the load ends. A load under way (no index, and
-- that many documents ready or waiting) ends only when fewer than rag._limit('bulk_load_tail_documents')
-- documents are due (waiting and not in a retry's back-off), so that its last documents are not stored through
-- the index either, nor wait for its build. The counts stop at their limits, so the answer costs the same at a
-- million documents.
CREATE FUNCTION rag._bulk_loading(p_collection_id integer) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_limit integer := rag._limit('bulk_load_documents')::integer;
    v_tail integer := rag._limit('bulk_load_tail_documents')::integer;
BEGIN
    -- The queue is read from its newest items back: it is served oldest first, so the items the load has
    -- finished lie at its front, deleted, and their index entries stay until no snapshot can see them (a
    -- rag_wait running for the whole load holds one): read from the front, each call walked past all of them,
    -- 5,000 heap visits a batch near the end of a 3,000-document load.
    IF (SELECT c.index_name IS NOT NULL FROM rag.collections c WHERE c.id = p_collection_id) THEN
        -- A large load into a small collection.
        RETURN EXISTS (SELECT 1 FROM rag.queue q WHERE q.collection_id = p_collection_id
                        ORDER BY q.not_before DESC, q.id DESC OFFSET v_limit - 1)
           AND NOT EXISTS (SELECT 1 FROM rag.documents d WHERE d.collection_id = p_collection_id
                              AND d.status = 'ready' OFFSET v_limit - 1);
    END IF;
    -- No index: a load starts with that many documents waiting, and one under way ends below the tail.
    RETURN EXISTS (SELECT 1 FROM rag.queue q WHERE q.collection_id = p_collection_id
                    ORDER BY q.not_before DESC, q.id DESC OFFSET v_limit - 1)
        OR (EXISTS (SELECT 1 FROM rag.queue q WHERE q.collection_id = p_collection_id AND q.not_before <= now()
                     ORDER BY q.not_before DESC, q.id DESC OFFSET v_tail - 1)
            AND EXISTS (SELECT 1 FROM rag.documents d WHERE d.collection_id = p_collection_id
                           AND d.status <> 'failed' OFFSET v_limit - 1));
END $$;

-- Drops a collection's HNSW index for a bulk load (rag._bulk_loading). DROP INDEX needs the collection's partition to
-- itself for a moment, so it waits at most 100 ms for running searches and otherwise leaves the index in place; the
-- next batch tries again. Returns whether the index is gone.
CREATE FUNCTION rag._suspend_index(p_collection_id integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_index text;
    v_spare text;
    v_lock_timeout text := current_setting('lock_timeout');
BEGIN
    SELECT index_name, rag._hnsw_index_spare(c) INTO v_index, v_spare FROM rag.collections c WHERE id = p_collection_id;
    IF v_index IS NULL THEN
        RETURN true;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', '100ms', true);
        EXECUTE format('DROP INDEX IF EXISTS rag.%I', v_index);
        -- A former index that a rebuild left beside it (rag._rebuild_index) goes too. Looked up first: IF EXISTS
        -- sends a NOTICE for the one that is not there, which reaches rag_process_queue's caller.
        IF to_regclass(format('rag.%I', v_spare)) IS NOT NULL THEN
            EXECUTE format('DROP INDEX rag.%I', v_spare);
        END IF;
        UPDATE rag.collections SET index_name = NULL WHERE id = p_collection_id;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
        RETURN true;
    EXCEPTION WHEN lock_not_available OR insufficient_privilege THEN
        -- The subtransaction's rollback restored lock_timeout as well.
        RETURN false;
    END;
END $$;

-- The one decision on a collection's HNSW index during loads, taken at the end of each stored batch: a bulk
-- load (rag._bulk_loading) that finds the index drops it (rag._suspend_index); a small collection with vectors,
-- no index and no bulk load (a first small load) gets it built in the transaction that makes the batch's
-- documents ready, so that with one worker they are ready with their index. One with at least
-- rag._limit('bulk_load_documents') ready documents (the end of a bulk load) gets it after the batch, in a
-- transaction of its own (rag._build_index_after_load): the load's last documents do not wait for a build that
-- takes seconds at 10,000 chunks and minutes at a million, and the collection is searched exactly meanwhile. The decision needs the
-- collection's row to itself (FOR NO KEY UPDATE: an ingest's foreign key check does not stand in its way). While
-- another store shares the row (rag._lock_for_store: a second worker, or rag_process_queue), this one leaves
-- the decision to that store's batch; waiting for it instead would deadlock, each store holding the row the
-- other needs. A drop that was skipped is tried again by the next batch, a build by the next batch or the idle
-- worker's repair (rag._repair_indexes; rag_process_queue runs it when the queue is empty). A build that fails
-- (out of disk, say) must not fail the batch, or the next one, forever: it is reported and left to that repair.
CREATE FUNCTION rag._fit_index_to_load(p_collection_id integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c rag.collections;
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = p_collection_id;
    IF NOT FOUND OR c.dimensions IS NULL OR c.dimensions > 2000
       -- Nothing to change (a bulk load without the index, or the index without a bulk load), which is most
       -- batches: then the row is not locked, or the next store of another worker would wait for this one.
       OR rag._bulk_loading(c.id) = (c.index_name IS NULL) THEN
        RETURN;
    END IF;
    -- A large collection without its index: built after this batch commits.
    IF c.index_name IS NULL AND EXISTS (
           SELECT 1 FROM rag.documents d WHERE d.collection_id = c.id AND d.status = 'ready'
            OFFSET rag._limit('bulk_load_documents')::integer - 1) THEN
        RETURN;
    END IF;
    SELECT * INTO c FROM rag.collections WHERE id = p_collection_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF rag._bulk_loading(c.id) THEN
        IF c.index_name IS NOT NULL THEN
            PERFORM rag._suspend_index(c.id);
        END IF;
    ELSIF c.index_name IS NULL THEN
        PERFORM rag._build_index_after_load(c.id);
    END IF;
END $$;

-- The build at the end of a bulk load, in a transaction of its own after the load's last documents are ready
-- (the worker calls it after every stored batch; rag._fit_index_to_load leaves it here), and a small
-- collection's build inside its store's transaction (rag._fit_index_to_load): when the collection has vectors,
-- no HNSW index and no bulk load under way. It waits at most a second for the writers of the collection's partition
-- (CREATE INDEX holds writes, not reads, while it runs, and a build waiting for a long transaction would make
-- every store queue behind it), and skips a collection whose row another store shares; the next batch or the
-- idle repair tries again. Returns whether it built the index.
CREATE FUNCTION rag._build_index_after_load(p_collection_id integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    c rag.collections;
    v_lock_timeout text := current_setting('lock_timeout');
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = p_collection_id;
    -- A build that failed rests (rag.upkeep_failures), here too: a collection whose index cannot be built (out
    -- of disk) was otherwise built again with every batch stored into it.
    IF NOT FOUND OR c.dimensions IS NULL OR c.dimensions > 2000 OR c.index_name IS NOT NULL
       OR rag._bulk_loading(c.id) OR c.id = ANY (rag._upkeep_resting('index build')) THEN
        RETURN false;
    END IF;
    SELECT * INTO c FROM rag.collections WHERE id = p_collection_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND OR c.index_name IS NOT NULL OR rag._upkeep_held(c.id, 'index build') THEN
        RETURN false;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', '1s', true);
        PERFORM rag._ensure_index(c.id);
        -- A load has ended: the idle worker measures the collection's lexemes again without waiting. Unless it
        -- is measuring them right now (it holds the row, rag._measure_lexemes): waiting for that would cost the
        -- index just built its lock_timeout; that measure then stands until the next is due.
        DELETE FROM rag.lexeme_measures m
         WHERE m.collection_id = (SELECT l.collection_id FROM rag.lexeme_measures l
                                   WHERE l.collection_id = c.id FOR UPDATE SKIP LOCKED);
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
    EXCEPTION WHEN lock_not_available THEN
        -- The subtransaction's rollback restored lock_timeout as well.
        RETURN false;
    WHEN OTHERS THEN
        RAISE WARNING 'building the HNSW index of collection % failed: %', c.id, SQLERRM
            USING HINT = 'The workers try again after a pause that doubles with each failure, up to an hour (rag.status shows it); searches stay exact until then.';
        PERFORM rag._upkeep_failed(c.id, 'index build', SQLERRM);
        RETURN false;
    END;
    RETURN (SELECT u.index_name IS NOT NULL FROM rag.collections u WHERE u.id = c.id);
END $$;

-- Collections with chunks that should have an HNSW index (their dimension allows one) and have none recorded:
-- the one test of it, for the worker's read-only look (src/store) and for rag._repair_indexes. A bulk load builds
-- its index when it ends, not while another worker looks meanwhile. An index recorded in index_name and missing
-- is not built here: pg_dump writes each partition's indexes, and a restore creates them after the partition's
-- rows, so a worker building it meanwhile would make the restore's CREATE INDEX fail (rag_reindex forgets an
-- index that is gone, and the worker builds it then). p_idle: the caller has nothing it may claim (an
-- idle worker, rag_process_queue at the end of the queue); then a collection whose load has fewer than
-- rag._limit('bulk_load_documents') documents left, none of them in a worker's hands, counts as ended: what
-- keeps them due is an open breaker (a provider down), and a few documents held back must not keep a large
-- collection without its index for the outage.
CREATE FUNCTION rag._collections_missing_indexes(p_idle boolean DEFAULT false) RETURNS integer[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_missing integer[] := '{}';
    v_id integer;
BEGIN
    FOR v_id IN SELECT c.id FROM rag.collections c
                 WHERE c.dimensions BETWEEN 1 AND 2000 AND c.index_name IS NULL
                   AND (NOT rag._bulk_loading(c.id)
                        OR (p_idle
                            AND NOT EXISTS (SELECT 1 FROM rag.queue q WHERE q.collection_id = c.id
                                             OFFSET rag._limit('bulk_load_documents')::integer - 1)
                            AND NOT EXISTS (SELECT 1 FROM rag.queue q WHERE q.collection_id = c.id
                                               AND q.claimed_by IS NOT NULL)))
                 ORDER BY c.id LOOP
        -- One collection at a time, so that the look is planned over its partition alone.
        IF EXISTS (SELECT 1 FROM rag.chunks ch WHERE ch.collection_id = v_id) THEN
            v_missing := v_missing || v_id;
        END IF;
    END LOOP;
    RETURN v_missing;
END $$;

-- How long a collection's upkeep step rests after its p_failures-th failure in a row: a minute, doubling up to an
-- hour. A step that fails one way each time (a full disk) costs a whole index build per try.
CREATE FUNCTION rag._upkeep_pause(p_failures integer) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT pg_catalog.make_interval(secs => least(3600, 60 * 2 ^ least(greatest(p_failures, 1) - 1, 6)))
$$;

-- Records that a collection's upkeep step failed with p_error (rag.upkeep_failures): called by the step's
-- exception handler, after its subtransaction rolled back, so that the record is kept. Nobody waits for a row of
-- rag.upkeep_failures that another transaction holds: a step takes its failure's row first
-- (rag._upkeep_held), and every other writer skips held rows. Waiting deadlocked: the step's transaction holds
-- the collection's partition (a store's its documents too), and a rag_reindex that had deleted the failure's row
-- waited for those. The pause counts from the failure (clock_timestamp), not from the start of a transaction
-- that may have built other indexes before.
CREATE FUNCTION rag._upkeep_failed(p_collection_id integer, p_step text, p_error text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f rag.upkeep_failures;
    v_lock_timeout text;
BEGIN
    SELECT * INTO f FROM rag.upkeep_failures u WHERE u.collection_id = p_collection_id AND u.step = p_step
       FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE rag.upkeep_failures u
           SET failures = f.failures + 1, last_error = p_error,
               next_try = clock_timestamp() + rag._upkeep_pause(f.failures + 1)
         WHERE u.collection_id = p_collection_id AND u.step = p_step;
    ELSIF NOT EXISTS (SELECT 1 FROM rag.upkeep_failures u WHERE u.collection_id = p_collection_id AND u.step = p_step) THEN
        -- Another transaction that recorded the same failure a moment ago and has not committed yet would make
        -- this insert wait for it: not for long.
        v_lock_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '50ms', true);
        BEGIN
            INSERT INTO rag.upkeep_failures (collection_id, step, failures, last_error, next_try)
            VALUES (p_collection_id, p_step, 1, p_error, clock_timestamp() + rag._upkeep_pause(1))
            ON CONFLICT (collection_id, step) DO NOTHING;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
    END IF;
END $$;

-- Whether another transaction is on the collection's step p_step now: it holds the step's failure row. Else
-- this transaction takes that row (when there is one) for the step it is about to try, so that two workers (or
-- a worker and rag_process_queue) neither try one failing build at once nor count its failure twice, and a
-- session holding the row does not make the step be tried again and again meanwhile.
CREATE FUNCTION rag._upkeep_held(p_collection_id integer, p_step text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM rag.upkeep_failures u WHERE u.collection_id = p_collection_id AND u.step = p_step
       FOR UPDATE SKIP LOCKED;
    RETURN NOT FOUND AND EXISTS (SELECT 1 FROM rag.upkeep_failures u
                                  WHERE u.collection_id = p_collection_id AND u.step = p_step);
END $$;

-- Forgets a collection's failures of p_step (of every step when NULL): once the step has succeeded, or when an
-- admin asks for a new try. A row another transaction holds is skipped, not waited for (rag._upkeep_failed says
-- why): a worker is trying that step right now, and records or forgets it. Returns how many went.
CREATE FUNCTION rag._upkeep_forget(p_collection_id integer, p_step text) RETURNS integer
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM rag.upkeep_failures f
         WHERE (f.collection_id, f.step) IN (SELECT u.collection_id, u.step FROM rag.upkeep_failures u
                                              WHERE u.collection_id = p_collection_id
                                                AND (p_step IS NULL OR u.step = p_step)
                                                FOR UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;

-- The collections whose step p_step rests after failing: the workers leave it alone until its next_try.
CREATE FUNCTION rag._upkeep_resting(p_step text) RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(f.collection_id), '{}') FROM rag.upkeep_failures f
     WHERE f.step = p_step AND f.next_try > now()
       -- A failed switch's rest is not the clearing's: a change cancelled while a worker held the failure's row
       -- (the cancel's forget skips it) would otherwise keep its new vectors until the rest ends (review of
       -- red team 21's fix).
       AND NOT (p_step = 'model change'
                AND EXISTS (SELECT 1 FROM rag.migrations m WHERE m.collection_id = f.collection_id AND m.state = 'clearing'))
$$;

-- The collections whose failure of p_step no longer applies: the collection is gone, or the step is no longer
-- due (an index built since by a load's end or rag_reindex, a collection that no longer needs one (its
-- documents deleted, or a model of more than 2,000 dimensions), a rebuild the admin undid, a model change that
-- switched or was cancelled). Such a failure is forgotten (rag._settle_upkeep), so that rag.status shows no old
-- error and no worker comes back for it.
CREATE FUNCTION rag._upkeep_unsettled(p_step text) RETURNS integer[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(f.collection_id), '{}')
      FROM rag.upkeep_failures f LEFT JOIN rag.collections c ON c.id = f.collection_id
     WHERE f.step = p_step
       AND CASE p_step
               WHEN 'index build' THEN c.id IS NULL OR c.index_name IS NOT NULL
                                       OR NOT f.collection_id = ANY (rag._collections_missing_indexes(true))
               WHEN 'index rebuild' THEN NOT f.collection_id = ANY (rag._collections_to_rebuild())
               ELSE NOT EXISTS (SELECT 1 FROM rag.migrations m WHERE m.collection_id = f.collection_id)
           END
$$;

-- Forgets those, skipping rows another transaction holds (rag._upkeep_forget).
CREATE FUNCTION rag._settle_upkeep(p_step text) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM rag.upkeep_failures f
     WHERE (f.collection_id, f.step) IN (SELECT u.collection_id, u.step FROM rag.upkeep_failures u
                                          WHERE u.step = p_step AND u.collection_id = ANY (rag._upkeep_unsettled(p_step))
                                            FOR UPDATE SKIP LOCKED)
$$;

-- Whether step p_step has work, for the worker's read-only looks (src/store): a collection in p_due (where the
-- step is due) that does not rest, or a failure to forget.
CREATE FUNCTION rag._upkeep_due(p_step text, p_due integer[]) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest(p_due) d(id) WHERE NOT d.id = ANY (rag._upkeep_resting(p_step)))
        OR (EXISTS (SELECT 1 FROM rag.upkeep_failures f WHERE f.step = p_step)
            AND cardinality(rag._upkeep_unsettled(p_step)) > 0)
$$;

-- Creates the HNSW index of every collection that should have one and has none (rag._collections_missing_indexes:
-- a build after a load that could not wait for the writers of its partition, a collection whose build
-- parameters changed), one at a time; a worker calls it when idle (p_idle) and every few seconds while busy. It
-- gives up at once when another session holds the partition, and tries again later.
CREATE FUNCTION rag._repair_indexes(p_idle boolean DEFAULT false) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_missing integer[];
    v_id integer;
    v_lock_timeout text;
BEGIN
    -- Put back at the end: rag_process_queue runs this inside its caller's transaction.
    v_lock_timeout := current_setting('lock_timeout');
    PERFORM set_config('lock_timeout', '100ms', true);
    -- Collected first: CREATE INDEX refuses to run while a query of this session still reads rag.chunks. Only
    -- those of the collections rag_process_queue's caller may process (rag._claim_scope), when it is the caller:
    -- another's index built in its transaction held that collection's stores until it ended.
    PERFORM rag._settle_upkeep('index build');
    v_missing := ARRAY(SELECT m.id FROM unnest(rag._collections_missing_indexes(p_idle)) m(id)
                        WHERE (rag._claim_scope() IS NULL OR m.id = ANY (rag._claim_scope()))
                          AND NOT m.id = ANY (rag._upkeep_resting('index build')));
    FOREACH v_id IN ARRAY v_missing LOOP
        -- One collection's writers holding its partition past the lock_timeout gave up the whole repair, every
        -- time, for every collection after it (red team 19): each on its own, tried again next time.
        CONTINUE WHEN rag._upkeep_held(v_id, 'index build');
        -- The collection's row first, without waiting, as the other builds take it (rag._build_index_after_load,
        -- rag._rebuild_index): the build ends by recording the index in that row, and a session holding it (an
        -- admin's open rag_set_search) made that wait time out after every whole build, thrown away and tried
        -- again at the next round, unrecorded (red team 20). Held, the collection waits for a later round.
        PERFORM 1 FROM rag.collections c WHERE c.id = v_id FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        BEGIN
            PERFORM rag._ensure_index(v_id);
            PERFORM rag._upkeep_forget(v_id, 'index build');
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        WHEN OTHERS THEN
            -- A build that fails (out of disk) must not keep the collections after it without their indexes.
            RAISE WARNING 'building the HNSW index of collection % failed: %', v_id, SQLERRM
                USING HINT = 'The workers try again after a pause that doubles with each failure, up to an hour (rag.status shows it); the collection is searched exactly meanwhile.';
            PERFORM rag._upkeep_failed(v_id, 'index build', SQLERRM);
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    RETURN cardinality(v_missing);
END $$;

-- The two names the HNSW index of a collection's vector column takes in turn, the first the one a build makes.
-- A rebuild with new build parameters (rag_set_search) builds under the name not in use while searches go on
-- with the index in use, then drops that one. Every build and drop of such an index names it through here.
CREATE FUNCTION rag._hnsw_index_names(p_collection_id integer, p_column text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['chunks_' || p_column || '_c' || p_collection_id, 'chunks_' || p_column || '_c' || p_collection_id || '_r']
$$;

-- Whether an index of the collection was built with the build parameters it asks for now: the index's own
-- storage options (what rag._hnsw_index_sql wrote in WITH) are the record, and they survive a dump and restore.
-- NULL when there is no such index. Read from pg_class under the query's snapshot rather than through
-- to_regclass, whose cached name lookup a statement that runs for a while does not refresh (a wait for a
-- rebuild never saw the new index under a name that had been dropped).
CREATE FUNCTION rag._hnsw_index_current(c rag.collections, p_index text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(x.reloptions, '{}') @> w.options AND w.options @> coalesce(x.reloptions, '{}')
      FROM pg_catalog.pg_class x,
           (SELECT array_remove(ARRAY['m=' || c.hnsw_m, 'ef_construction=' || c.hnsw_ef_construction], NULL)
                   AS options) w
     WHERE x.relname = p_index AND x.relnamespace = 'rag'::pg_catalog.regnamespace
$$;

-- The other name of the pair (rag._hnsw_index_names) than the one in use, where a rebuild builds; an index there
-- is the collection's former one, which the rebuild could not drop yet (searches held the partition).
CREATE FUNCTION rag._hnsw_index_spare(c rag.collections) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN c.index_name = n[1] THEN n[2] ELSE n[1] END FROM rag._hnsw_index_names(c.id, c.vector_column) n
$$;

-- Collections whose HNSW index is in place but built with other build parameters than they ask for now
-- (rag_set_search), or that still have a former index beside it: the worker's work for rag._rebuild_index. As
-- for a missing index (rag._collections_missing_indexes), only collections with chunks and no bulk load under
-- way (which drops the index anyway).
CREATE FUNCTION rag._collections_to_rebuild() RETURNS integer[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_due integer[] := '{}';
    c rag.collections;
BEGIN
    -- The catalog first, in one pass: most collections' indexes are current and alone.
    FOR c IN SELECT u.* FROM rag.collections u
               JOIN pg_catalog.pg_class x ON x.relname = u.index_name
                AND x.relnamespace = 'rag'::pg_catalog.regnamespace
              WHERE u.dimensions BETWEEN 1 AND 2000
                AND (NOT rag._hnsw_index_current(u, u.index_name)
                     OR EXISTS (SELECT 1 FROM pg_catalog.pg_class y
                                 WHERE y.relname = rag._hnsw_index_spare(u)
                                   AND y.relnamespace = 'rag'::pg_catalog.regnamespace))
              ORDER BY u.id LOOP
        IF NOT rag._bulk_loading(c.id) AND EXISTS (SELECT 1 FROM rag.chunks ch WHERE ch.collection_id = c.id) THEN
            v_due := v_due || c.id;
        END IF;
    END LOOP;
    RETURN v_due;
END $$;

-- Builds a collection's HNSW index again with the build parameters it asks for now, under the spare name, while
-- searches go on with the one in use; then records it and drops the former one. One step per call, each in a
-- transaction of the worker's own (rag._rebuild_indexes takes one collection per call): a former index left
-- beside the current one is only dropped (the drop's ACCESS EXCLUSIVE lock, held until commit, must not last
-- through a build); otherwise the build. The collection's row is taken first (FOR NO KEY UPDATE SKIP LOCKED), in
-- the order a store takes its locks (the row, then the partition): a store or an admin's uncommitted change
-- holding it skips the rebuild until a later call, rather than the build waiting for the row after it is done
-- and giving up on its lock_timeout, work lost. CREATE INDEX holds the collection's writes (not its reads) while
-- it runs, as every build does; the drop needs the partition to itself for a moment, and when searches hold it
-- (lock_timeout, the caller's) the former index stays beside the new one (costing its upkeep on writes) until a
-- later call drops it. Only the worker calls it: in rag_process_queue's transaction the drop would hold the
-- partition until the caller's transaction ended. Returns whether the collection's index is now current and
-- alone.
CREATE FUNCTION rag._rebuild_index(p_collection_id integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    c rag.collections;
    v_spare text;
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = p_collection_id FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND OR c.index_name IS NULL OR pg_catalog.to_regclass('rag.' || pg_catalog.quote_ident(c.index_name)) IS NULL THEN
        -- Held, gone, or no index to replace: a missing one is rag._repair_indexes's, or rag_reindex's.
        RETURN false;
    END IF;
    v_spare := rag._hnsw_index_spare(c);
    IF pg_catalog.to_regclass('rag.' || pg_catalog.quote_ident(v_spare)) IS NOT NULL THEN
        BEGIN
            EXECUTE format('DROP INDEX rag.%I', v_spare);
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
        RETURN false;
    END IF;
    IF rag._hnsw_index_current(c, c.index_name) THEN
        RETURN true;
    END IF;
    EXECUTE rag._hnsw_index_sql(c, v_spare, c.vector_column, c.dimensions);
    -- The row is this transaction's: the parameters cannot have changed since it was read.
    UPDATE rag.collections u SET index_name = v_spare WHERE u.id = c.id;
    BEGIN
        EXECUTE format('DROP INDEX rag.%I', c.index_name);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END $$;

-- The worker's rebuilds (rag._collections_to_rebuild): one due collection's step (rag._rebuild_index), so that
-- each commits before the next begins; the worker calls again at its next upkeep. The collection is drawn at
-- random among those due, so that one whose partition stays held does not keep the others waiting. It gives up
-- at once when another session holds the partition. A build that fails (out of disk, say) is reported and must
-- not stop the worker's other work: that collection's rebuild rests (rag._upkeep_failed; the pause doubles with
-- each failure in a row, up to an hour), rather than being built again at every upkeep, every two seconds while
-- busy, at the cost of a whole build each time. Returns the collection stepped (NULL when none was due).
CREATE FUNCTION rag._rebuild_indexes() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_due integer[] := rag._collections_to_rebuild();
    v_id integer;
    v_done boolean;
BEGIN
    PERFORM set_config('lock_timeout', '100ms', true);
    PERFORM rag._settle_upkeep('index rebuild');
    v_due := ARRAY(SELECT d.id FROM unnest(v_due) d(id) WHERE NOT d.id = ANY (rag._upkeep_resting('index rebuild')));
    IF cardinality(v_due) = 0 THEN
        RETURN NULL;
    END IF;
    v_id := v_due[1 + floor(random() * cardinality(v_due))::integer];
    IF rag._upkeep_held(v_id, 'index rebuild') THEN
        RETURN v_id;
    END IF;
    BEGIN
        -- False when the collection's row or its former index was held: neither a success nor a failure (a
        -- success would start a failing build's pauses over).
        v_done := rag._rebuild_index(v_id);
        IF v_done THEN
            PERFORM rag._upkeep_forget(v_id, 'index rebuild');
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        -- The collection's writers hold its partition: a later call tries again. Neither a success nor a failure.
        NULL;
    WHEN OTHERS THEN
        RAISE WARNING 'rebuilding the HNSW index of collection % with its new build parameters failed: %', v_id, SQLERRM
            USING HINT = 'The workers try again after a pause that doubles with each failure, up to an hour (rag.status shows it); searches use the current index meanwhile.';
        PERFORM rag._upkeep_failed(v_id, 'index rebuild', SQLERRM);
    END;
    RETURN v_id;
END $$;

-- The id of a collection the caller (the role calling into rag, not a SECURITY DEFINER owner) holds
-- `p_privilege` on: 'read', 'write' or 'admin'. Every function that takes a collection name goes through here.
CREATE FUNCTION rag._collection_id(p_name text, p_privilege text DEFAULT 'read') RETURNS integer
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    c rag.collections;
BEGIN
    IF p_name IS NULL THEN
        RAISE EXCEPTION 'collection must not be NULL' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Name a collection; rag.status lists those you may use.';
    END IF;
    SELECT * INTO c FROM rag.collections WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'collection "%" does not exist', p_name
            USING ERRCODE = 'undefined_object',
                  HINT = 'Create it with rag_create_collection(''' || coalesce(p_name, '') || '''), or list them in rag.status.';
    END IF;
    PERFORM rag._require_privilege(c.id, p_privilege);
    RETURN c.id;
END $$;

-- Chunks and embeds every document of a collection again: after its chunk settings changed, or after
-- rag_set_embedding_model. Watched rows are read again from their tables.
CREATE FUNCTION @extschema@.rag_reindex(collection text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_collection integer := rag._collection_id(collection, 'admin');
    v_watch integer;
    v_count bigint;
BEGIN
    PERFORM rag._require_writable('rag_reindex');
    -- An HNSW index dropped by hand (or left out of a restore) is built again after the reindex; the collection's
    -- row is taken before its documents, the order a store takes them in.
    UPDATE rag.collections c SET index_name = NULL
     WHERE c.id = v_collection AND c.index_name IS NOT NULL
       AND to_regclass('rag.' || quote_ident(c.index_name)) IS NULL;
    -- Likewise the full-text side's index.
    PERFORM rag._ensure_partition(v_collection);
    PERFORM rag._ensure_keyword_index(v_collection);
    -- The documents in id order, as rag._delete_watch_documents does and for the same reason: the UPDATEs
    -- below meet them in their rows' order, a store under way locks them in id order.
    PERFORM 1 FROM rag.documents WHERE collection_id = v_collection ORDER BY id FOR UPDATE;
    DELETE FROM rag.chunks ch USING rag.documents d
     WHERE ch.collection_id = v_collection
       AND d.id = ch.document_id AND d.collection_id = v_collection AND d.watch_id IS NULL;
    UPDATE rag.documents SET status = 'processing', failure_reason = NULL, chunks_total = 0, chunks_embedded = 0,
           updated_at = now()
     WHERE collection_id = v_collection AND watch_id IS NULL;
    INSERT INTO rag.queue (document_id, collection_id)
    SELECT id, v_collection FROM rag.documents WHERE collection_id = v_collection AND watch_id IS NULL
    ON CONFLICT (document_id) DO UPDATE SET not_before = now(), attempts = 0, first_failure_at = NULL,
                                            unfinished_claims = 0;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    -- Rows of watched tables: forget their text so the worker rebuilds it from the row.
    UPDATE rag.documents SET content_sha256 = '\x'::bytea
     WHERE collection_id = v_collection AND watch_id IS NOT NULL;
    FOR v_watch IN SELECT id FROM rag.watches WHERE collection_id = v_collection LOOP
        v_count := v_count + rag._reindex_watch(v_watch);
    END LOOP;
    -- Whatever upkeep of the collection failed and rests is tried again with the new chunks (one a worker is
    -- trying right now is left to it: rag._upkeep_forget).
    PERFORM rag._upkeep_forget(v_collection, NULL);
    PERFORM rag._wake_worker();
    RETURN v_count;
END $$;

-- Documents that say they were chunked while none of their chunks is there: what a restore of a dump that
-- left the chunks out brings back (pg_dump --exclude-table-data 'rag.chunks_c*', a smaller backup without what
-- can be made again). Their searches found nothing while rag.status counted the chunks the documents remember.
-- By document, not by collection: a document of the collection due at the restore's end may be chunked before
-- anyone looks. Failed documents are left to their failure.
-- Only collections whose partition has every index it is made with, and those in p_collections when it is
-- given: a restore's post-data section makes the partitions' keys, then their indexes, and the worker must not
-- write into a partition (nor drop and build its HNSW index for a bulk load) before the restore has made them,
-- or the restore's CREATE INDEX fails.
-- One partition at a time, each read by name: a query over rag.chunks would open (and lock) every partition,
-- and wait for whoever holds any of them. A collection whose partition, by the statistics, holds at least as
-- many chunks as its documents count is passed over without reading it (statistics lag a little behind the
-- writes, so a partition being filled is read; with track_counts off every one is).
CREATE FUNCTION rag._documents_missing_chunks(p_collections integer[] DEFAULT NULL) RETURNS SETOF bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    c record;
BEGIN
    FOR c IN
        SELECT k.id, to_regclass(format('rag.%I', rag._chunk_partition(k.id))) AS partition
          FROM rag.collections k
         WHERE (p_collections IS NULL OR k.id = ANY (p_collections))
           AND to_regclass(format('rag.%I', rag._chunk_partition(k.id) || '_pending')) IS NOT NULL
           AND to_regclass(format('rag.%I', rag._keyword_index_name(k.id))) IS NOT NULL
           AND (k.index_name IS NULL OR to_regclass(format('rag.%I', k.index_name)) IS NOT NULL)
         ORDER BY k.id
    LOOP
        CONTINUE WHEN c.partition IS NULL
                   OR pg_catalog.pg_stat_get_live_tuples(c.partition)
                      >= (SELECT coalesce(sum(d.chunks_total), 0) FROM rag.documents d
                           WHERE d.collection_id = c.id AND d.status <> 'failed');
        RETURN QUERY EXECUTE format(
            'SELECT d.id FROM rag.documents d
              WHERE d.collection_id = $1 AND d.chunks_total > 0 AND d.status <> %L
                AND NOT EXISTS (SELECT 1 FROM %s ch WHERE ch.document_id = d.id)', 'failed', c.partition)
            USING c.id;
    END LOOP;
END $$;

-- The worker's repair of those documents: queued to be chunked and embedded again from the text rag.documents
-- keeps, a watched row's too (its text is the row's as it was dumped; a change to the row since goes through
-- its watch as any change does). Its table is not read, so no table owner's rights or locks stand in the way.
-- The documents are locked in id order, skipping any a store holds (it is giving them chunks), and looked at
-- again once locked. Each collection is said in the server log. Returns how many documents it queued; a second
-- worker that looks at the same time finds none left.
CREATE FUNCTION rag._requeue_missing_chunks(p_collections integer[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_missing bigint[];
    v_locked bigint[];
    v_requeued record;
    v_count integer := 0;
BEGIN
    v_missing := ARRAY(SELECT m.id FROM rag._documents_missing_chunks(p_collections) m(id));
    IF cardinality(v_missing) = 0 THEN
        RETURN 0;
    END IF;
    v_locked := ARRAY(SELECT d.id FROM rag.documents d WHERE d.id = ANY (v_missing)
                       ORDER BY d.id FOR UPDATE SKIP LOCKED);
    -- A new statement, a new snapshot: whatever stored chunks before the locks were taken is seen now.
    v_missing := ARRAY(SELECT m.id FROM rag._documents_missing_chunks(
                                          ARRAY(SELECT DISTINCT d.collection_id FROM rag.documents d
                                                 WHERE d.id = ANY (v_locked))) m(id)
                        WHERE m.id = ANY (v_locked));
    FOR v_requeued IN
        WITH documents AS (
            UPDATE rag.documents d SET status = 'processing', failure_reason = NULL, chunks_total = 0,
                   chunks_embedded = 0, updated_at = now()
             WHERE d.id = ANY (v_missing)
            RETURNING d.id, d.collection_id),
        queued AS (
            INSERT INTO rag.queue (document_id, collection_id)
            SELECT id, collection_id FROM documents ORDER BY id
            ON CONFLICT (document_id) DO UPDATE SET not_before = now(), attempts = 0, first_failure_at = NULL,
                                                    unfinished_claims = 0
            RETURNING collection_id)
        SELECT c.name, count(*) AS documents
          FROM queued q JOIN rag.collections c ON c.id = q.collection_id
         GROUP BY c.name ORDER BY c.name
    LOOP
        RAISE LOG 'rag worker: collection "%": % of its documents had none of the chunks they were cut into (a restore of a dump without them?); queued to be chunked and embedded again',
                  v_requeued.name, v_requeued.documents;
        v_count := v_count + v_requeued.documents;
    END LOOP;
    IF v_count > 0 THEN
        PERFORM rag._wake_worker();
    END IF;
    RETURN v_count;
END $$;

-- Tries the collection's failing upkeep steps again now (rag.upkeep_failures, which rag.status shows): what an
-- admin runs once the cause is mended (disk freed, the event trigger that refused CREATE INDEX dropped), without
-- rag_reindex's chunking and embedding of every document again. Returns how many resting steps it let go; a
-- step a worker is trying at this moment is left to it, and waited for by nothing (rag._upkeep_forget).
CREATE FUNCTION @extschema@.rag_retry_upkeep(collection text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_collection integer := rag._collection_id(collection, 'admin');
    v_count integer;
BEGIN
    PERFORM rag._require_writable('rag_retry_upkeep');
    v_count := rag._upkeep_forget(v_collection, NULL);
    IF v_count > 0 THEN
        PERFORM rag._wake_worker();
    END IF;
    RETURN v_count;
END $$;

-- How a collection is searched: its search mode, pgvector's hnsw.ef_search for it (0: the server's setting
-- again), and the build parameters of its HNSW index, m and ef_construction (0: pgvector's defaults again); NULL
-- keeps a value as it is. New build parameters leave the collection's index in place: the worker builds its
-- successor with them beside it and then drops it (rag._rebuild_index), so searches keep an HNSW index
-- throughout, and no lock of the admin's transaction holds the collection's partition.
CREATE FUNCTION @extschema@.rag_set_search(collection text, search_mode text DEFAULT NULL, ef_search integer DEFAULT NULL,
                               m integer DEFAULT NULL, ef_construction integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    c rag.collections;
    v_m integer;
    v_ef_construction integer;
    v_lock_timeout text;
BEGIN
    PERFORM rag._require_writable('rag_set_search');
    -- NO KEY UPDATE: the key stays, so writers' foreign key checks (KEY SHARE: an ingest, a ledger row) go on
    -- while the change is uncommitted; stores (SHARE) wait for it.
    SELECT * INTO c FROM rag.collections WHERE id = rag._collection_id(collection, 'admin') FOR NO KEY UPDATE;
    IF search_mode IS NOT NULL AND search_mode NOT IN ('hybrid', 'vector', 'keyword') THEN
        RAISE EXCEPTION 'search_mode must be hybrid, vector or keyword, not %', quote_literal(search_mode)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'hybrid fuses the vector and full-text rankings (reciprocal rank fusion).';
    END IF;
    IF ef_search IS NOT NULL AND ef_search NOT BETWEEN 0 AND 1000 THEN
        RAISE EXCEPTION 'ef_search must be between 1 and 1000 (0 for the server''s setting), not %', ef_search
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'It is how many candidates the HNSW scan keeps: more is slower and finds more; pgvector''s default is 40.';
    END IF;
    v_m := CASE WHEN m IS NULL THEN c.hnsw_m ELSE nullif(m, 0) END;
    v_ef_construction := CASE WHEN ef_construction IS NULL THEN c.hnsw_ef_construction ELSE nullif(ef_construction, 0) END;
    IF v_m NOT BETWEEN 2 AND 100 OR v_ef_construction NOT BETWEEN 4 AND 1000
       OR coalesce(v_ef_construction, 64) < 2 * coalesce(v_m, 16) THEN
        RAISE EXCEPTION 'HNSW build parameters m % and ef_construction % are out of range',
                        coalesce(v_m::text, 'default (16)'), coalesce(v_ef_construction::text, 'default (64)')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'm is 2 to 100, ef_construction 4 to 1000 and at least twice m (pgvector''s rules); 0 puts pgvector''s default back.';
    END IF;
    UPDATE rag.collections u
       SET search_mode = coalesce(rag_set_search.search_mode, u.search_mode),
           ef_search = CASE WHEN rag_set_search.ef_search IS NULL THEN u.ef_search
                            ELSE nullif(rag_set_search.ef_search, 0) END,
           hnsw_m = v_m, hnsw_ef_construction = v_ef_construction
     WHERE u.id = c.id;
    IF (v_m IS DISTINCT FROM c.hnsw_m OR v_ef_construction IS DISTINCT FROM c.hnsw_ef_construction)
       AND c.index_name IS NOT NULL THEN
        -- New parameters are a new try: a rebuild that failed with the old ones no longer rests.
        PERFORM rag._upkeep_forget(c.id, 'index rebuild');
        IF rag._workers_available() THEN
            -- The index stays, and searches with it, until the worker has built its successor
            -- (rag._rebuild_index): dropping it here held the collection's partition until this transaction
            -- ended, and with it every search of the collection and every other session's statement whose plan
            -- covers all of rag.chunks.
            PERFORM rag._wake_worker();
        ELSIF to_regclass(format('rag.%I', c.index_name)) IS NOT NULL THEN
            -- Without the workers nobody rebuilds beside it: the index goes now (waiting at most a second for
            -- the searches that hold it), and rag_process_queue builds it again with the new parameters.
            v_lock_timeout := current_setting('lock_timeout');
            PERFORM set_config('lock_timeout', '1s', true);
            BEGIN
                EXECUTE format('DROP INDEX rag.%I', c.index_name);
            EXCEPTION WHEN lock_not_available THEN
                RAISE EXCEPTION 'the index of collection "%" is in use: its build parameters were not changed', c.name
                    USING ERRCODE = 'lock_not_available',
                          HINT = 'Long searches or writes of the collection hold it; try again when they are over.';
            END;
            PERFORM set_config('lock_timeout', v_lock_timeout, true);
            UPDATE rag.collections u SET index_name = NULL WHERE u.id = c.id;
        END IF;
    END IF;
END $$;

-- Chooses a collection's reranker (NULL or 'none': no reranking), how many candidates it reads, its refusal
-- threshold, the lead that lets a standout first chunk pass a little below it or within the collection's and
-- its model's distance ceilings (rag._close_enough; 0: never) and where it runs
-- ('local', or an OpenAI-compatible provider with /rerank); all but the reranker keep their current values
-- when NULL.
CREATE FUNCTION @extschema@.rag_set_reranker(collection text, reranker text, rerank_candidates integer DEFAULT NULL,
                                 min_relevance real DEFAULT NULL, reranker_provider text DEFAULT NULL,
                                 min_lead real DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    c rag.collections;
BEGIN
    PERFORM rag._require_writable('rag_set_reranker');
    -- NO KEY UPDATE: the key stays, so writers' foreign key checks (KEY SHARE: an ingest, a ledger row) go on
    -- while the change is uncommitted; stores (SHARE) wait for it.
    SELECT * INTO c FROM rag.collections WHERE id = rag._collection_id(collection, 'admin') FOR NO KEY UPDATE;
    rerank_candidates := coalesce(rerank_candidates, c.rerank_candidates);
    min_relevance := coalesce(min_relevance, c.min_relevance);
    min_lead := coalesce(min_lead, c.min_lead);
    reranker_provider := coalesce(reranker_provider, c.reranker_provider);
    reranker := nullif(reranker, 'none');
    PERFORM rag._require_short_model_texts(ARRAY[reranker], '{}');
    PERFORM rag._validate_reranker(reranker_provider, reranker, rerank_candidates, min_relevance, min_lead);
    IF reranker IS NOT NULL AND (reranker_provider IS DISTINCT FROM c.reranker_provider OR c.reranker IS NULL) THEN
        -- Every search's candidates would go there, rows of watched tables among them.
        PERFORM rag._require_collection_whole_for(c.id, reranker_provider,
                                                  format('rerank collection "%s" with provider "%s"', c.name, reranker_provider));
    END IF;
    UPDATE rag.collections u SET reranker = rag_set_reranker.reranker,
           rerank_candidates = rag_set_reranker.rerank_candidates, min_relevance = rag_set_reranker.min_relevance,
           min_lead = rag_set_reranker.min_lead, reranker_provider = rag_set_reranker.reranker_provider
     WHERE u.id = c.id;
END $$;

-- Moves a collection to another embedding model without a moment of downtime: the worker embeds every chunk
-- with the new model into the column the collection does not search, queries keep using the old model and its
-- vectors meanwhile, and one transaction switches when all are there (rag._advance_migrations). Vectors of two
-- models are never mixed in a search. A collection with nothing embedded yet just takes the new model. Returns
-- the documents queued. Prefixes become the new model's own (or the settings', when set), and so does the
-- distance ceiling when it was the old model's default.
CREATE FUNCTION @extschema@.rag_set_embedding_model(collection text, embedding_model text, dimensions integer DEFAULT NULL,
                                        embedding_provider text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    c rag.collections;
    v_provider text;
    v_document_prefix text;
    v_query_prefix text;
    v_max_distance double precision;
    v_count bigint;
BEGIN
    PERFORM rag._require_writable('rag_set_embedding_model');
    PERFORM rag._require_read_committed('rag_set_embedding_model');
    -- NO KEY UPDATE: the key stays, so writers' foreign key checks (KEY SHARE: an ingest, a ledger row) go on
    -- while the change is uncommitted; stores (SHARE) wait for it.
    SELECT * INTO c FROM rag.collections WHERE id = rag._collection_id(collection, 'admin') FOR NO KEY UPDATE;
    IF embedding_model IS NULL OR embedding_model = '' THEN
        RAISE EXCEPTION 'embedding_model is required' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'rag_models() lists what the provider serves.';
    END IF;
    IF embedding_provider IS NOT NULL AND NOT EXISTS (SELECT 1 FROM rag.providers p WHERE p.name = embedding_provider) THEN
        RAISE EXCEPTION 'provider "%" does not exist', embedding_provider USING ERRCODE = 'undefined_object',
            HINT = 'SELECT name, kind FROM rag.providers lists them.';
    END IF;
    IF dimensions IS NOT NULL AND (dimensions < 1 OR dimensions > 16000) THEN
        RAISE EXCEPTION 'dimensions must be between 1 and 16000, not %', dimensions
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Leave it NULL to learn it from the first embedding.';
    END IF;
    v_provider := coalesce(rag_set_embedding_model.embedding_provider, c.embedding_provider);
    IF v_provider IS DISTINCT FROM c.embedding_provider THEN
        -- The worker sends every chunk there, rows of watched tables among them.
        PERFORM rag._require_collection_whole_for(c.id, v_provider,
                                                  format('embed collection "%s" with provider "%s"', c.name, v_provider));
    END IF;
    -- The new model's own prefixes (or the settings', when set), as rag_create_collection chooses them.
    SELECT coalesce(nullif(rag._setting('rag.document_prefix'), ''), m.document_prefix),
           coalesce(nullif(rag._setting('rag.query_prefix'), ''), m.query_prefix)
      INTO v_document_prefix, v_query_prefix
      FROM rag._model_prefixes(rag_set_embedding_model.embedding_model) m;
    PERFORM rag._require_short_model_texts(ARRAY[rag_set_embedding_model.embedding_model],
                                           ARRAY[v_document_prefix, v_query_prefix]);
    -- A local model is looked for now, as rag_create_collection does, rather than failing the change later.
    IF (SELECT p.kind FROM rag.providers p WHERE p.name = v_provider) = 'local' THEN
        PERFORM rag._require_local_prefixes_fit(rag_set_embedding_model.embedding_model, v_document_prefix,
                                                v_query_prefix);
    END IF;
    -- A ceiling that is the old model's default becomes the new model's (bi-encoders' distances differ widely:
    -- rag_known_models()); one chosen by argument or setting is kept.
    IF c.max_distance = rag._default_max_distance(c.embedding_model) THEN
        v_max_distance := rag._default_max_distance(rag_set_embedding_model.embedding_model);
    END IF;
    -- A change already going is replaced; what it embedded is cleared below with the rest of the other space.
    -- Its failures go with it: the new change's switch is tried as soon as it is due.
    DELETE FROM rag.migrations WHERE collection_id = c.id;
    PERFORM rag._upkeep_forget(c.id, 'model change');
    IF c.dimensions IS NULL THEN
        -- Nothing was ever embedded: nothing to keep serving, so the collection simply takes the new model.
        UPDATE rag.collections u SET embedding_model = rag_set_embedding_model.embedding_model,
               embedding_provider = v_provider, dimensions = rag_set_embedding_model.dimensions,
               document_prefix = v_document_prefix, query_prefix = v_query_prefix, index_name = NULL,
               max_distance = coalesce(v_max_distance, c.max_distance)
         WHERE u.id = c.id;
        IF rag_set_embedding_model.dimensions IS NOT NULL THEN
            PERFORM rag._ensure_index(c.id);
        END IF;
        RETURN rag_definer.rag_reindex(collection);
    END IF;
    -- The documents before their chunks, in id order: the order rag_delete_document and the worker's deletes take
    -- them (the document, then its chunks). Clearing the chunks first deadlocked with a concurrent delete, and a
    -- document deleted after this statement's snapshot failed the queue's foreign key below. KEY SHARE holds off
    -- deletes only; the worker's updates of the documents go on.
    PERFORM 1 FROM rag.documents d WHERE d.collection_id = c.id AND d.status <> 'failed' ORDER BY d.id FOR KEY SHARE;
    -- The collection keeps being searched with its model while every chunk is embedded into the other column;
    -- rag._advance_migrations switches when they are all there (rag.status shows the progress).
    PERFORM rag._clear_space(c.id, rag._target_column(c.vector_column, true), NULL);
    INSERT INTO rag.migrations (collection_id, embedding_provider, embedding_model, dimensions, document_prefix,
                                query_prefix, max_distance)
    VALUES (c.id, v_provider, rag_set_embedding_model.embedding_model, rag_set_embedding_model.dimensions,
            v_document_prefix, v_query_prefix, v_max_distance);
    -- Locked again: a document committed since the lock above is held here too, or skipped if deleted meanwhile.
    INSERT INTO rag.queue (document_id, collection_id)
    SELECT d.id, d.collection_id FROM rag.documents d
     WHERE d.collection_id = c.id AND d.status <> 'failed'
     ORDER BY d.id FOR KEY SHARE
    ON CONFLICT (document_id) DO UPDATE SET not_before = now(), attempts = 0, first_failure_at = NULL,
                                            last_error = NULL;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    PERFORM rag._wake_worker();
    RETURN v_count;
END $$;

-- Stops a model change: the collection stays on its model, and the vectors made for the new one are cleared by
-- the worker. Returns whether a change was going.
CREATE FUNCTION @extschema@.rag_cancel_embedding_model(collection text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_collection integer := rag._collection_id(collection, 'admin');
BEGIN
    PERFORM rag._require_writable('rag_cancel_embedding_model');
    UPDATE rag.migrations SET state = 'clearing', failure_reason = NULL
     WHERE collection_id = v_collection AND state IN ('embedding', 'failed');
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM rag._wake_worker();
    RETURN true;
END $$;

-- Empties one of a collection's vector columns (at most p_limit rows at a time, all when NULL) and drops its
-- index if one is left (under either of its names); returns how many rows it emptied. The
-- other column is never touched.
CREATE FUNCTION rag._clear_space(p_collection_id integer, p_column text, p_limit integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_count bigint;
    v_index text;
BEGIN
    FOREACH v_index IN ARRAY rag._hnsw_index_names(p_collection_id, p_column) LOOP
        IF to_regclass(format('rag.%I', v_index)) IS NOT NULL THEN
            EXECUTE format('DROP INDEX rag.%I', v_index);
        END IF;
    END LOOP;
    EXECUTE format('UPDATE rag.chunks SET %1$I = NULL
                     WHERE collection_id = $1
                       AND id IN (SELECT id FROM rag.chunks WHERE collection_id = $1 AND %1$I IS NOT NULL LIMIT $2)',
                   p_column)
      USING p_collection_id, coalesce(p_limit, 2147483647);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;

-- Model changes whose worker step is due: one whose every ready document has its vectors in the new space, with
-- nothing of the collection queued, or one clearing the column left behind. The worker's read-only look (idle, and every few seconds while busy).
CREATE FUNCTION rag._migrations_due() RETURNS integer[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_due integer[] := '{}';
    r record;
BEGIN
    -- One collection at a time, so that each look into rag.chunks is planned over that collection's partition.
    FOR r IN SELECT m.collection_id, m.state, c.vector_column
               FROM rag.migrations m JOIN rag.collections c ON c.id = m.collection_id
              ORDER BY m.collection_id LOOP
        IF r.state = 'clearing' OR (r.state = 'embedding' AND rag._migration_embedded(r.collection_id, r.vector_column)) THEN
            v_due := v_due || r.collection_id;
        END IF;
    END LOOP;
    RETURN v_due;
END $$;

-- Whether every chunk of the collection's ready documents has its vector in the space a model change fills,
-- and nothing is queued: the change may switch.
CREATE FUNCTION rag._migration_embedded(p_collection_id integer, p_vector_column text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM rag.queue q WHERE q.collection_id = p_collection_id)
       AND NOT EXISTS (SELECT 1 FROM rag.chunks ch JOIN rag.documents d ON d.id = ch.document_id
                        WHERE ch.collection_id = p_collection_id AND d.status = 'ready'
                          AND CASE p_vector_column WHEN 'embedding' THEN ch.embedding_alt
                                                   ELSE ch.embedding END IS NULL)
$$;

-- The worker's step of model changes, each in this transaction: a complete one switches (the new space's HNSW index
-- is built first, which holds writes to the collection's partition, not reads, while it runs; then the collection's
-- model, prefixes, dimension, index and searched column change together, so a search sees the old space or the new,
-- never both); a clearing one empties up to 10,000 rows of the column left behind. Returns the steps taken.
CREATE FUNCTION rag._advance_migrations() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_id integer;
    c rag.collections;
    m rag.migrations;
    v_new_column text;
    v_index text;
    v_steps integer := 0;
BEGIN
    -- Building and dropping an index wait for locks on the collection's partition; behind long queries the step gives
    -- up at once and the worker tries again at its next upkeep (a waiting AccessExclusive request would queue every other reader).
    PERFORM set_config('lock_timeout', '100ms', true);
    -- Each collection's step on its own (a subtransaction), its row taken without waiting: one collection whose
    -- partition a reader's open transaction holds (its old index cannot be dropped), or whose row another
    -- change holds, gave up the whole call at its lock_timeout, every time, and no collection after it in id
    -- order ever switched (red team 19). It is tried again at the next upkeep; the others go on.
    PERFORM rag._settle_upkeep('model change');
    FOREACH v_id IN ARRAY ARRAY(SELECT d.id FROM unnest(rag._migrations_due()) d(id)
                                 WHERE NOT d.id = ANY (rag._upkeep_resting('model change'))) LOOP
        CONTINUE WHEN rag._upkeep_held(v_id, 'model change');
        BEGIN
            -- NO KEY UPDATE: what the switch changes is no key, and a conversation or an ingest left open holds
            -- the row's key (their foreign keys), which FOR UPDATE waited for.
            SELECT * INTO c FROM rag.collections WHERE id = v_id FOR NO KEY UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            SELECT * INTO m FROM rag.migrations WHERE collection_id = v_id FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            -- Looked at again under the locks: the change rag._migrations_due found complete may have been
            -- replaced since (rag_set_embedding_model) by one that has embedded nothing yet, which must not switch.
            IF m.state = 'embedding' AND NOT rag._migration_embedded(c.id, c.vector_column) THEN
                CONTINUE;
            END IF;
            IF m.state = 'clearing' THEN
                IF rag._clear_space(c.id, rag._target_column(c.vector_column, true), 10000) = 0 THEN
                    DELETE FROM rag.migrations WHERE collection_id = c.id;
                END IF;
            ELSIF m.state = 'embedding' THEN
                v_new_column := rag._target_column(c.vector_column, true);
                v_index := NULL;
                IF m.dimensions BETWEEN 1 AND 2000 THEN
                    v_index := (rag._hnsw_index_names(c.id, v_new_column))[1];
                    EXECUTE rag._hnsw_index_sql(c, v_index, v_new_column, m.dimensions);
                END IF;
                UPDATE rag.collections u SET vector_column = v_new_column, embedding_model = m.embedding_model,
                       embedding_provider = m.embedding_provider, dimensions = m.dimensions,
                       document_prefix = m.document_prefix, query_prefix = m.query_prefix, index_name = v_index,
                       max_distance = coalesce(m.max_distance, c.max_distance)
                 WHERE u.id = c.id;
                -- The old space is emptied (and its index dropped) in later steps, outside this transaction.
                UPDATE rag.migrations SET state = 'clearing' WHERE collection_id = c.id;
            END IF;
            PERFORM rag._upkeep_forget(v_id, 'model change');
            v_steps := v_steps + 1;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        WHEN OTHERS THEN
            -- A step that fails (its new index's build out of disk) must not keep the collections after it in id
            -- order from switching; this one rests, as a failing index build does.
            RAISE WARNING 'advancing the model change of collection % failed: %', v_id, SQLERRM
                USING HINT = 'The workers try again after a pause that doubles with each failure, up to an hour (rag.status shows it); the collection keeps its current model meanwhile.';
            PERFORM rag._upkeep_failed(v_id, 'model change', SQLERRM);
        END;
    END LOOP;
    RETURN v_steps;
END $$;

-- The extension's schema again, where pgrx creates the Rust functions declared after this file.
SET LOCAL search_path = @extschema@, pg_temp;
