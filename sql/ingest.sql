-- Run with pg_catalog first, then rag, and nothing else: schema.sql says why.
SET LOCAL search_path = pg_catalog, rag, pg_temp;

-- Providers, ingestion and the worker's side of the store. Everything here runs in SQL so that a document,
-- its text and its queue row are written in the caller's transaction: ingest returns at once, and a rollback
-- leaves nothing behind.

CREATE FUNCTION @extschema@.rag_create_provider(name text, kind text, base_url text DEFAULT NULL,
                                    api_key_setting text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM rag._require_writable('rag_create_provider');
    IF kind IS NULL OR kind NOT IN ('ollama', 'openai') THEN
        RAISE EXCEPTION 'provider kind must be ''ollama'' or ''openai'', not %', coalesce(quote_literal(kind), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Any OpenAI-compatible server (vLLM, llama.cpp, LM Studio, LiteLLM) is kind openai.';
    END IF;
    -- It goes into every request to the provider, and is shown to every reader of rag.providers.
    IF octet_length(base_url) > 2048 THEN
        RAISE EXCEPTION 'base_url may be at most 2048 bytes, not %', octet_length(base_url)
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Give the server''s address and the API''s path, such as http://host:8080/v1.';
    END IF;
    IF base_url IS NOT NULL AND base_url !~ '^https?://[^/\s]+' THEN
        RAISE EXCEPTION 'base_url must be an http or https URL, not %', quote_literal(base_url)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'For example http://127.0.0.1:11434 or https://api.openai.com/v1.';
    END IF;
    -- A query or fragment would swallow the route rag appends (a provider could then fetch any path of any
    -- server the database reaches), and user-info would be sent as credentials and shown in rag.providers.
    IF base_url ~ '[?#]' OR base_url ~ '^https?://[^/]*@' THEN
        RAISE EXCEPTION 'base_url must not carry a query (?), a fragment (#) or user-info (user@host)'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'rag appends the API route (/embeddings, /api/embed, …) to it: name the server and path prefix only, and keep a key in api_key_setting.';
    END IF;
    IF kind = 'openai' AND base_url IS NULL THEN
        RAISE EXCEPTION 'an openai provider needs a base_url' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'The URL includes the version path, for example https://api.openai.com/v1.';
    END IF;
    IF base_url IS NOT NULL THEN
        PERFORM rag._check_provider_url(base_url);
    END IF;
    IF api_key_setting IS NOT NULL AND api_key_setting <> 'rag.openai_api_key'
       AND api_key_setting !~ '^file:[A-Za-z0-9_.-]{1,63}$' THEN
        RAISE EXCEPTION 'api_key_setting must be ''rag.openai_api_key'' or ''file:NAME'', not %', quote_literal(api_key_setting)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Keys never go in a table: put the key in rag.openai_api_key (postgresql.conf or ALTER SYSTEM) or in the file named by rag.secrets_file.';
    END IF;
    IF EXISTS (SELECT 1 FROM rag.providers p WHERE p.name = rag_create_provider.name) THEN
        RAISE EXCEPTION 'provider "%" already exists', name USING ERRCODE = 'duplicate_object',
            HINT = 'Drop it with rag_drop_provider first.';
    END IF;
    IF api_key_setting IS NOT NULL AND NOT rag._caller_is_superuser()
       AND NOT EXISTS (SELECT 1 FROM rag.key_grants g
                        WHERE g.api_key_setting = rag_create_provider.api_key_setting
                          AND g.base_url = rtrim(rag_create_provider.base_url, '/')) THEN
        RAISE EXCEPTION 'the key % may not be sent to %', api_key_setting, coalesce(base_url, 'rag.ollama_url')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('A superuser decides where keys go: SELECT rag_allow_key(%L, %L);',
                                api_key_setting, rtrim(coalesce(base_url, ''), '/'));
    END IF;
    INSERT INTO rag.providers (name, kind, base_url, api_key_setting, created_by, created_by_id)
    SELECT rag_create_provider.name, rag_create_provider.kind, rtrim(rag_create_provider.base_url, '/'),
           rag_create_provider.api_key_setting, r.rolname, rag._lock_role(r.oid)::regrole
      FROM pg_catalog.pg_roles r WHERE r.rolname = rag._calling_role();
END $$;

CREATE FUNCTION rag._caller_is_superuser() RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = (SELECT rag._calling_role())), false)
$$;

-- Where a key may be sent is a superuser's decision.
CREATE FUNCTION rag._require_superuser_for_keys() RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT rag._caller_is_superuser() THEN
        RAISE EXCEPTION 'only a superuser may decide where a key is sent' USING ERRCODE = 'insufficient_privilege',
            HINT = 'Ask a superuser to run rag_allow_key or rag_disallow_key.';
    END IF;
END $$;

-- A superuser allows a key setting to be sent to one base URL; rag_admins may then create providers using it.
CREATE FUNCTION @extschema@.rag_allow_key(api_key_setting text, base_url text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM rag._require_writable('rag_allow_key');
    PERFORM rag._require_superuser_for_keys();
    IF api_key_setting IS NULL OR (api_key_setting <> 'rag.openai_api_key' AND api_key_setting !~ '^file:[A-Za-z0-9_.-]{1,63}$') THEN
        RAISE EXCEPTION 'api_key_setting must be ''rag.openai_api_key'' or ''file:NAME'', not %', coalesce(quote_literal(api_key_setting), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Name where the key is kept, never the key itself.';
    END IF;
    IF base_url IS NULL OR base_url !~ '^https?://[^/\s]+' THEN
        RAISE EXCEPTION 'base_url must be an http or https URL, not %', coalesce(quote_literal(base_url), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'The exact base URL the provider will use, e.g. https://api.openai.com/v1.';
    END IF;
    IF base_url ~ '[?#]' OR base_url ~ '^https?://[^/]*@' THEN
        RAISE EXCEPTION 'base_url must not carry a query (?), a fragment (#) or user-info (user@host)'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'No provider may use such a URL; keys are named by api_key_setting, never put in the URL.';
    END IF;
    INSERT INTO rag.key_grants (api_key_setting, base_url, granted_by)
    VALUES (api_key_setting, rtrim(base_url, '/'), rag._calling_role())
    ON CONFLICT ON CONSTRAINT key_grants_pkey DO NOTHING;
END $$;

-- Withdraws the permission; providers that non-superusers made with it lose the key at once.
CREATE FUNCTION @extschema@.rag_disallow_key(api_key_setting text, base_url text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM rag._require_writable('rag_disallow_key');
    PERFORM rag._require_superuser_for_keys();
    DELETE FROM rag.key_grants g WHERE g.api_key_setting = rag_disallow_key.api_key_setting
                                   AND g.base_url = rtrim(rag_disallow_key.base_url, '/');
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE rag.providers p SET api_key_setting = NULL
     WHERE p.api_key_setting = rag_disallow_key.api_key_setting AND p.base_url = rtrim(rag_disallow_key.base_url, '/')
       AND NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = p.created_by_id), false);
    RETURN true;
END $$;

-- A provider is its creator's (or a superuser's) to drop: a name is what collections made later trust, so
-- another rag_admin must not be able to free it and create it again pointing at a server of their own. The
-- providers the extension makes ('ollama', 'local') have no creator and are a superuser's.
-- Is the provider the caller's to drop or to spend directly: a superuser, or a role with the privileges of the
-- role that created it (the extension's own providers, created by nobody, are a superuser's).
CREATE FUNCTION rag._caller_controls_provider(p rag.providers) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT rag._caller_is_superuser()
        OR (EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = p.created_by_id)
            AND pg_catalog.pg_has_role(rag._calling_role(), p.created_by_id::oid, 'USAGE'))
$$;

CREATE FUNCTION @extschema@.rag_drop_provider(name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_provider rag.providers;
BEGIN
    PERFORM rag._require_writable('rag_drop_provider');
    SELECT * INTO v_provider FROM rag.providers p WHERE p.name = rag_drop_provider.name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF NOT rag._caller_controls_provider(v_provider) THEN
        RAISE EXCEPTION 'permission denied for provider "%"', name USING ERRCODE = 'insufficient_privilege',
            DETAIL = format('It was created by %s.', coalesce(v_provider.created_by::text, 'the extension')),
            HINT = 'Only the role that created a provider, or a superuser, may drop it.';
    END IF;
    IF EXISTS (SELECT 1 FROM rag.collections c
                WHERE c.embedding_provider = rag_drop_provider.name OR c.chat_provider = rag_drop_provider.name
                   OR c.reranker_provider = rag_drop_provider.name)
       OR EXISTS (SELECT 1 FROM rag.migrations m WHERE m.embedding_provider = rag_drop_provider.name) THEN
        RAISE EXCEPTION 'provider "%" is used by a collection', name USING ERRCODE = 'dependent_objects_still_exist',
            HINT = 'Drop or change the collections that use it first.';
    END IF;
    DELETE FROM rag.providers p WHERE p.name = rag_drop_provider.name;
    RETURN FOUND;
END $$;

-- Where keys go is written by rag's functions (as rag's owner) or a superuser only: rag_create_provider's check
-- is the only place that decides where a key may go, and a role with pg_write_all_data, which passes every
-- privilege, pointed every provider at a server of its own, and the worker sent the key there (helper-98).
-- rag._written_by_rag_only guards every table of rag's (security.sql).

