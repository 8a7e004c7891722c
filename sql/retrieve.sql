-- Retrieval. The question is embedded in Rust (rag._embed_query); the search itself is SQL, built with the
-- collection's id and dimension as literals so the planner can match the collection's partial HNSW index.

-- A chunk made from a row of a watched table is a candidate only while the caller could SELECT that row
-- (rag._row_visible); the iterative index scan keeps looking until k candidates pass that and the filter.
CREATE FUNCTION rag._search_sql(c rag.collections, with_filter boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format($q$
        WITH hits AS (
            SELECT ch.id, ch.document_id, ch.ordinal, ch.content, ch.page,
                   ch.embedding::vector(%1$s) <=> $1::vector(%1$s) AS distance
              FROM rag.chunks ch JOIN rag.documents fd ON fd.id = ch.document_id
             WHERE ch.collection_id = %2$s%3$s
               AND (fd.watch_id IS NULL OR rag._row_visible(fd.watch_id, fd.source_key))
             ORDER BY ch.embedding::vector(%1$s) <=> $1::vector(%1$s)
             LIMIT $2)
        SELECT h.document_id, d.title, h.id, h.ordinal, h.content, h.distance, d.metadata, h.page,
               d.source, d.source_key
          FROM hits h JOIN rag.documents d ON d.id = h.document_id
         WHERE h.distance <= $3
         ORDER BY h.distance, h.id$q$,
        c.dimensions, c.id,
        CASE WHEN with_filter THEN ' AND fd.metadata @> $4' ELSE '' END)
$$;

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
    v_nearest double precision;
    v_count integer;
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = rag._collection_id(collection);
    IF query IS NULL OR btrim(query) = '' THEN
        RAISE EXCEPTION 'the query is empty' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass the question to search for.';
    END IF;
    IF k IS NULL OR k < 1 OR k > 1000 THEN
        RAISE EXCEPTION 'k must be between 1 and 1000, not %', coalesce(k::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'k is how many chunks to return.';
    END IF;
    IF filter IS NOT NULL AND jsonb_typeof(filter) <> 'object' THEN
        RAISE EXCEPTION 'filter must be a JSON object matched against document metadata'
            USING ERRCODE = 'invalid_parameter_value', HINT = 'For example ''{"department": "hr"}''.';
    END IF;
    IF c.dimensions IS NOT NULL THEN
        SELECT e.vector, e.prompt_tokens INTO v_vector, v_tokens FROM rag._embed_query_usage(c.id, query) e;
        v_embedded := clock_timestamp();
        -- A metadata filter and row visibility remove candidates after the index scan; iterative scans keep
        -- looking until k rows survive them (relaxed order: better recall; the outer query sorts by distance).
        PERFORM set_config('hnsw.iterative_scan', 'relaxed_order', true);
        IF filter IS NOT NULL THEN
            RETURN QUERY EXECUTE rag._search_sql(c, true)
                USING v_vector, k, coalesce(max_distance, c.max_distance), filter;
        ELSE
            RETURN QUERY EXECUTE rag._search_sql(c, false)
                USING v_vector, k, coalesce(max_distance, c.max_distance);
        END IF;
        GET DIAGNOSTICS v_count = ROW_COUNT;
    END IF;
    -- The ledger: one row per call, even when nothing was found.
    PERFORM rag._record_query(c.id, 'query', query, NULL, NULL, 'retrieved', NULL,
                              CASE WHEN coalesce(v_count, 0) = 0 THEN 'nothing within the distance ceiling' END,
                              NULL, coalesce(v_count, 0), '[]', 0, c.embedding_model, NULL, v_tokens, NULL, NULL, 0,
                              extract(epoch FROM v_embedded - v_started) * 1000,
                              extract(epoch FROM clock_timestamp() - v_embedded) * 1000, NULL,
                              extract(epoch FROM clock_timestamp() - v_started) * 1000);
END $$;

-- The plan rag_query runs for a collection, for DBAs checking that the HNSW index is used.
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
        USING rag._embed_query(c.id, query), k, c.max_distance
    LOOP
        -- The question's vector is noise in a plan; show where it goes instead.
        RETURN NEXT regexp_replace(v_line, '''\[[^]]*\]''::vector', '$1::vector', 'g');
    END LOOP;
END $$;
