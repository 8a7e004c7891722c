-- Retrieval. The question is embedded in Rust (rag._embed_query); the search itself is SQL, built with the
-- collection's id and dimension as literals so the planner can match the collection's partial HNSW index.

-- The one search of the extension. rag_query, rag_prompt and rag_ask (through rag._retrieve_context) all find
-- chunks through rag._search, and rag_explain shows the plan of the query rag._search_sql builds for it, so the
-- index expression, row visibility and the metadata filter are written once. Hybrid search and reranking
-- belong here too.
--
-- The k nearest chunks of a collection to a vector, whatever their distance (callers apply the ceiling: rag_ask
-- records how close the nearest was even when it refuses). A chunk made from a row of a watched table is a
-- candidate only while the caller could SELECT that row (rag._row_visible); with a filter, only chunks of
-- documents whose metadata contains it. Parameters: $1 the vector, $2 k, $3 the filter.
CREATE FUNCTION rag._search_sql(c rag.collections, with_filter boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format($q$
        SELECT ch.id AS chunk_id, ch.document_id, ch.ordinal,
               ch.embedding::vector(%1$s) <=> $1::vector(%1$s) AS distance
          FROM rag.chunks ch JOIN rag.documents fd ON fd.id = ch.document_id
         WHERE ch.collection_id = %2$s%3$s
           AND (fd.watch_id IS NULL OR rag._row_visible(fd.watch_id, fd.source_key))
         ORDER BY ch.embedding::vector(%1$s) <=> $1::vector(%1$s)
         LIMIT $2$q$,
        c.dimensions, c.id,
        CASE WHEN with_filter THEN ' AND fd.metadata @> $3' ELSE '' END)
$$;

CREATE FUNCTION rag._search(c rag.collections, p_vector text, p_k integer, p_filter jsonb DEFAULT NULL)
RETURNS TABLE (chunk_id bigint, document_id bigint, ordinal integer, distance double precision)
LANGUAGE plpgsql AS $$
BEGIN
    IF c.dimensions IS NULL THEN
        RETURN;
    END IF;
    -- The filter and row visibility remove candidates after the index scan; an iterative scan keeps looking
    -- until k rows survive them (relaxed order: better recall; callers sort by distance).
    PERFORM set_config('hnsw.iterative_scan', 'relaxed_order', true);
    IF p_filter IS NULL THEN
        RETURN QUERY EXECUTE rag._search_sql(c, false) USING p_vector, p_k;
    ELSE
        RETURN QUERY EXECUTE rag._search_sql(c, true) USING p_vector, p_k, p_filter;
    END IF;
END $$;

CREATE FUNCTION rag_query(
    collection   text,
    query        text,
    k            integer DEFAULT 5,
    max_distance double precision DEFAULT NULL,
    filter       jsonb DEFAULT NULL
) RETURNS TABLE (document_id bigint, title text, chunk_id bigint, ordinal integer, content text,
                 distance double precision, metadata jsonb, page integer, source text, source_key jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    c rag.collections;
    v_vector text;
    v_tokens bigint;
    v_started timestamptz := clock_timestamp();
    v_embedded timestamptz;
    v_count integer;
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = rag._collection_id(collection);
    IF query IS NULL OR btrim(query) = '' THEN
        RAISE EXCEPTION 'the query is empty' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass the question to search for.';
    END IF;
    IF k IS NULL OR k NOT BETWEEN rag._limit('search_k_min')::integer AND rag._limit('search_k_max')::integer THEN
        RAISE EXCEPTION 'k must be between % and %, not %', rag._limit('search_k_min'), rag._limit('search_k_max'),
                        coalesce(k::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'k is how many chunks to return.';
    END IF;
    IF filter IS NOT NULL AND jsonb_typeof(filter) <> 'object' THEN
        RAISE EXCEPTION 'filter must be a JSON object matched against document metadata'
            USING ERRCODE = 'invalid_parameter_value', HINT = 'For example ''{"department": "hr"}''.';
    END IF;
    IF c.dimensions IS NOT NULL THEN
        SELECT e.vector, e.prompt_tokens INTO v_vector, v_tokens FROM rag._embed_query_usage(c.id, query) e;
        v_embedded := clock_timestamp();
        RETURN QUERY
        SELECT s.document_id, d.title, s.chunk_id, s.ordinal, ch.content, s.distance, d.metadata, ch.page,
               d.source, d.source_key
          FROM rag._search(c, v_vector, k, filter) s
          JOIN rag.chunks ch ON ch.id = s.chunk_id
          JOIN rag.documents d ON d.id = s.document_id
         WHERE s.distance <= coalesce(max_distance, c.max_distance)
         ORDER BY s.distance, s.chunk_id;
        GET DIAGNOSTICS v_count = ROW_COUNT;
    END IF;
    -- The ledger: one row per call, even when nothing was found.
    PERFORM rag._record_query(
        p_collection_id => c.id, p_kind => 'query', p_question => query, p_outcome => 'retrieved',
        p_reason => CASE WHEN coalesce(v_count, 0) = 0 THEN 'nothing within the distance ceiling' END,
        p_sources_sent => coalesce(v_count, 0), p_citations => '[]', p_citations_stripped => 0,
        p_embedding_model => c.embedding_model, p_embed_tokens => v_tokens, p_chat_calls => 0,
        p_embed_ms => extract(epoch FROM v_embedded - v_started) * 1000,
        p_search_ms => extract(epoch FROM clock_timestamp() - v_embedded) * 1000,
        p_latency_ms => extract(epoch FROM clock_timestamp() - v_started) * 1000);
END $$;

-- The plan of the search (rag._search) for a collection, for DBAs checking that the HNSW index is used.
CREATE FUNCTION rag_explain(collection text, query text DEFAULT 'explain', k integer DEFAULT 5)
RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    c rag.collections;
    v_line text;
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = rag._collection_id(collection);
    IF c.dimensions IS NULL THEN
        RAISE EXCEPTION 'collection "%" has no vectors yet', collection
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Ingest a document and wait for it.';
    END IF;
    FOR v_line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || rag._search_sql(c, false)
        USING rag._embed_query(c.id, query), k
    LOOP
        -- The question's vector is noise in a plan; show where it goes instead.
        RETURN NEXT regexp_replace(v_line, '''\[[^]]*\]''::vector', '$1::vector', 'g');
    END LOOP;
END $$;