-- Raises unless the caller may call the provider directly (rag_embed, rag_models): one that sends an API key
-- bills every call to that key, and its model list shows the account behind it, so only its creator (or a role
-- with its privileges) or a superuser may. Collections use it through rag_query and rag_ask, which record every call.
CREATE FUNCTION rag._require_direct_use(p_provider text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    v_provider rag.providers;
BEGIN
    SELECT * INTO v_provider FROM rag.providers p WHERE p.name = p_provider;
    IF FOUND AND v_provider.api_key_setting IS NOT NULL AND NOT rag._caller_controls_provider(v_provider) THEN
        RAISE EXCEPTION 'permission denied for provider "%"', p_provider USING ERRCODE = 'insufficient_privilege',
            DETAIL = format('It sends the key %s with every call; it was created by %s.', v_provider.api_key_setting,
                            coalesce(v_provider.created_by::text, 'the extension')),
            HINT = 'Search a collection that uses it with rag_query, or ask its creator or a superuser.';
    END IF;
END $$;

-- An embedding of any text, e.g. to compare texts or to search your own tables with pgvector directly. The
-- model defaults to the local provider's default model. A provider that sends an API key bills every call to
-- that key, and here the caller chooses the text and the model: only its creator (or a role with its
-- privileges) or a superuser may call it directly. Collections use it through rag_query and rag_ask, which record every call.
-- Made with pgvector's schema in the search_path, for its result type (schema.sql, rag.chunks, says why that
-- is safe for a statement that resolves nothing else).
SELECT pg_catalog.set_config('search_path', pg_catalog.format('pg_catalog, rag, %I, pg_temp', n.nspname), true)
       AS path_for_rag_embed
  FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
 WHERE e.extname = 'vector';
CREATE FUNCTION @extschema@.rag_embed(input text, model text DEFAULT NULL, provider text DEFAULT 'local')
RETURNS vector
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
DECLARE
    v_provider rag.providers;
BEGIN
    -- The bounds every collection's texts have: the model's name, and a text no longer than a document may be
    -- (a 5 MB model name and a 40 MB input went to the provider as they were: red team 20).
    PERFORM rag._require_short_model_texts(ARRAY[model], '{}');
    IF octet_length(input) > pg_catalog.pg_size_bytes(rag._setting('rag.max_document_size')) THEN
        RAISE EXCEPTION 'the input is % bytes, above rag.max_document_size (%)', octet_length(input),
                        pg_catalog.pg_size_pretty(pg_catalog.pg_size_bytes(rag._setting('rag.max_document_size')))
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Embed passages of the size a model reads.';
    END IF;
    PERFORM rag._require_direct_use(provider);
    -- Text (pgvector's input form) to the function's vector: PL/pgSQL's RETURN converts through the types'
    -- text forms where no cast applies, so pgvector's type need not be named (it is off rag's search_path).
    RETURN rag._embed_text(provider, coalesce(model, rag._limit('local_model_default')), input);
END $$;
SELECT pg_catalog.set_config('search_path', 'pg_catalog, rag, pg_temp', true) AS path_after_rag_embed;

-- Raises unless a document's metadata is within its bound as JSON text. rag_ingest_file asks first, before it
-- reads the file or adds the file's format to the metadata (jsonb's || builds a tree of the whole value: 44 MB
-- of metadata took the backend to 1.4 GB before this check refused it; red team 22).
CREATE FUNCTION rag._require_metadata_fits(p_metadata jsonb) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_bytes integer := octet_length(p_metadata::text);
BEGIN
    IF v_bytes > rag._limit('document_metadata_max_bytes')::integer THEN
        RAISE EXCEPTION 'a document''s metadata may be at most % bytes as JSON text, not %',
                        rag._limit('document_metadata_max_bytes'), v_bytes
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Keep metadata to what filters need; put long text in the body.';
    END IF;
END $$;

CREATE FUNCTION @extschema@.rag_ingest(
    collection text,
    title      text,
    body       text,
    metadata   jsonb DEFAULT '{}',
    pages      text[] DEFAULT NULL,
    source     text DEFAULT NULL,
    format     text DEFAULT 'text'
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_collection integer := rag._collection_id(collection, 'write');
    v_offsets integer[];
    v_position integer := 0;
    v_page text;
    v_limit bigint := pg_size_bytes(rag._setting('rag.max_document_size'));
    v_sha bytea;
    v_id bigint;
    v_status text;
BEGIN
    PERFORM rag._require_writable('rag_ingest');
    -- A session that began on small tables would otherwise keep checking each queued document's key with
    -- the sequential scan it planned then (src/plans.rs).
    PERFORM rag._replan_if_tables_grew();
    IF pages IS NOT NULL THEN
        IF body IS NOT NULL AND body <> '' THEN
            RAISE EXCEPTION 'give the text either as body or as pages, not both'
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Pass NULL as body when you pass pages: the body is built from the pages.';
        END IF;
        IF cardinality(pages) = 0 THEN
            RAISE EXCEPTION 'pages is an empty array' USING ERRCODE = 'invalid_parameter_value',
                HINT = 'Pass at least one page, or pass the text as body.';
        END IF;
        IF cardinality(pages) > rag._limit('document_pages_max')::integer THEN
            RAISE EXCEPTION 'a document may have at most % pages, not %', rag._limit('document_pages_max'),
                            cardinality(pages)
                USING ERRCODE = 'program_limit_exceeded',
                      HINT = 'Split the document, or join pages into larger parts.';
        END IF;
        v_offsets := ARRAY[]::integer[];
        FOREACH v_page IN ARRAY pages LOOP
            v_offsets := v_offsets || v_position;
            v_position := v_position + char_length(coalesce(v_page, '')) + 2;
        END LOOP;
        body := array_to_string(pages, E'\n\n', '');
    END IF;
    IF format IS NULL OR format NOT IN ('text', 'html', 'markdown') THEN
        RAISE EXCEPTION 'format must be text, html or markdown, not %', coalesce(quote_literal(format), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'html and markdown become clean text before chunking.';
    END IF;
    -- Title, source and metadata come back with every search result and answer (and the titles go into the
    -- ledger with every answer): bounded, so that one writer cannot make every reader's call heavy.
    IF octet_length(title) > rag._limit('document_title_max_bytes')::integer
       OR octet_length(source) > rag._limit('document_source_max_bytes')::integer THEN
        RAISE EXCEPTION 'a document''s title and source may be at most % bytes each (title %, source %)',
                        rag._limit('document_title_max_bytes'), coalesce(octet_length(title), 0),
                        coalesce(octet_length(source), 0)
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Put long text in the body.';
    END IF;
    PERFORM rag._require_metadata_fits(metadata);
    -- The conversion bounds its own input (rag.max_file_size) and runs a large one in the bounded child
    -- (src/api/extract.rs convert_markup); its text is measured below.
    -- The body is used in place, never copied to a variable, and plain text is not converted: a 64 MB document
    -- is held a few times over here, and a copy fewer is 64 MB less for the backend.
    IF format <> 'text' THEN
        body := rag._to_text(body, format);
    END IF;
    IF body IS NULL OR NOT rag._has_text(body) THEN
        RAISE EXCEPTION 'document "%" has no text', coalesce(title, '')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'rag_ingest needs non-empty text; for files use rag_ingest_file.';
    END IF;
    IF octet_length(body) > v_limit THEN
        RAISE EXCEPTION 'document "%" is % bytes, above rag.max_document_size (%)',
                        coalesce(title, ''), octet_length(body), pg_size_pretty(v_limit)
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Split the document, or raise rag.max_document_size (superuser).';
    END IF;
    IF metadata IS NULL OR jsonb_typeof(metadata) <> 'object' THEN
        RAISE EXCEPTION 'metadata must be a JSON object, not %', coalesce(jsonb_typeof(metadata), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass ''{}'' for no metadata.';
    END IF;

    v_sha := sha256(convert_to(body, 'UTF8'));
    INSERT INTO rag.documents (collection_id, title, source, metadata, body, page_offsets, content_sha256)
    VALUES (v_collection, coalesce(title, ''), source, metadata, body, v_offsets, v_sha)
    ON CONFLICT (collection_id, content_sha256) WHERE source_key IS NULL DO NOTHING
    RETURNING id INTO v_id;

    IF v_id IS NULL THEN
        -- Identical text is already here: return it and spend nothing. A failed copy gets another chance.
        SELECT d.id, d.status INTO v_id, v_status
          FROM rag.documents d WHERE d.collection_id = v_collection AND d.content_sha256 = v_sha AND d.source_key IS NULL;
        IF v_status = 'failed' THEN
            UPDATE rag.documents SET status = 'processing', failure_reason = NULL, updated_at = now() WHERE id = v_id;
            INSERT INTO rag.queue (document_id, collection_id) VALUES (v_id, v_collection) ON CONFLICT (document_id) DO NOTHING;
            PERFORM rag._wake_worker();
        END IF;
        RETURN v_id;
    END IF;

    INSERT INTO rag.queue (document_id, collection_id) VALUES (v_id, v_collection);
    PERFORM rag._wake_worker();
    RETURN v_id;
END $$;

-- The printed page numbers of a file's pages (rag_ingest_file), when they are not 1, 2, 3.
CREATE FUNCTION rag._set_page_labels(p_document_id bigint, p_labels text[]) RETURNS void
LANGUAGE sql AS $$
    UPDATE rag.documents SET page_labels = p_labels WHERE id = p_document_id AND page_labels IS DISTINCT FROM p_labels
$$;

CREATE FUNCTION @extschema@.rag_delete_document(document_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_collection integer;
    v_watch integer;
BEGIN
    PERFORM rag._require_writable('rag_delete_document');
    SELECT d.collection_id INTO v_collection FROM rag.documents d WHERE d.id = rag_delete_document.document_id;
    -- A document of a collection the caller may not even read is answered as one that does not exist: the
    -- refusal named its collection and owner, so trying ids listed every collection (red team 16).
    IF NOT FOUND OR NOT v_collection = ANY (rag._collections_with(rag._calling_role(), 'read')) THEN
        RETURN false;
    END IF;
    PERFORM rag._require_privilege(v_collection, 'write');
    -- A watched row's document follows its row: deleting it here would drop the row from every reader's
    -- searches until the row changes, and a writer may not even see the row (the table's rules are not theirs).
    SELECT d.watch_id INTO v_watch FROM rag.documents d WHERE d.id = rag_delete_document.document_id;
    IF v_watch IS NOT NULL THEN
        -- Said only to a role that may read the whole table: to others the refusal told, id by id, which
        -- documents of rows hidden from them exist now (red team 24), so they are answered as for a missing one.
        IF NOT v_watch = ANY (rag._watches_readable_whole(rag._calling_role())) THEN
            RETURN false;
        END IF;
        RAISE EXCEPTION 'document % is made from a row of a watched table', rag_delete_document.document_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'It follows its row: delete or change the row, or rag_unwatch the table.';
    END IF;
    DELETE FROM rag.documents d WHERE d.id = rag_delete_document.document_id;
    RETURN FOUND;
END $$;

-- A document's chunks go with it, whatever deletes it (rag_delete_document, a watched row deleted, a reindex of
-- a watch, a dropped collection's cascade), as a foreign key's cascade would: rag.chunks has none
-- (rag._ensure_partition says why). One statement per collection of the deleted documents, with the
-- collection's id as a value, planned for that value (plan_cache_mode: rag._set_aside_chunks says why) over that
-- collection's partition alone. Every writer of
-- a document's chunks holds the document's row locked (FOR UPDATE) while it writes them, so none adds chunks to
-- a document being deleted. As the table's owner, as a foreign key's cascade runs: whoever may delete a
-- document deletes its chunks, whatever rag.chunks' policies would show them.
CREATE FUNCTION rag._documents_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    r record;
BEGIN
    -- A dropped collection's chunks go with its partition, whole (rag_drop_collection).
    FOR r IN SELECT g.collection_id, array_agg(g.id) AS ids FROM gone g
              WHERE EXISTS (SELECT 1 FROM rag.collections c WHERE c.id = g.collection_id)
              GROUP BY g.collection_id LOOP
        DELETE FROM rag.chunks ch WHERE ch.collection_id = r.collection_id AND ch.document_id = ANY (r.ids);
    END LOOP;
    RETURN NULL;
END $$;
CREATE TRIGGER documents_deleted AFTER DELETE ON rag.documents REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION rag._documents_deleted();

-- Whether rows of the collection's watched tables wait for the worker: written (a trigger's batch not yet
-- spread into the queue) or queued. A row whose last try failed and that waits out its back-off (up to an
-- hour; rag_watch_status shows it) does not count: it is failed until it is written to again, as a failed
-- document is. SECURITY DEFINER because the queues are not readable by readers; it says no more than
-- rag.watch_status's pending count, which a reader of the collection sees anyway.
CREATE FUNCTION rag._rows_waiting(p_collection integer) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    PERFORM rag._require_privilege(p_collection, 'read');
    RETURN EXISTS (SELECT 1 FROM rag.row_batches b JOIN rag.watches w ON w.id = b.watch_id
                    WHERE w.collection_id = p_collection)
        OR EXISTS (SELECT 1 FROM rag.row_queue q JOIN rag.watches w ON w.id = q.watch_id
                    -- Not waiting: a row that failed and waits out its back-off (attempts counts claims,
                    -- rag._claim_row, so a row being synced now has one too).
                    WHERE w.collection_id = p_collection AND (q.attempts = 0 OR q.claimed_by IS NOT NULL));
END $$;

-- Whether anything of the collection is still being processed: a document the worker has not finished, a model
-- change still embedding (rag_wait after rag_set_embedding_model returns once the new model serves the
-- collection), or a row of a table it watches waiting to be indexed. Sees what the calling statement's snapshot
-- sees, so rag_wait and rag_await ask it once per check.
CREATE FUNCTION rag._still_processing(p_collection integer) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM rag.documents d WHERE d.collection_id = p_collection AND d.status = 'processing')
        OR EXISTS (SELECT 1 FROM rag.migrations m WHERE m.collection_id = p_collection AND m.state = 'embedding')
        OR rag._rows_waiting(p_collection);
END $$;

-- Polls until every document of the collection has left 'processing' and no row of a table it watches waits
-- to be indexed, or the timeout passes. For scripts and tests that must wait for the worker; each check sees
-- the latest committed state (and the caller's own writes, which the worker cannot see before the commit).
-- Being one statement, it keeps that statement's snapshot for as long as it waits, which holds back the
-- database's xmin horizon (no dead row anywhere can be removed meanwhile); rag_await below does not.
CREATE FUNCTION @extschema@.rag_wait(collection text, timeout interval DEFAULT '60 seconds') RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_collection integer := rag._collection_id(collection);
    v_deadline timestamptz := clock_timestamp() + timeout;
BEGIN
    IF timeout IS NULL THEN
        -- A NULL deadline is never reached: it waited until statement_timeout, or for ever (red team 21).
        RAISE EXCEPTION 'timeout must not be NULL' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass how long to wait, such as ''10 minutes''; ''0'' looks once without waiting.';
    END IF;
    PERFORM rag._require_read_committed('rag_wait');
    LOOP
        IF NOT rag._still_processing(v_collection) THEN
            RETURN true;
        END IF;
        IF clock_timestamp() >= v_deadline THEN
            RETURN false;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;

-- rag._collection_id for a caller that has no frame of its own: rag tells who called it from the outermost of
-- its functions that runs as the caller through PostgreSQL's SET-clause handler (src/frames.rs), and a
-- procedure that commits may have no SET clause.
CREATE FUNCTION rag._collection_id_for_caller(p_collection text) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN rag._collection_id(p_collection);
END $$;

-- rag_wait as a procedure: CALL rag_await('docs', '1 hour') commits between its checks, so it holds only the
-- snapshot of one check at a time, and autovacuum and index cleanup go on everywhere during a long load, which a
-- SELECT of rag_wait prevents for as long as it runs. Where it may commit it commits first, so that what its
-- caller wrote before (a DO block's rag_ingest) is committed, as the worker needs to see it, whether or not it
-- then has to wait. Where it cannot commit (a transaction block, several statements sent as one query, a
-- function, a procedure with a SET clause, an EXCEPTION block, EXECUTE) it is rag_wait: READ COMMITTED only,
-- holding its caller's snapshot.
-- No SET clause: a procedure with one may not commit. It runs as its caller with the caller's search_path, and
-- PL/pgSQL compiles it once per session with the path of its first caller, then reuses that for every later
-- caller of the session (another role's SECURITY DEFINER function's too): so every name in it is qualified,
-- variable types and operators included, and nothing a caller puts on the path is ever resolved (11_security
-- plants a pg_temp.timestamptz domain that would run as the next caller).
CREATE PROCEDURE @extschema@.rag_await(collection text, timeout interval DEFAULT '60 seconds',
                                       INOUT ready boolean DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    v_collection pg_catalog.int4;
    v_deadline pg_catalog.timestamptz;
BEGIN
    IF NOT rag._may_commit() THEN
        -- Then it is rag_wait, named as what the caller called.
        PERFORM rag._require_read_committed('rag_await in a transaction block or a function');
        ready := @extschema@.rag_wait(collection, timeout);
        RETURN;
    END IF;
    v_collection := rag._collection_id_for_caller(collection);
    IF timeout IS NULL THEN
        RAISE EXCEPTION 'timeout must not be NULL' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass how long to wait, such as ''10 minutes''; ''0'' looks once without waiting.';
    END IF;
    v_deadline := pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) timeout;
    LOOP
        -- Each check is a transaction of its own, whatever default_transaction_isolation says, so it sees what
        -- the worker has committed.
        COMMIT;
        IF NOT rag._still_processing(v_collection) THEN
            ready := true;
            RETURN;
        END IF;
        IF pg_catalog.clock_timestamp() OPERATOR(pg_catalog.>=) v_deadline THEN
            ready := false;
            RETURN;
        END IF;
        PERFORM pg_catalog.pg_sleep(0.05);
    END LOOP;
END $$;

------------------------------------------------------------------------------------------------------------
-- The worker's side. These run as the worker (a superuser) or inside rag_process_queue; nobody else may
-- call them.

-- Whether the process that claimed a queue item (its pid) is still at work on it: alive and connected to this
-- database. A pid alone said yes for any process of the cluster with that number, so an item restored into
-- another database of the same cluster while its worker in the first one ran was never taken again.
CREATE FUNCTION rag._claim_held(p_pid integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_get_activity(p_pid) a
                    WHERE a.datid = (SELECT d.oid FROM pg_catalog.pg_database d
                                      WHERE d.datname = pg_catalog.current_database()))
$$;

-- Claims the next due queue item. Collections take turns: p_recent lists the collections this worker served
-- lately, most recent last, and the oldest due item of the collection served longest ago (or never) wins, so
-- one collection's thousand documents, or one document's thousand chunks (the worker works in slices), never
-- keep another collection's document waiting for long. Within a collection the order is first in, first out,
-- but for items behind the caller's place (below). An item whose claimant is gone counts as unclaimed, so work
-- held by a killed worker is picked up again.
-- Returns everything the worker needs to process the item without another query, and the item's place in the
-- queue's order (not_before, then queue_id).
-- The worker passes, for each collection, the place of the item it last claimed there (p_resume_*): the search
-- starts there, and from the front only when nothing is found from it. The items a load has finished lie at
-- the queue's front, deleted, and their index entries stay while any snapshot may still see them (a rag_wait
-- waiting for the load holds one): each claim from the front walked past all of them, so a load's claims cost
-- the square of its length (1,800 buffers a claim 800 documents into a load). Items before that place are
-- those other claims hold, or ones that came back (a claim given up, an older transaction's insert
-- committed late); the worker forgets its places every few seconds (src/worker/documents.rs), so they wait
-- that long at most.
CREATE FUNCTION rag._claim_next(p_worker integer, p_skip_providers text[] DEFAULT '{}', p_recent integer[] DEFAULT '{}',
                                p_resume_collections integer[] DEFAULT '{}',
                                p_resume_not_before timestamptz[] DEFAULT '{}', p_resume_ids bigint[] DEFAULT '{}')
RETURNS TABLE (queue_id bigint, document_id bigint, collection_id integer, needs_chunking boolean,
               attempts integer, failure_age_seconds double precision, retry_deadline_seconds integer,
               provider_name text, provider_kind text, provider_url text, provider_key_setting text,
               embedding_model text, dimensions integer, document_prefix text,
               chunk_size integer, chunk_overlap integer, chunk_unit text, shadow boolean,
               not_before timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    q rag.queue;
    v_candidate bigint;
    v_found boolean;
    v_shadow boolean;
    v_passed bigint[] := '{}';
    -- rag_process_queue run by a role that is not a superuser: only the collections it may process.
    v_scope integer[] := rag._claim_scope();
    v_resume_collections integer[] := coalesce(p_resume_collections, '{}');
BEGIN
    LOOP
        v_found := false;
        -- A few candidates per collection (the head may be locked by another worker), collections in turn.
        FOR v_candidate IN
            SELECT h.id
              FROM rag.collections c
              LEFT JOIN unnest(v_resume_collections, p_resume_not_before, p_resume_ids)
                        r(collection_id, not_before, id) ON r.collection_id = c.id
             CROSS JOIN LATERAL (
                   -- The range on (collection_id, not_before, id), not "collection_id = c.id": when one collection
                   -- fills the queue, its statistics make the planner walk queue_due and filter every other
                   -- collection's turn out of all of its rows, which made each claim of a bulk load cost O(queue).
                   -- From the place itself: an item released with its place kept (rag._dequeue, for its
                   -- vectors in a model change's new space) is taken at once. Without a place it starts after
                   -- every item due at '-infinity' (none is), as the range (collection_id, not_before) >
                   -- (c.id, '-infinity') did.
                   SELECT qu.id, qu.not_before FROM rag.queue qu
                    WHERE (qu.collection_id, qu.not_before, qu.id)
                          >= (c.id, coalesce(r.not_before, '-infinity'::timestamptz),
                              coalesce(r.id, 9223372036854775807))
                      AND (qu.collection_id, qu.not_before) <= (c.id, now())
                      AND (qu.claimed_by IS NULL OR qu.claimed_by = p_worker
                           OR NOT rag._claim_held(qu.claimed_by))
                      AND qu.id <> ALL (v_passed)
                    ORDER BY qu.collection_id, qu.not_before, qu.id LIMIT 3) h
             -- Models this worker found failing ('provider/model') wait out their cool-down; the others' documents
             -- go ahead, those of a collection whose model change to a failing model is stuck included.
             WHERE (cardinality(p_skip_providers) = 0 OR NOT (rag._embedding_key(h.id) = ANY (p_skip_providers)))
               AND (v_scope IS NULL OR c.id = ANY (v_scope))
             ORDER BY array_position(p_recent, c.id) NULLS FIRST, h.not_before, h.id
        LOOP
            SELECT * INTO q FROM rag.queue qu
             WHERE qu.id = v_candidate AND qu.not_before <= now()
               AND (qu.claimed_by IS NULL OR qu.claimed_by = p_worker
                    OR NOT rag._claim_held(qu.claimed_by))
               FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                v_found := true;
                EXIT;
            END IF;
        END LOOP;
        IF NOT v_found THEN
            IF cardinality(v_resume_collections) > 0 THEN
                -- Nothing from the places given on: from the front once more.
                v_resume_collections := '{}';
                CONTINUE;
            END IF;
            RETURN;
        END IF;
        IF q.unfinished_claims >= 5 THEN
            -- The document without waiting for it: whoever holds it (rag_reindex, a store) locks queue rows
            -- after documents, so waiting here while holding this queue row could deadlock with it. A held
            -- document is passed over by this claim and looked at again by a later one.
            PERFORM 1 FROM rag.documents WHERE id = q.document_id FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                UPDATE rag.documents SET status = 'failed', updated_at = now(),
                       failure_reason = 'abandoned: processing it stopped a worker 5 times' ||
                                        coalesce(' (last error: ' || q.last_error || ')', '')
                 WHERE id = q.document_id;
                DELETE FROM rag.queue WHERE id = q.id;
            ELSE
                v_passed := v_passed || q.id;
            END IF;
            CONTINUE;
        END IF;
        UPDATE rag.queue SET claimed_by = p_worker, claimed_at = now(),
                             unfinished_claims = unfinished_claims + 1
         WHERE id = q.id;
        -- The document's vectors in the searched space come first (it is searchable as soon as they are
        -- there); during a model change, its vectors in the other space then.
        v_shadow := rag._needs_shadow(q.document_id);
        RETURN QUERY
        SELECT q.id, d.id, c.id,
               NOT EXISTS (SELECT 1 FROM rag.chunks ch WHERE ch.collection_id = q.collection_id
                                                        AND ch.document_id = d.id),
               q.attempts,
               extract(epoch FROM now() - q.first_failure_at)::double precision,
               extract(epoch FROM coalesce(c.retry_deadline, rag._setting('rag.retry_deadline')::interval))::integer,
               p.name, p.kind, p.base_url, p.api_key_setting,
               CASE WHEN v_shadow THEN m.embedding_model ELSE c.embedding_model END,
               CASE WHEN v_shadow THEN m.dimensions ELSE c.dimensions END,
               CASE WHEN v_shadow THEN m.document_prefix ELSE c.document_prefix END,
               c.chunk_size, c.chunk_overlap, c.chunk_unit, v_shadow, q.not_before
          FROM rag.documents d
          JOIN rag.collections c ON c.id = d.collection_id
          LEFT JOIN rag.migrations m ON m.collection_id = c.id
          JOIN rag.providers p ON p.name = CASE WHEN v_shadow THEN m.embedding_provider ELSE c.embedding_provider END
         WHERE d.id = q.document_id;
        RETURN;
    END LOOP;
END $$;

-- The column a document's vectors go to: its collection's searched one, or (p_shadow) the other one, which a
-- model change fills.
CREATE FUNCTION rag._target_column(p_vector_column text, p_shadow boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN (p_vector_column = 'embedding') <> p_shadow THEN 'embedding' ELSE 'embedding_alt' END
$$;

-- A document's collection, its chunks, and those of them that have their vector in the collection's searched
-- space, from one look at the document and one count over the collection's partition of rag.chunks (the
-- collection is looked up first so that the count is planned over that partition alone). rag.documents'
-- counters are set from here, never incremented, so a batch written twice or a worker killed half-way leaves
-- them exact. All NULL when the document is gone. PL/pgSQL, not SQL: the worker calls this for every document,
-- and a SQL function that is not inlined is parsed and planned again on every call.
CREATE FUNCTION rag._chunk_counts(p_document_id bigint, OUT collection integer, OUT total integer,
                                  OUT embedded integer)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_column text;
BEGIN
    SELECT c.id, c.vector_column INTO collection, v_column
      FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id WHERE d.id = p_document_id;
    IF collection IS NULL THEN
        RETURN;
    END IF;
    SELECT count(*)::integer,
           count(*) FILTER (WHERE CASE v_column WHEN 'embedding' THEN ch.embedding IS NOT NULL
                                                ELSE ch.embedding_alt IS NOT NULL END)::integer
      INTO total, embedded
      FROM rag.chunks ch
     WHERE ch.collection_id = collection AND ch.document_id = p_document_id;
END $$;

-- Whether the worker's next step for this document is the new space of a model change: the document is chunked,
-- every chunk has its vector in the searched space, some chunk lacks one in the other, and the change is going.
CREATE FUNCTION rag._needs_shadow(p_document_id bigint) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_collection integer;
    v_column text;
BEGIN
    -- Without a change going (nearly always) one indexed lookup answers; the worker asks for every document.
    SELECT c.id, c.vector_column INTO v_collection, v_column
      FROM rag.documents d JOIN rag.migrations m ON m.collection_id = d.collection_id
      JOIN rag.collections c ON c.id = d.collection_id
     WHERE d.id = p_document_id AND m.state = 'embedding';
    IF v_collection IS NULL THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM rag.chunks ch WHERE ch.collection_id = v_collection AND ch.document_id = p_document_id)
       AND NOT EXISTS (SELECT 1 FROM rag.chunks ch
                        WHERE ch.collection_id = v_collection AND ch.document_id = p_document_id
                          AND CASE v_column WHEN 'embedding' THEN ch.embedding ELSE ch.embedding_alt END IS NULL)
       AND EXISTS (SELECT 1 FROM rag.chunks ch
                    WHERE ch.collection_id = v_collection AND ch.document_id = p_document_id
                      AND CASE v_column WHEN 'embedding' THEN ch.embedding_alt ELSE ch.embedding END IS NULL);
END $$;

-- 'provider/model' of the embedding the worker's next step for a queued document would ask for: the
-- collection's, or during a model change (rag._needs_shadow) the new model's. What the worker's circuit breaker
-- is keyed by.
CREATE FUNCTION rag._embedding_key(p_queue_id bigint) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN rag._needs_shadow(q.document_id) THEN m.embedding_provider || '/' || m.embedding_model
                ELSE c.embedding_provider || '/' || c.embedding_model END
      FROM rag.queue q JOIN rag.collections c ON c.id = q.collection_id
      LEFT JOIN rag.migrations m ON m.collection_id = c.id
     WHERE q.id = p_queue_id
$$;

-- The text that stands for a chunk where it is embedded, indexed for full text and reranked: its header
-- (rag.chunks.header), a blank line, then its content. The worker joins them the same way (rag_chunk::with_header).
CREATE FUNCTION rag._with_header(p_header text, p_content text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_header IS NULL THEN p_content ELSE p_header || E'\n\n' || p_content END
$$;

-- The next chunks of a document still without a vector in the space the worker fills (p_shadow: the new one of a
-- model change), in order.
CREATE FUNCTION rag._pending_chunks(p_document_id bigint, p_limit integer, p_shadow boolean)
RETURNS TABLE (chunk_id bigint, header text, content text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_collection integer;
    v_column text;
BEGIN
    SELECT c.id, rag._target_column(c.vector_column, p_shadow) INTO v_collection, v_column
      FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id WHERE d.id = p_document_id;
    RETURN QUERY
    SELECT ch.id, ch.header, ch.content
      FROM rag.chunks ch
     WHERE ch.collection_id = v_collection AND ch.document_id = p_document_id
       AND CASE v_column WHEN 'embedding' THEN ch.embedding ELSE ch.embedding_alt END IS NULL
     ORDER BY ch.ordinal
     LIMIT p_limit;
END $$;

-- Seconds until the next deferred item is due (NULL when nothing waits), a queued document or a watched row,
-- so an idle worker sleeps exactly as long as it may. Rows count too: a written row waits rag.sync_delay, and
-- with only the documents looked at, the worker slept its naptime (5 s) past it unless another write woke it, so
-- a table written now and then had each row searchable 5 s after its commit, not the half second the setting
-- says (session 36, scripts/bench section 9). A row that waits for its next write (infinity) is not due. The
-- empty case is spelled out: greatest() ignores a NULL argument, so greatest(0, NULL) is 0, and an idle worker
-- told "due now" woke every 10 ms (about a fifth of a core for each idle worker of every database with the
-- extension).
-- Whether a restore of this database is half done, so that the worker neither claims nor tidies anything
-- (red team 27). A restore brings rag's rows in its data section and their keys and sequences' values after
-- them: a document queued at the dump was claimed as soon as rag.queue's rows were in, its chunks were given
-- ids the restored ones had (the sequence was not set yet, nor the key that would have refused them), and the
-- restore's primary key then failed (a restore with --exit-on-error stopped there, without the watches'
-- triggers); a watched row's key synced before its table's rows were in deleted the row's document for good.
-- Three signs, whatever order a restore takes: a partition of rag.chunks without its primary key (the post-data
-- section not reached, in a serial restore or one section at a time; the partitions are the collections', made
-- by the dump, where rag's own tables come with their keys from CREATE EXTENSION), a superuser's pg_restore
-- connected to the database (pg_restore -j runs post-data items before other data items end), or rows of rag
-- holding ids their sequence has not given yet (a dump sets its sequences after every table's rows: the one
-- sign a data-only restore replayed with psql gives, whose keys came with the schema). Another role naming its
-- session "pg_restore" does not count.
-- The third sign looks at rag.documents, whose rows come before the queues' in a restore (rag.queue's name
-- them), and, in a database whose documents' sequence never gave an id, at rag.row_queue and rag.row_batches
-- too (a watch's keys queued before any was synced). Each probe asks for an id from the sequence's next value
-- up: in step there is none, and the probe reads the index's last page, however many finished entries a held
-- snapshot keeps behind it (the idle worker asks every naptime, and a max(id) would walk them all). The
-- sequence is read outside any snapshot, so it is never behind a row this snapshot sees. Rows left without
-- their sequences' values for good (a dump or restore that picked tables but not their sequences, a logical
-- replica of rag's tables) keep the worker waiting until a superuser sets them (README, Backups).
-- A watch whose table has no triggers yet waits as well (rag._claim_row), for a database without chunks.
-- 37–39 µs a call with five collections and 3,000 documents, 25–29 µs without the third sign (5,000 calls, two
-- runs each, debug build, 2026-12-07); asked once per worker step and per idle naptime.
-- rag.status shows it to every reader: as its owner, so that the answer does not depend on what of
-- pg_stat_activity the reader may see, and it tells nothing but the yes or no.
CREATE FUNCTION rag._restore_under_way() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits h
                    WHERE h.inhparent = 'rag.chunks'::regclass
                      AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                                       WHERE i.indrelid = h.inhrelid AND i.indisprimary))
        OR EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a
                     JOIN pg_catalog.pg_roles r ON r.oid = a.usesysid AND r.rolsuper
                    WHERE a.datname = pg_catalog.current_database() AND a.application_name = 'pg_restore')
        -- min(), not EXISTS: its plan is always the index's, where EXISTS may pick a scan of the whole table.
        OR (SELECT min(d.id) FROM rag.documents d
             WHERE d.id >= (SELECT s.last_value + s.is_called::integer FROM rag.documents_id_seq s)) IS NOT NULL
        OR ((SELECT NOT s.is_called FROM rag.documents_id_seq s)
            AND ((SELECT min(r.id) FROM rag.row_queue r
                   WHERE r.id >= (SELECT s.last_value + s.is_called::integer FROM rag.row_queue_id_seq s)) IS NOT NULL
                 OR (SELECT min(b.id) FROM rag.row_batches b
                      WHERE b.id >= (SELECT s.last_value + s.is_called::integer FROM rag.row_batches_id_seq s))
                    IS NOT NULL))
$$;

CREATE FUNCTION rag._seconds_until_due() RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN n.first IS NOT NULL THEN greatest(0, extract(epoch FROM n.first - now()))::double precision END
      FROM (SELECT least((SELECT min(q.not_before) FROM rag.queue q),
                         (SELECT min(r.not_before) FROM rag.row_queue r
                           WHERE r.not_before < 'infinity'
                             -- One a live worker or session holds is theirs: counted, it kept an idle worker
                             -- waking every second for as long as they held it (review of session 36).
                             AND (r.claimed_by IS NULL OR NOT rag._claim_held(r.claimed_by)))) AS first) n
$$;

-- A document's chunks arrive in batches, all in the worker's one transaction for the document, so that a
-- large document never has all its chunk texts in memory at once. The first batch (p_first_ordinal 0) is
-- stored only when the document has no chunks yet; its result tells the caller whether to go on: -1 the
-- document is gone, -2 it was chunked before (an earlier attempt got that far), else the chunks stored so far.
CREATE FUNCTION rag._store_chunks(p_document_id bigint, p_first_ordinal integer, p_contents text[],
                                  p_starts integer[], p_ends integer[], p_tokens integer[], p_pages integer[],
                                  p_headers text[] DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    d rag.documents;
    v_count integer;
BEGIN
    SELECT * INTO d FROM rag.documents WHERE id = p_document_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    IF p_first_ordinal = 0 AND EXISTS (SELECT 1 FROM rag.chunks
                                        WHERE collection_id = d.collection_id AND document_id = p_document_id) THEN
        UPDATE rag.documents
           SET (chunks_total, chunks_embedded) = (SELECT k.total, k.embedded FROM rag._chunk_counts(p_document_id) k),
               updated_at = now()
         WHERE id = p_document_id;
        RETURN -2;
    END IF;
    IF EXISTS (SELECT 1 FROM rag.set_aside_chunks k WHERE k.document_id = p_document_id) THEN
        -- A changed document's old chunks were set aside (rag._set_aside_chunks): a chunk of the same text and
        -- header takes the vectors they had. Planned for this call's arrays (EXECUTE): the generic plan the
        -- worker's session made after five calls, for an unnest of unknown length, was a nested loop over every
        -- set-aside row of the document for each new chunk, so replacing a row's chunks took the square of its
        -- length (red team 23: 8 s for a batch of 5,000 chunks against 15,000 set aside, 22 ms planned for its
        -- arrays), with the watched table locked meanwhile. The text's hash keeps the lookup an index probe in
        -- any plan. A new document, the common case, takes the plain insert below and its generic plan.
        EXECUTE $sql$
            INSERT INTO rag.chunks (document_id, collection_id, ordinal, content, header, token_estimate, page,
                                    char_start, char_end, embedding, embedding_alt, tsv)
            SELECT $1, $2, $3 + t.ordinal - 1, t.content, t.header, t.tokens, t.page, t.char_start, t.char_end,
                   k.embedding, k.embedding_alt,
                   to_tsvector(c.text_search_config::regconfig, rag._with_header(t.header, t.content))
              FROM unnest($4, $5, $6, $7, $8, $9)
                   WITH ORDINALITY AS t(content, char_start, char_end, tokens, page, header, ordinal)
              JOIN rag.collections c ON c.id = $2
              LEFT JOIN rag.set_aside_chunks k
                     ON k.document_id = $1 AND hashtextextended(k.content, 0) = hashtextextended(t.content, 0)
                    AND k.content = t.content AND k.header IS NOT DISTINCT FROM t.header$sql$
        USING p_document_id, d.collection_id, p_first_ordinal, p_contents, p_starts, p_ends, p_tokens, p_pages,
              p_headers;
    ELSE
        INSERT INTO rag.chunks (document_id, collection_id, ordinal, content, header, token_estimate, page,
                                char_start, char_end, tsv)
        SELECT p_document_id, d.collection_id, p_first_ordinal + t.ordinal - 1, t.content, t.header, t.tokens,
               t.page, t.char_start, t.char_end,
               to_tsvector(c.text_search_config::regconfig, rag._with_header(t.header, t.content))
          FROM unnest(p_contents, p_starts, p_ends, p_tokens, p_pages, p_headers)
               WITH ORDINALITY AS t(content, char_start, char_end, tokens, page, header, ordinal)
          JOIN rag.collections c ON c.id = d.collection_id;
    END IF;
    v_count := p_first_ordinal + coalesce(cardinality(p_contents), 0);
    UPDATE rag.documents SET chunks_total = v_count,
           chunks_embedded = CASE WHEN p_first_ordinal = 0 THEN 0 ELSE chunks_embedded END,
           updated_at = now()
     WHERE id = p_document_id;
    RETURN v_count;
END $$;

-- The collection and the document that vectors are stored for, locked in that order and before the document's
-- chunks: the order in which rag_drop_collection and deleting a document (its cascade to rag.chunks) take them,
-- so that either waits here instead of deadlocking. The collection's row is only shared, so that workers store
-- into one collection side by side while whatever changes the collection (its model, dropping it) waits for
-- them all. It is taken exclusively while the collection has no dimension yet, because the first vectors set it
-- (rag._accept_dimensions) and two stores sharing the row could not both upgrade their lock without a deadlock.
-- A dimension found set before the lock and gone after it (a model change switched to the same model before any
-- vector of it was stored) is the one case left to an upgrade. All NULL when the document is gone.
-- The locks are waited for at most 2 s (as in the stores that call it): a writer's transaction left open on the
-- document (an uncommitted rag_delete_document) or an admin's on the collection (rag_set_embedding_model) kept
-- the worker waiting as long as it stayed open, and the database's other collections with it. Past that the
-- step fails with lock_not_available, and the worker puts the document back for a little while without counting
-- an attempt (src/worker/documents.rs).
CREATE FUNCTION rag._lock_for_store(p_document_id bigint) RETURNS rag.collections
LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
DECLARE
    c rag.collections;
    v_collection integer;
    v_first boolean;
BEGIN
    SELECT d.collection_id, col.dimensions IS NULL INTO v_collection, v_first
      FROM rag.documents d JOIN rag.collections col ON col.id = d.collection_id
     WHERE d.id = p_document_id;
    IF v_collection IS NULL THEN
        RETURN NULL;
    ELSIF v_first THEN
        SELECT * INTO c FROM rag.collections WHERE id = v_collection FOR UPDATE;
    ELSE
        SELECT * INTO c FROM rag.collections WHERE id = v_collection FOR SHARE;
        IF c.dimensions IS NULL THEN
            SELECT * INTO c FROM rag.collections WHERE id = v_collection FOR UPDATE;
        END IF;
    END IF;
    -- A document never moves to another collection, so the one looked up above is still its own.
    PERFORM 1 FROM rag.documents WHERE id = p_document_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN c;
END $$;

-- Vectors of p_dimensions for the searched space of collection c (locked by the caller): NULL when they may be
-- stored, else the reason the document fails. The first vectors fix the collection's dimension; its index is
-- the caller's rag._fit_index_to_load, once per batch.
CREATE FUNCTION rag._accept_dimensions(c rag.collections, p_dimensions integer) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF c.dimensions IS NULL THEN
        UPDATE rag.collections SET dimensions = p_dimensions WHERE id = c.id;
    ELSIF c.dimensions <> p_dimensions THEN
        RETURN format('model "%s" returned %s-dimensional vectors but collection "%s" holds %s-dimensional ones; vectors of different sizes are never mixed',
                      c.embedding_model, p_dimensions, c.name, c.dimensions);
    END IF;
    RETURN NULL;
END $$;

-- A document ready in its searched space leaves the queue, or its item stays (released for the next claim)
-- while a model change still needs its vectors in the other space.
CREATE FUNCTION rag._dequeue(p_queue_id bigint, p_document_id bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF rag._needs_shadow(p_document_id) THEN
        UPDATE rag.queue SET claimed_by = NULL, claimed_at = NULL, unfinished_claims = 0 WHERE id = p_queue_id;
    ELSE
        DELETE FROM rag.queue WHERE id = p_queue_id;
    END IF;
END $$;

-- The worker's path for small new documents of one collection whose chunks were embedded in one provider call:
-- their chunks and vectors are written and the documents finished in one call, set-based, so that the statements
-- per call do not grow with its documents, and with no row written twice. Chunk i belongs to p_chunk_documents[i]
-- (in document order), is its p_ordinals[i]-th, and its vector is p_vectors[(i-1)*p_dimensions+1 :
-- i*p_dimensions] (one flat array: no text to format and parse per number). One row per document: stored is
-- false when this path does not apply any more (deleted, chunked by another path, moved elsewhere, or the
-- collection's model changed meanwhile): the caller then takes it down the regular path. refusal is the reason the
-- document fails, if it must (the same for every document of the call). The caller ends its batch with
-- rag._fit_index_to_load.
CREATE FUNCTION rag._store_documents(p_queue_ids bigint[], p_document_ids bigint[], p_embed_tokens bigint[],
                                     p_chunk_documents bigint[], p_ordinals integer[], p_contents text[],
                                     p_starts integer[], p_ends integer[], p_tokens integer[], p_pages integer[],
                                     p_vectors real[], p_dimensions integer, p_model text, p_provider text,
                                     p_headers text[] DEFAULT NULL)
RETURNS TABLE (document_id bigint, stored boolean, refusal text)
-- Every lock it takes (the group's other documents too) is waited for at most 2 s, as in rag._lock_for_store.
LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
DECLARE
    c rag.collections;
    v_refusal text;
    v_chunks integer := coalesce(cardinality(p_contents), 0);
    v_ready bigint[] := '{}';
BEGIN
    IF cardinality(p_queue_ids) IS DISTINCT FROM cardinality(p_document_ids)
       OR cardinality(p_embed_tokens) IS DISTINCT FROM cardinality(p_document_ids)
       OR cardinality(p_chunk_documents) IS DISTINCT FROM v_chunks OR cardinality(p_ordinals) IS DISTINCT FROM v_chunks
       OR cardinality(p_starts) IS DISTINCT FROM v_chunks OR cardinality(p_ends) IS DISTINCT FROM v_chunks
       OR cardinality(p_tokens) IS DISTINCT FROM v_chunks OR cardinality(p_pages) IS DISTINCT FROM v_chunks
       OR (p_headers IS NOT NULL AND cardinality(p_headers) IS DISTINCT FROM v_chunks) THEN
        RAISE EXCEPTION 'rag._store_documents: arrays of unequal length' USING ERRCODE = 'internal_error';
    END IF;
    -- The group's documents share the collection of its first (rag._claim_more claims no other): the first
    -- still there decides which, and locks it and itself in rag._lock_for_store's order.
    SELECT l.* INTO c
      FROM (SELECT d.id FROM rag.documents d WHERE d.id = ANY (p_document_ids) ORDER BY d.id LIMIT 1) first_one,
           LATERAL rag._lock_for_store(first_one.id) l;
    IF cardinality(p_vectors) IS DISTINCT FROM v_chunks::bigint * p_dimensions THEN
        v_refusal := format('%s numbers for %s chunks of %s dimensions', coalesce(cardinality(p_vectors), 0), v_chunks,
                            p_dimensions);
    ELSIF c.id IS NOT NULL AND c.embedding_model = p_model AND c.embedding_provider = p_provider THEN
        v_refusal := rag._accept_dimensions(c, p_dimensions);
    END IF;
    -- Deleted, or the model or its provider changed: nothing is stored, and the regular path takes each document.
    IF c.id IS NOT NULL AND c.embedding_model = p_model AND c.embedding_provider = p_provider AND v_refusal IS NULL THEN
        -- The others in id order (the order any other multi-document writer takes): those still in this
        -- collection and not chunked meanwhile are this call's.
        SELECT coalesce(array_agg(d.id ORDER BY d.id), '{}') INTO v_ready
          FROM (SELECT d.id FROM rag.documents d
                 WHERE d.id = ANY (p_document_ids) AND d.collection_id = c.id
                 ORDER BY d.id FOR UPDATE) d
         WHERE NOT EXISTS (SELECT 1 FROM rag.chunks ch WHERE ch.collection_id = c.id AND ch.document_id = d.id);
        INSERT INTO rag.chunks (document_id, collection_id, ordinal, content, header, token_estimate, page,
                                char_start, char_end, tsv, embedding, embedding_alt)
        SELECT t.document_id, c.id, t.ordinal, t.content, t.header, t.tokens, t.page, t.char_start, t.char_end,
               to_tsvector(c.text_search_config::regconfig, rag._with_header(t.header, t.content)),
               -- real[] into the vector columns by pgvector's assignment cast.
               CASE c.vector_column WHEN 'embedding'
                    THEN p_vectors[(t.n - 1) * p_dimensions + 1 : t.n * p_dimensions] END,
               CASE c.vector_column WHEN 'embedding_alt'
                    THEN p_vectors[(t.n - 1) * p_dimensions + 1 : t.n * p_dimensions] END
          FROM unnest(p_chunk_documents, p_ordinals, p_contents, p_starts, p_ends, p_tokens, p_pages, p_headers)
               WITH ORDINALITY AS t(document_id, ordinal, content, char_start, char_end, tokens, page, header, n)
         WHERE t.document_id = ANY (v_ready);
        UPDATE rag.documents d SET chunks_total = counted.chunks, chunks_embedded = counted.chunks,
               embed_calls = d.embed_calls + 1, embed_tokens = d.embed_tokens + coalesce(t.embed_tokens, 0),
               status = 'ready', failure_reason = NULL, ready_at = now(), updated_at = now()
          FROM unnest(p_document_ids, p_embed_tokens) t(id, embed_tokens),
               (SELECT cd.id, count(*)::integer AS chunks FROM unnest(p_chunk_documents) cd(id) GROUP BY cd.id) counted
         WHERE d.id = t.id AND counted.id = t.id AND d.id = ANY (v_ready);
        IF EXISTS (SELECT 1 FROM rag.migrations m WHERE m.collection_id = c.id AND m.state = 'embedding') THEN
            -- A model change began after the claim: each document's item stays while the new space needs it.
            PERFORM rag._dequeue(t.queue_id, t.id)
               FROM unnest(p_queue_ids, p_document_ids) t(queue_id, id) WHERE t.id = ANY (v_ready);
        ELSE
            -- By key, from an array: as a join with the unnest, a queue whose statistics say it is empty (see
            -- rag._claim_more's update) was read whole once per document (1.1M buffers over a 3,000-document load).
            DELETE FROM rag.queue qu
             WHERE qu.id = ANY (ARRAY(SELECT t.queue_id FROM unnest(p_queue_ids, p_document_ids) t(queue_id, id)
                                       WHERE t.id = ANY (v_ready)));
        END IF;
    END IF;
    -- One row per document, in the order given.
    RETURN QUERY SELECT t.id, t.id = ANY (v_ready), v_refusal
                   FROM unnest(p_document_ids) WITH ORDINALITY t(id, n) ORDER BY t.n;
END $$;

-- More small new documents of the collection of the queue item the worker just claimed (p_queue_id), claimed
-- with it so that their chunks share provider calls and transactions: due, unclaimed, never tried, not yet
-- chunked, at most p_max_bytes of text, and no model change going. Oldest first, as rag._claim_next would.
-- p_budget_bytes (NULL: none) bounds the text of the whole group, the first item's included: what the
-- worker's provider embeds in about a slice of time, so that a slow provider's documents are spread over
-- the workers instead of all taken by the first to claim.
-- The queue is walked in its index order, and each item's document and chunks looked up by key, one by one:
-- as one join, the planner sorted the collection's whole queue and scanned all of rag.chunks for every item
-- whenever the table's statistics said it was empty (a collection created right after another was dropped:
-- CREATE INDEX counts live rows only), which made a 3,000-document load take 47 s instead of 5. At most
-- p_limit + rag._limit('claim_more_lookahead') items are looked at, so a queue of large or chunked documents
-- costs a claim the same as a short one.
CREATE FUNCTION rag._claim_more(p_worker integer, p_queue_id bigint, p_limit integer, p_max_bytes integer,
                                p_budget_bytes integer DEFAULT NULL)
RETURNS TABLE (queue_id bigint, document_id bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_collection integer;
    v_budget bigint;
    v_total bigint := 0;
    v_bytes integer;
    v_ids bigint[] := '{}';
    r record;
BEGIN
    SELECT qu.collection_id, p_budget_bytes - octet_length(d.body) INTO v_collection, v_budget
      FROM rag.queue qu JOIN rag.documents d ON d.id = qu.document_id
     WHERE qu.id = p_queue_id;
    IF v_collection IS NULL OR p_limit IS NULL OR p_limit < 1 OR p_max_bytes IS NULL OR v_budget < 1
       OR EXISTS (SELECT 1 FROM rag.migrations m WHERE m.collection_id = v_collection) THEN
        RETURN;
    END IF;
    -- Read without locks, so that the running total of text is taken in claim order; what another worker
    -- claims meanwhile is skipped below and only makes the group smaller.
    FOR r IN SELECT qu.id, qu.document_id FROM rag.queue qu
              -- The same range as rag._claim_next's, for the same reason.
              WHERE (qu.collection_id, qu.not_before) > (v_collection, '-infinity'::timestamptz)
                AND (qu.collection_id, qu.not_before) <= (v_collection, now())
                AND qu.id <> p_queue_id AND qu.claimed_by IS NULL AND qu.attempts = 0 AND qu.unfinished_claims = 0
              ORDER BY qu.collection_id, qu.not_before, qu.id
              LIMIT p_limit + rag._limit('claim_more_lookahead')::integer
    LOOP
        SELECT octet_length(d.body) INTO v_bytes FROM rag.documents d WHERE d.id = r.document_id;
        CONTINUE WHEN v_bytes IS NULL OR v_bytes > p_max_bytes
                      OR EXISTS (SELECT 1 FROM rag.chunks ch
                                  WHERE ch.collection_id = v_collection AND ch.document_id = r.document_id);
        v_total := v_total + v_bytes;
        -- The total only grows: every later item would be over the budget too.
        EXIT WHEN v_budget IS NOT NULL AND v_total > v_budget;
        v_ids := v_ids || r.id;
        EXIT WHEN cardinality(v_ids) >= p_limit;
    END LOOP;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    -- The items are locked once, into an array (an InitPlan), and the update takes them by key. As a join,
    -- the planner of a queue whose statistics say it is empty (a VACUUM or ANALYZE at the end of a load while a
    -- snapshot still saw its deleted rows: 0 rows on 24 pages) ran the locking subquery again for every row of
    -- the queue: 284,143 buffers for one call with 3,000 items queued, a load 8 times slower (review of
    -- session 39).
    RETURN QUERY
    UPDATE rag.queue q SET claimed_by = p_worker, claimed_at = now(), unfinished_claims = q.unfinished_claims + 1
     WHERE q.id = ANY (ARRAY(SELECT qu.id FROM rag.queue qu
                              WHERE qu.id = ANY (v_ids) AND qu.claimed_by IS NULL AND qu.attempts = 0
                                AND qu.unfinished_claims = 0
                                FOR UPDATE SKIP LOCKED))
    RETURNING q.id, q.document_id;
END $$;

-- Writes one batch of vectors (chunk i's are p_vectors[(i-1)*p_dimensions+1 : i*p_dimensions]). Returns NULL
-- on success, or the reason the document must fail (a vector of another dimension than the collection's).
-- Counters are recomputed from the table, never incremented, so a batch written twice or a worker killed
-- half-way leaves them exact.
-- p_model and p_provider made the vectors and p_shadow is the space they were made for: a batch made for a
-- space that has changed model meanwhile (a model change switched, was cancelled or replaced) is dropped, and its
-- chunks are embedded again with the model now in force. The provider counts as much as the name: two servers
-- may serve different weights under one name (a quantized copy), and vectors of both never share a space.
CREATE FUNCTION rag._store_embeddings(p_queue_id bigint, p_document_id bigint, p_chunk_ids bigint[],
                                      p_vectors real[], p_dimensions integer, p_tokens bigint, p_model text,
                                      p_provider text, p_shadow boolean)
RETURNS text
-- Every lock it takes is waited for at most 2 s, as in rag._lock_for_store (which says why).
LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
DECLARE
    c rag.collections;
    m rag.migrations;
    v_column text;
    v_refusal text;
BEGIN
    IF cardinality(p_vectors) IS DISTINCT FROM cardinality(p_chunk_ids)::bigint * p_dimensions THEN
        RAISE EXCEPTION 'rag._store_embeddings: % numbers for % chunks of % dimensions',
                        cardinality(p_vectors), cardinality(p_chunk_ids), p_dimensions USING ERRCODE = 'internal_error';
    END IF;
    c := rag._lock_for_store(p_document_id);
    IF c.id IS NULL THEN
        RETURN NULL;  -- deleted meanwhile: nothing to store
    END IF;
    IF p_shadow THEN
        -- Shared like the collection's row (rag._lock_for_store), and for the same reason exclusive only until
        -- the change's first vectors set its dimension.
        IF (SELECT mi.dimensions IS NULL FROM rag.migrations mi WHERE mi.collection_id = c.id) THEN
            SELECT * INTO m FROM rag.migrations WHERE collection_id = c.id AND state = 'embedding' FOR UPDATE;
        ELSE
            SELECT * INTO m FROM rag.migrations WHERE collection_id = c.id AND state = 'embedding' FOR SHARE;
        END IF;
        IF NOT FOUND OR m.embedding_model <> p_model OR m.embedding_provider <> p_provider THEN
            RETURN NULL;
        END IF;
        IF m.dimensions IS NULL THEN
            UPDATE rag.migrations SET dimensions = p_dimensions WHERE collection_id = c.id;
        ELSIF m.dimensions <> p_dimensions THEN
            RETURN format('model "%s" returned %s-dimensional vectors but the change of collection "%s" to it expects %s; vectors of different sizes are never mixed',
                          m.embedding_model, p_dimensions, c.name, m.dimensions);
        END IF;
    ELSIF c.embedding_model <> p_model OR c.embedding_provider <> p_provider THEN
        RETURN NULL;
    ELSE
        v_refusal := rag._accept_dimensions(c, p_dimensions);
        IF v_refusal IS NOT NULL THEN
            RETURN v_refusal;
        END IF;
    END IF;
    v_column := rag._target_column(c.vector_column, p_shadow);
    -- The column by name, so that real[] goes in by pgvector's assignment cast (its type is off rag's
    -- search_path) and the other space's column is not rewritten.
    EXECUTE format('UPDATE rag.chunks ch SET %1$I = v.vec
                      FROM (SELECT u.id, $1[(u.n - 1) * $2 + 1 : u.n * $2] AS vec
                              FROM unnest($3) WITH ORDINALITY AS u(id, n)) v
                     WHERE ch.collection_id = $5 AND ch.id = v.id AND ch.document_id = $4 AND ch.%1$I IS NULL', v_column)
      USING p_vectors, p_dimensions, p_chunk_ids, p_document_id, c.id;
    UPDATE rag.documents SET
           chunks_embedded = (SELECT k.embedded FROM rag._chunk_counts(p_document_id) k),
           embed_calls = embed_calls + 1,
           embed_tokens = embed_tokens + coalesce(p_tokens, 0),
           updated_at = now()
     WHERE id = p_document_id;
    -- Progress: the retry clock starts again at the next failure.
    UPDATE rag.queue SET attempts = 0, first_failure_at = NULL, last_error = NULL WHERE id = p_queue_id;
    IF NOT p_shadow THEN
        PERFORM rag._fit_index_to_load(c.id);
    END IF;
    RETURN NULL;
END $$;

-- Marks the document ready when every chunk has its vector in the searched space; returns whether it did. The
-- queue item stays (released for the next claim) while a model change still needs the document's vectors in
-- the other space.
CREATE FUNCTION rag._finish(p_queue_id bigint, p_document_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    k record;
BEGIN
    SELECT * INTO k FROM rag._chunk_counts(p_document_id);
    UPDATE rag.documents SET chunks_total = k.total, chunks_embedded = k.embedded, updated_at = now()
     WHERE id = p_document_id;
    -- A document gone meanwhile (k.collection NULL) leaves the queue too.
    IF k.collection IS NULL OR k.total = k.embedded THEN
        UPDATE rag.documents SET status = 'ready', failure_reason = NULL, ready_at = now()
         WHERE id = p_document_id AND status <> 'ready';
        PERFORM rag._dequeue(p_queue_id, p_document_id);
        IF k.collection IS NOT NULL THEN
            PERFORM rag._fit_index_to_load(k.collection);
        END IF;
        RETURN true;
    END IF;
    RETURN false;
END $$;

-- A transient failure: try again after p_delay_ms. p_counts is false when the work was only interrupted
-- (shutdown), which is no fault of the provider's.
CREATE FUNCTION rag._defer(p_queue_id bigint, p_delay_ms bigint, p_error text, p_counts boolean) RETURNS void
LANGUAGE sql AS $$
    UPDATE rag.queue SET
           not_before = now() + make_interval(secs => p_delay_ms / 1000.0),
           attempts = attempts + CASE WHEN p_counts THEN 1 ELSE 0 END,
           first_failure_at = CASE WHEN p_counts THEN coalesce(first_failure_at, now()) ELSE first_failure_at END,
           last_error = coalesce(left(p_error, 2000), last_error),
           claimed_by = NULL, claimed_at = NULL, unfinished_claims = 0
     -- Not waiting for an item another transaction holds (a writer's uncommitted delete of the document takes
     -- its queue item along): the claim stays this worker's, and every claim skips a locked item anyway.
     WHERE id = (SELECT qu.id FROM rag.queue qu WHERE qu.id = p_queue_id FOR UPDATE SKIP LOCKED)
$$;

-- A document that cannot be embedded fails; when it was its vectors for a model change that failed (p_shadow),
-- the document stays as it is (searchable with the current model) and the change fails instead, with the reason.
-- Every reader of the collection sees a change's reason (rag.status, rag.migrations), so for a row of a watched
-- table, which its rules may keep from them, the reason is not quoted there (a provider's refusal may quote the
-- text it was sent, a cast error the row's values: red team 16): the server log has it.
CREATE FUNCTION rag._fail(p_queue_id bigint, p_document_id bigint, p_reason text, p_shadow boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_watched boolean;
BEGIN
    UPDATE rag.documents SET status = 'failed', failure_reason = left(p_reason, 2000), updated_at = now()
     WHERE id = p_document_id AND NOT p_shadow;
    IF p_shadow THEN
        v_watched := EXISTS (SELECT 1 FROM rag.documents d WHERE d.id = p_document_id AND d.watch_id IS NOT NULL);
        UPDATE rag.migrations SET state = 'failed',
               failure_reason = left(CASE WHEN v_watched
                                          THEN format('document %s, a row of a watched table, could not be embedded with the new model (the reason is in the server log: the collection''s readers may not all read that row)',
                                                      p_document_id)
                                          ELSE format('document %s: %s', p_document_id, p_reason) END, 2000)
         WHERE state = 'embedding'
           AND collection_id = (SELECT collection_id FROM rag.documents WHERE id = p_document_id);
        IF FOUND AND v_watched THEN
            RAISE LOG 'rag: the model change of the collection of document % failed on it: %', p_document_id, p_reason;
        END IF;
    END IF;
    DELETE FROM rag.queue WHERE id = p_queue_id;
END $$;

-- The extension's schema again, where pgrx creates the Rust functions declared after this file.
SET LOCAL search_path = @extschema@, pg_temp;
