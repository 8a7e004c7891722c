-- Run with pg_catalog first, then rag, and nothing else: schema.sql says why.
SET LOCAL search_path = pg_catalog, rag, pg_temp;

-- Retrieval. The question is embedded in Rust (rag._embed_query); the search itself is SQL, built with the
-- collection's id and dimension as literals so the planner can match the collection's partial HNSW index.

-- The one search of the extension. rag_query, rag_prompt and rag_ask (through rag._retrieve_context) all find
-- chunks through rag._search, and rag_explain shows the plan of the query rag._search_sql builds for it, so the
-- index expressions, row visibility, the metadata filter and the fusion are written once.
--
-- Two sides, each a ranked list of candidates of one collection:
--   vector:  nearest to the question's vector, through the collection's partial HNSW index;
--   keyword: the question's telling lexemes joined by OR (rag._keyword_query) against the chunks' tsvector,
--            through the collection's partial GIN index, ranked by ts_rank (term frequency, length-normalised).
--            OR, not AND: a question is worded differently from its answer, and requiring every term finds
--            nothing.
-- In mode 'hybrid' each side brings a pool of candidates (at least rag._limit('fusion_pool')) and they are
-- fused by reciprocal rank: score = 1 / (rrf_k + vector rank) + keyword_weight / (rrf_k + keyword rank), over the
-- sides that found the chunk; 'vector' and 'keyword' use one side. The keyword side weighs half: on the Debian
-- FAQ (scripts/eval) it is the weaker ranking alone, and at full weight it pulled good vector hits down. A chunk made from a row of a watched table is a candidate only while the caller
-- could SELECT that row (rag._row_visible); with a filter, only chunks of documents whose metadata contains it.
-- The vectors are the collection's searched column (vector_column): one model's, never two (rag.migrations).
-- Every candidate gets its vector distance (callers apply the distance ceiling in every mode, so a question
-- that shares a word with an unrelated chunk is still refused).
--
-- For a reranker (for_rerank), the fused list puts first what each side ranks best on its own: of the $5 returned,
-- the keyword side's best $5 / rag._limit('rerank_keyword_one_in') and the vector side's best of the rest, in
-- fused order, then the fused order fills the rest (src/limits.rs says why).
--
-- Parameters of the query: $1 the question's vector (text), $2 candidates per side, $3 the metadata filter,
-- $4 the question's lexemes (tsquery), $5 how many to return.
CREATE FUNCTION rag._search_sql(c rag.collections, p_mode text, with_filter boolean, with_vector boolean,
                                with_lexemes boolean, with_row_checks boolean DEFAULT true,
                                for_rerank boolean DEFAULT false) RETURNS text
LANGUAGE sql STABLE AS $$
    -- The vector side alone (vector mode, or hybrid for a question with no telling word): its own order,
    -- without the fusion's joins and window functions (then 1.11x the raw pgvector query at 100k chunks,
    -- the row-visibility join included: BENCHMARKS.md §3). Without a filter, and for a collection that
    -- watches no table (with_row_checks false, rag._watched), not even the join to rag.documents: the chunks'
    -- own policy is the collection's, the same as the documents', and only rows of watched tables need more.
    -- Planning the join was most of the search's cost over the raw query at a million chunks (BENCHMARKS.md
    -- §3). The query then returns nothing at all if the collection watches a table by the time it runs, in
    -- its own snapshot (a watch made since rag._watched looked): never a chunk without its row's check, and
    -- rag._search runs the checked query when it finds nothing. pgvector's schema is read once (vs).
    SELECT CASE WHEN with_vector AND p_mode <> 'keyword' AND (p_mode = 'vector' OR NOT with_lexemes) THEN format($v$
        SELECT v.chunk_id, v.document_id, v.ordinal, v.distance,
               (row_number() OVER (ORDER BY v.distance, v.chunk_id))::integer AS rank
          FROM (SELECT ch.id AS chunk_id, ch.document_id, ch.ordinal,
                       ch.%4$I::%7$s.vector(%1$s) OPERATOR(%7$s.<=>) $1::%7$s.vector(%1$s) AS distance
                  FROM rag.chunks ch%5$s
                 WHERE ch.collection_id = %2$s%3$s
                   AND %6$s
                 ORDER BY ch.%4$I::%7$s.vector(%1$s) OPERATOR(%7$s.<=>) $1::%7$s.vector(%1$s)
                 LIMIT $5) v
         ORDER BY rank$v$, c.dimensions, c.id, CASE WHEN with_filter THEN ' AND fd.metadata @> $3' ELSE '' END,
         c.vector_column,
         CASE WHEN with_filter OR with_row_checks THEN ' JOIN rag.documents fd ON fd.id = ch.document_id' ELSE '' END,
         CASE WHEN with_filter OR with_row_checks
              THEN format('(fd.watch_id IS NULL OR rag._row_visible(%s, fd.watch_id, fd.source_key))', c.id)
              ELSE format('NOT EXISTS (SELECT 1 FROM rag.watches w WHERE w.collection_id = %s)', c.id) END,
         pgvector.vs)
    ELSE format($q$
        WITH vector_side AS (%1$s),
             keyword_side AS (%2$s),
             ranked_vector AS (SELECT v.*, row_number() OVER (ORDER BY v.distance, v.chunk_id) AS r FROM vector_side v),
             ranked_keyword AS (SELECT k.*, row_number() OVER (ORDER BY k.score DESC, k.chunk_id) AS r FROM keyword_side k),
             fused AS (
                 SELECT coalesce(rv.chunk_id, rk.chunk_id) AS chunk_id, coalesce(rv.document_id, rk.document_id) AS document_id,
                        coalesce(rv.ordinal, rk.ordinal) AS ordinal, rv.distance, rv.r AS vector_rank, rk.r AS keyword_rank,
                        coalesce(1.0 / (%3$s + rv.r), 0) + %5$s * coalesce(1.0 / (%3$s + rk.r), 0) AS score
                   FROM ranked_vector rv FULL JOIN ranked_keyword rk ON rk.chunk_id = rv.chunk_id)
        SELECT f.chunk_id, f.document_id, f.ordinal, coalesce(f.distance, %4$s) AS distance,
               (row_number() OVER (ORDER BY %6$sf.score DESC, f.chunk_id))::integer AS rank
          FROM fused f
         ORDER BY %6$sf.score DESC, f.chunk_id
         LIMIT $5$q$,
        CASE WHEN with_vector AND p_mode <> 'keyword' THEN format($v$
            SELECT ch.id AS chunk_id, ch.document_id, ch.ordinal,
                   ch.%4$I::%5$s.vector(%1$s) OPERATOR(%5$s.<=>) $1::%5$s.vector(%1$s) AS distance
              FROM rag.chunks ch JOIN rag.documents fd ON fd.id = ch.document_id
             WHERE ch.collection_id = %2$s%3$s
               AND (fd.watch_id IS NULL OR rag._row_visible(%2$s, fd.watch_id, fd.source_key))
             ORDER BY ch.%4$I::%5$s.vector(%1$s) OPERATOR(%5$s.<=>) $1::%5$s.vector(%1$s)
             LIMIT $2$v$, c.dimensions, c.id, CASE WHEN with_filter THEN ' AND fd.metadata @> $3' ELSE '' END,
             c.vector_column, pgvector.vs)
        ELSE 'SELECT NULL::bigint AS chunk_id, NULL::bigint AS document_id, NULL::integer AS ordinal,
                     NULL::double precision AS distance WHERE false' END,
        -- In a collection that watches a table, every match is ranked first and the row check asked of them
        -- in rank order until $2 pass (OFFSET 0 keeps the check out of the ranking's scan): checked in the
        -- scan, it ran for every chunk holding any of the question's words, a few thousand checks where $2
        -- and the hidden share ask for a hundred (red team 25; scripts/bench-visibility).
        CASE WHEN with_lexemes AND p_mode <> 'vector' AND with_row_checks THEN format($k$
            SELECT k.chunk_id, k.document_id, k.ordinal, k.score
              FROM (SELECT ch.id AS chunk_id, ch.document_id, ch.ordinal, ts_rank(ch.tsv, $4, 1) AS score
                      FROM rag.chunks ch
                     WHERE ch.collection_id = %1$s AND ch.tsv @@ $4
                     ORDER BY score DESC, ch.id OFFSET 0) k
              JOIN rag.documents fd ON fd.id = k.document_id
             WHERE (fd.watch_id IS NULL OR rag._row_visible(%1$s, fd.watch_id, fd.source_key))%2$s
             ORDER BY k.score DESC, k.chunk_id
             LIMIT $2$k$, c.id, CASE WHEN with_filter THEN ' AND fd.metadata @> $3' ELSE '' END)
        WHEN with_lexemes AND p_mode <> 'vector' THEN format($k$
            SELECT ch.id AS chunk_id, ch.document_id, ch.ordinal, ts_rank(ch.tsv, $4, 1) AS score
              FROM rag.chunks ch JOIN rag.documents fd ON fd.id = ch.document_id
             WHERE ch.collection_id = %1$s AND ch.tsv @@ $4%2$s
               AND (fd.watch_id IS NULL OR rag._row_visible(%1$s, fd.watch_id, fd.source_key))
             ORDER BY score DESC, ch.id
             LIMIT $2$k$, c.id, CASE WHEN with_filter THEN ' AND fd.metadata @> $3' ELSE '' END)
        ELSE 'SELECT NULL::bigint AS chunk_id, NULL::bigint AS document_id, NULL::integer AS ordinal,
                     NULL::real AS score WHERE false' END,
        rag._limit('rrf_k'),
        CASE WHEN with_vector THEN format(
            '(SELECT dc.%2$I::%3$s.vector(%1$s) OPERATOR(%3$s.<=>) $1::%3$s.vector(%1$s) FROM rag.chunks dc '
            'WHERE dc.collection_id = %4$s AND dc.id = f.chunk_id)',
            c.dimensions, c.vector_column, pgvector.vs, c.id)
        ELSE 'NULL::double precision' END,
        rag._limit('keyword_weight'),
        CASE WHEN for_rerank
             THEN format('coalesce(f.keyword_rank <= $5 / %1$s OR f.vector_rank <= $5 - $5 / %1$s, false) DESC, ',
                         rag._limit('rerank_keyword_one_in'))
             ELSE '' END) END
      FROM (SELECT rag._vector_schema() AS vs) pgvector
$$;

-- Any of the lexemes, as one tsquery; NULL for none.
CREATE FUNCTION rag._any_lexeme(p_lexemes text[]) RETURNS tsquery
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    v_query tsquery;
    v_lexeme text;
BEGIN
    FOREACH v_lexeme IN ARRAY p_lexemes LOOP
        v_query := CASE WHEN v_query IS NULL THEN rag._lexeme_query(v_lexeme)
                        ELSE v_query || rag._lexeme_query(v_lexeme) END;
    END LOOP;
    RETURN v_query;
END $$;

-- One lexeme as a tsquery that matches exactly that lexeme. It is quoted for tsquery's input syntax (a quote
-- doubled, a backslash escaped), not re-parsed: a URL or file-path lexeme ('example.org/faq?id=7') would be cut
-- into a phrase of pieces that its chunk's tsvector holds at one position, and match nothing.
CREATE FUNCTION rag._lexeme_query(p_lexeme text) RETURNS tsquery
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT ('''' || replace(replace(p_lexeme, '\', '\\'), '''', '''''') || '''')::tsquery
$$;

-- The question's lexemes in the collection's configuration, joined by OR; NULL when it has none (only stop
-- words, say). The full-text side of a caller who may not read every row of a watched collection.
CREATE FUNCTION rag._or_query(p_config regconfig, p_text text) RETURNS tsquery
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT rag._any_lexeme(tsvector_to_array(to_tsvector(p_config, p_text)))
$$;

-- The lexemes of a question the full-text side searches for: the question's, less those that say nothing in
-- this collection. A lexeme found in no chunk is dropped, and so is one found in more than
-- rag._limit('keyword_max_share') of the collection's chunks (and in more than 10): like a stop word, it would
-- match most of the collection and outweigh the rare words that identify an answer ("debian" in the Debian FAQ).
-- Past rag._limit('keyword_match_budget') / that share chunks, the share falls so that a kept lexeme matches at
-- most the budget's chunks (down to rag._limit('lexeme_share_floor')).
-- The cost is bounded whatever the collection's size: its size is counted only up to the point where the share
-- bound passes rag._limit('keyword_count_cap'), and each lexeme's matches (the GIN index finds them; each is a row
-- read and rechecked) only up to that cap. Below that size every judgement is exact. Above it, a lexeme with more
-- matches than the cap is judged by its share measured on a sample (rag.lexeme_shares). A collection not measured
-- since it outgrew that size is judged exactly, at the old cost: counting every match up to a quarter of the
-- collection cost 0.25 to 0.7 s per question at 113,000 chunks.
-- Those counts and shares take in every chunk, watched rows the caller may not read included: a caller who does
-- not hold the collection whole (rag._collections_held_whole) gets every lexeme of the question instead, so that
-- what is kept (rag_explain shows it) and what is found do not tell them which words hidden rows hold, and
-- hidden rows cannot push a word the caller's own rows share out of their search.
CREATE FUNCTION rag._keyword_query(c rag.collections, p_question text) RETURNS tsquery
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_max_share double precision := rag._limit('keyword_max_share')::double precision;
    v_cap integer := rag._limit('keyword_count_cap')::integer;
    v_exact_chunks integer := rag._limit('keyword_exact_chunks')::integer;
    v_budget double precision := rag._limit('keyword_match_budget')::double precision;
    v_floor double precision := rag._limit('lexeme_share_floor')::double precision;
    v_documents bigint;
    v_chunks bigint;
    v_bound bigint;
    v_kept text[] := '{}';
    v_lexeme text;
    v_found bigint;
    v_share real;
    v_measured_chunks bigint;
    v_exact boolean;
BEGIN
    IF rag._watched(c) AND NOT c.id = ANY (rag._collections_held_whole(rag._calling_role())) THEN
        RETURN rag._or_query(c.text_search_config::regconfig, p_question);
    END IF;
    SELECT count(*), coalesce(sum(s.chunks_total), 0) INTO v_documents, v_chunks
      FROM (SELECT d.chunks_total FROM rag.documents d WHERE d.collection_id = c.id AND d.chunks_total > 0
             LIMIT v_exact_chunks + 1) s;
    v_exact := v_documents <= v_exact_chunks AND v_chunks <= v_exact_chunks;
    IF NOT v_exact THEN
        SELECT m.chunks INTO v_measured_chunks FROM rag.lexeme_measures m WHERE m.collection_id = c.id;
        IF coalesce(v_measured_chunks, 0) <= v_exact_chunks THEN
            -- Not measured since it outgrew the exact size: every word is counted up to its bound, as exactly (and
            -- as slowly) as before shares existed, until the idle worker measures it (within a minute).
            SELECT coalesce(sum(d.chunks_total), 0) INTO v_chunks FROM rag.documents d WHERE d.collection_id = c.id;
            v_exact := true;
        END IF;
    END IF;
    -- In a large collection the ceiling falls so that no word kept matches more than the budget's chunks (not
    -- below the least share measured): ranking tens of thousands of matches of a common word is what a hybrid
    -- search spent its time on at 100,000 chunks.
    v_max_share := greatest(least(v_max_share,
                                  v_budget / greatest(CASE WHEN v_exact THEN v_chunks ELSE v_measured_chunks END, 1)),
                            v_floor);
    IF v_exact THEN
        v_bound := greatest(ceil(v_chunks * v_max_share)::bigint, 10);
    END IF;
    FOREACH v_lexeme IN ARRAY tsvector_to_array(to_tsvector(c.text_search_config::regconfig, p_question)) LOOP
        EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM rag.chunks ch WHERE ch.collection_id = %s AND ch.tsv @@ $1 LIMIT $2) m',
                       c.id)
            INTO v_found USING rag._lexeme_query(v_lexeme), coalesce(v_bound, v_cap) + 1;
        IF v_found = 0 THEN
            CONTINUE;
        END IF;
        IF v_bound IS NOT NULL THEN
            IF v_found <= v_bound THEN
                v_kept := v_kept || v_lexeme;
            END IF;
        ELSIF v_found <= v_cap THEN
            v_kept := v_kept || v_lexeme;
        ELSE
            SELECT s.share INTO v_share FROM rag.lexeme_shares s WHERE s.collection_id = c.id AND s.lexeme = v_lexeme;
            IF v_share IS NULL OR v_share <= v_max_share THEN
                v_kept := v_kept || v_lexeme;
            END IF;
        END IF;
    END LOOP;
    RETURN rag._any_lexeme(v_kept);
END $$;

-- The collections due for a measure of their lexemes (rag._measure_lexemes): never measured, or measured over
-- rag._limit('lexeme_measure_interval') ago, or over rag._limit('lexeme_small_measure_interval') ago while it was
-- small; the longest due first.
CREATE FUNCTION rag._lexemes_due_list() RETURNS SETOF integer
LANGUAGE sql STABLE AS $$
    SELECT c.id FROM rag.collections c LEFT JOIN rag.lexeme_measures m ON m.collection_id = c.id
     WHERE m.collection_id IS NULL OR m.measured_at < now() - rag._limit('lexeme_measure_interval')::interval
           -- Measured while small enough to judge exactly: it may have outgrown that since, and until it is
           -- measured again its searches count every match.
           OR (m.chunks <= rag._limit('keyword_exact_chunks')::integer
               AND m.measured_at < now() - rag._limit('lexeme_small_measure_interval')::interval)
     ORDER BY m.measured_at NULLS FIRST, c.id
$$;

-- The first of them, NULL when none is due. The idle worker asks this, read-only, before it calls
-- rag._measure_lexemes.
CREATE FUNCTION rag._lexemes_due() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT d.id FROM rag._lexemes_due_list() d(id) LIMIT 1
$$;

-- Measures how common the lexemes of one collection are (rag.lexeme_shares): p_collection_id's, or else the
-- first that is due, never measured or measured over rag._limit('lexeme_measure_interval') ago. A collection whose
-- size changed by less than a tenth since only has its measure's time renewed; one small enough for
-- rag._keyword_query to judge exactly keeps no shares. At most rag._limit('lexeme_sample_chunks') chunks are read:
-- the chunks of every n-th document. The idle worker calls it; returns the collection measured, or NULL.
CREATE FUNCTION rag._measure_lexemes(p_collection_id integer DEFAULT NULL) RETURNS integer
-- Any other lock it needs is waited for at most 2 s (the worker measures when idle; another time will do).
LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
DECLARE
    v_id integer := p_collection_id;
    v_exact_chunks integer := rag._limit('keyword_exact_chunks')::integer;
    v_sample integer := rag._limit('lexeme_sample_chunks')::integer;
    v_chunks bigint;
    v_step bigint;
    v_query text;
    v_sampled bigint;
    v_sampled_by text;
BEGIN
    IF v_id IS NULL THEN
        -- The first due collection whose row is free: the oldest due alone, held by an admin's open change,
        -- kept every other collection from being measured for as long as it was held (red team 19).
        v_id := (SELECT d.id FROM rag._lexemes_due_list() d(id)
                  WHERE EXISTS (SELECT 1 FROM rag.collections c WHERE c.id = d.id FOR SHARE SKIP LOCKED)
                  LIMIT 1);
        IF v_id IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;
    -- The collection's row before rag.chunks, the order rag_drop_collection takes them (the row, then the
    -- collection's indexes, which lock rag.chunks): reading the chunks first and then waiting at the foreign key
    -- check of rag.lexeme_measures for a drop that held the row deadlocked with it, right after a load (whose end
    -- asks for a measure). SHARE: a drop or another change under way is skipped, an admin's uncommitted
    -- rag_set_search included (FOR NO KEY UPDATE, which KEY SHARE passes: the measure then waited, without end,
    -- for the index that change had dropped, and the worker with it).
    PERFORM 1 FROM rag.collections WHERE id = v_id FOR SHARE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- Whoever measures a collection holds its rag.lexeme_measures row (made first if it has none: '-infinity' is
    -- as due as no row), so that two workers do not measure it at once. Not an advisory lock: any role may take
    -- pg_advisory_lock on any key, and one that held this one kept every collection from being measured (the
    -- oldest due was always the one locked); locking these rows takes UPDATE on the table, which no role but
    -- rag's owner has. The idle worker skips a collection being measured; a caller naming one waits for it.
    -- Only when there is none: the insert would wait for a measure under way that has written its row.
    IF NOT EXISTS (SELECT 1 FROM rag.lexeme_measures WHERE collection_id = v_id) THEN
        INSERT INTO rag.lexeme_measures (collection_id, chunks, measured_at) VALUES (v_id, 0, '-infinity')
            ON CONFLICT (collection_id) DO NOTHING;
    END IF;
    IF p_collection_id IS NULL THEN
        PERFORM 1 FROM rag.lexeme_measures WHERE collection_id = v_id FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    ELSE
        PERFORM 1 FROM rag.lexeme_measures WHERE collection_id = v_id FOR UPDATE;
    END IF;
    SELECT coalesce(sum(d.chunks_total), 0) INTO v_chunks FROM rag.documents d WHERE d.collection_id = v_id;
    IF p_collection_id IS NULL AND EXISTS (
           SELECT 1 FROM rag.lexeme_measures m
            WHERE m.collection_id = v_id AND abs(m.chunks - v_chunks) * 10 < greatest(m.chunks, 1)) THEN
        UPDATE rag.lexeme_measures SET measured_at = now() WHERE collection_id = v_id;
        RETURN v_id;
    END IF;
    DELETE FROM rag.lexeme_shares WHERE collection_id = v_id;
    IF v_chunks > v_exact_chunks THEN
        v_step := greatest(ceil(v_chunks::double precision / v_sample)::bigint, 1);
        -- Documents by a hash of their id, so that no pattern of ids empties or skews the sample; when a few
        -- large documents leave it empty, chunks by a hash of theirs (every chunk row is read then).
        FOREACH v_sampled_by IN ARRAY ARRAY['d.id', 'ch.id'] LOOP
            v_query := format('SELECT ch.tsv FROM rag.documents d JOIN rag.chunks ch ON ch.document_id = d.id '
                              'WHERE d.collection_id = %1$s AND ch.collection_id = %1$s AND hashint8(%2$s) %% %3$s = 0 '
                              'AND ch.tsv IS NOT NULL',
                              v_id, v_sampled_by, v_step);
            EXECUTE format('SELECT count(*) FROM (%s) s', v_query) INTO v_sampled;
            EXIT WHEN v_sampled > 0;
        END LOOP;
        IF v_sampled > 0 THEN
            INSERT INTO rag.lexeme_shares (collection_id, lexeme, share)
            SELECT v_id, t.word, t.ndoc::real / v_sampled FROM ts_stat(v_query) t
             WHERE t.ndoc > v_sampled * rag._limit('lexeme_share_floor')::double precision;
        END IF;
    END IF;
    INSERT INTO rag.lexeme_measures AS m (collection_id, chunks, measured_at) VALUES (v_id, v_chunks, now())
        ON CONFLICT (collection_id) DO UPDATE SET chunks = EXCLUDED.chunks, measured_at = EXCLUDED.measured_at;
    RETURN v_id;
END $$;

-- Whether a search of the collection checks the rows of watched tables (rag._search_sql's with_row_checks):
-- only a collection that watches a table has chunks made from rows.
CREATE FUNCTION rag._watched(c rag.collections) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM rag.watches w WHERE w.collection_id = c.id)
$$;

-- rag._search_sql's query, built once per backend for what it is built from and kept there
-- (rag._kept_search_sql; forgotten when a function, type or schema changes): building it cost rag._search as
-- much as the rest of its own work (BENCHMARKS.md §3). Its arguments are rag._search_sql's.
CREATE FUNCTION rag._search_query(c rag.collections, p_mode text, with_filter boolean, with_vector boolean,
                                  with_lexemes boolean, with_row_checks boolean, for_rerank boolean) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_key text := concat_ws('|', c.id, c.dimensions, c.vector_column, p_mode, with_filter, with_vector,
                            with_lexemes, with_row_checks, for_rerank);
BEGIN
    RETURN coalesce(rag._kept_search_sql(v_key),
                    rag._keep_search_sql(v_key, rag._search_sql(c, p_mode, with_filter, with_vector, with_lexemes,
                                                                with_row_checks, for_rerank)));
END $$;

-- How much of the cosine similarity is added to a reranked candidate's relevance to order it (rag._search,
-- rag_explain): rag._limit('rerank_similarity_weight') for a reranker run in process, whose logits it was
-- measured on; 0 for a server's, whose scores are on its own scale (a probability would be swamped).
CREATE FUNCTION rag._rerank_similarity_weight(c rag.collections) RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN EXISTS (SELECT 1 FROM rag.providers p WHERE p.name = c.reranker_provider AND p.kind = 'local')
                THEN rag._limit('rerank_similarity_weight')::double precision ELSE 0 END
$$;

-- What a search adds to PostgreSQL's statistics is left out while it checks rows its caller may not see. A
-- reader who compared its own per-transaction counters around a search (pg_stat_xact_all_tables: one scan of
-- the watched table per candidate checked and one fetch from the collection's partition per full-text match,
-- hidden rows included), or its function counts under track_functions, or pg_stat_statements' calls and rows
-- under track = all, learnt exactly which words the rows hidden from it hold (red team 17). Only a caller who
-- does not hold a watched collection whole: everyone else's searches stay counted, so that a DBA still sees
-- rag's indexes used. Settings only a superuser may change; with an owner that is not one, the search is counted
-- as before. Returns what to put back (rag._restore_search_counts); NULL when nothing was changed.
CREATE FUNCTION rag._hide_search_counts(c rag.collections) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_saved text[];
BEGIN
    -- Called only for a watched collection (rag._search's v_row_checks, already looked up there).
    IF c.id = ANY (rag._collections_held_whole(rag._calling_role()))
       OR NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = current_user) THEN
        RETURN NULL;
    END IF;
    v_saved := ARRAY[current_setting('track_counts'), current_setting('track_functions'),
                     current_setting('pg_stat_statements.track', true)];
    PERFORM set_config('track_counts', 'off', true);
    PERFORM set_config('track_functions', 'none', true);
    IF v_saved[3] IS NOT NULL THEN
        PERFORM set_config('pg_stat_statements.track', 'top', true);
    END IF;
    RETURN v_saved;
END $$;

CREATE FUNCTION rag._restore_search_counts(p_saved text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_saved IS NOT NULL THEN
        PERFORM set_config('track_counts', p_saved[1], true);
        PERFORM set_config('track_functions', p_saved[2], true);
        IF p_saved[3] IS NOT NULL THEN
            PERFORM set_config('pg_stat_statements.track', p_saved[3], true);
        END IF;
    END IF;
END $$;

-- The search: the top p_k chunks for the question in p_mode (the collection's mode when NULL), best first.
-- A collection with a reranker has its best rerank_candidates (at least p_k) rescored by it (rag._rerank) and
-- ordered by that relevance (plus their weighted cosine similarity with a local reranker) instead; p_rerank => false skips that (the
-- evaluation compares both). The first chunk carries its lead: how far its combined score is above the second
-- candidate's, when it is also the nearest of all candidates by vector distance (two models agree on it); NULL
-- for every other chunk, and when there is no second candidate or no distance. rag._close_enough reads it.
CREATE FUNCTION rag._search(c rag.collections, p_vector text, p_k integer, p_filter jsonb DEFAULT NULL,
                            p_question text DEFAULT NULL, p_mode text DEFAULT NULL, p_rerank boolean DEFAULT true)
RETURNS TABLE (chunk_id bigint, document_id bigint, ordinal integer, distance double precision, rank integer,
               relevance real, lead real)
LANGUAGE plpgsql AS $$
DECLARE
    v_mode text := coalesce(p_mode, c.search_mode);
    v_lexemes tsquery;
    v_with_vector boolean := c.dimensions IS NOT NULL AND p_vector IS NOT NULL;
    v_rerank boolean := p_rerank AND c.reranker IS NOT NULL AND p_question IS NOT NULL;
    v_wanted integer := CASE WHEN v_rerank THEN greatest(p_k, c.rerank_candidates) ELSE p_k END;
    v_sql text;
    v_ids bigint[];
    v_distances double precision[];
    v_scores real[];
    v_ef_search text := current_setting('hnsw.ef_search', true);
    v_similarity_weight double precision := 0;
    v_row_checks boolean;
    v_checked_sql text;
    v_found bigint;
    v_pool integer;
    v_counts text[];
BEGIN
    IF v_mode NOT IN ('hybrid', 'vector', 'keyword') THEN
        RAISE EXCEPTION 'search mode must be hybrid, vector or keyword, not %', quote_literal(v_mode)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'hybrid fuses the vector and full-text rankings; the collection''s own mode is used when it is NULL.';
    END IF;
    IF v_mode <> 'vector' AND p_question IS NOT NULL THEN
        v_lexemes := rag._keyword_query(c, p_question);
    END IF;
    IF NOT v_with_vector AND v_lexemes IS NULL THEN
        RETURN;
    END IF;
    -- The filter and row visibility remove candidates after the index scan; an iterative scan keeps looking
    -- until enough rows survive them (relaxed order: better recall; the ranking re-sorts).
    PERFORM set_config('hnsw.iterative_scan', 'relaxed_order', true);
    -- The collection's ef_search for this search only: the caller's own setting is put back below.
    IF c.ef_search IS NOT NULL THEN
        PERFORM set_config('hnsw.ef_search', c.ef_search::text, true);
    END IF;
    v_row_checks := rag._watched(c);
    -- Put back with ef_search below (an error puts both back with the transaction or its savepoint).
    v_counts := CASE WHEN v_row_checks THEN rag._hide_search_counts(c) END;
    -- Candidates per side: a hybrid search fuses pools of at least fusion_pool.
    v_pool := CASE WHEN v_mode = 'hybrid' THEN greatest(v_wanted, rag._limit('fusion_pool')::integer) ELSE v_wanted END;
    v_sql := rag._search_query(c, v_mode, p_filter IS NOT NULL, v_with_vector, v_lexemes IS NOT NULL, v_row_checks,
                               v_rerank);
    -- The query runs with its plan kept for the session (rag._search_rows): planning it again on every call
    -- cost as much as a third of running it.
    IF NOT v_rerank THEN
        RETURN QUERY SELECT s.*, NULL::real, NULL::real
                       FROM rag._search_rows(v_sql, p_vector, v_pool, p_filter::text, v_lexemes::text, p_k) s
                      ORDER BY s.rank;
        GET DIAGNOSTICS v_found = ROW_COUNT;
        -- Nothing found without the row checks (see rag._search_sql): also what a watch made after
        -- rag._watched looked gives, so the checked search runs; it is the same search when checks were on.
        IF v_found = 0 AND NOT v_row_checks THEN
            v_checked_sql := rag._search_query(c, v_mode, p_filter IS NOT NULL, v_with_vector, v_lexemes IS NOT NULL,
                                               true, false);
            IF v_checked_sql <> v_sql THEN
                RETURN QUERY SELECT s.*, NULL::real, NULL::real
                               FROM rag._search_rows(v_checked_sql, p_vector, v_pool, p_filter::text, v_lexemes::text,
                                                     p_k) s
                              ORDER BY s.rank;
            END IF;
        END IF;
        IF c.ef_search IS NOT NULL AND v_ef_search IS NOT NULL THEN
            PERFORM set_config('hnsw.ef_search', v_ef_search, true);
        END IF;
        PERFORM rag._restore_search_counts(v_counts);
        RETURN;
    END IF;
    SELECT array_agg(s.chunk_id ORDER BY s.rank), array_agg(s.distance ORDER BY s.rank) INTO v_ids, v_distances
      FROM rag._search_rows(v_sql, p_vector, v_pool, p_filter::text, v_lexemes::text, v_wanted) s;
    IF v_ids IS NULL AND NOT v_row_checks THEN
        v_checked_sql := rag._search_query(c, v_mode, p_filter IS NOT NULL, v_with_vector, v_lexemes IS NOT NULL,
                                           true, true);
        IF v_checked_sql <> v_sql THEN
            SELECT array_agg(s.chunk_id ORDER BY s.rank), array_agg(s.distance ORDER BY s.rank)
              INTO v_ids, v_distances
              FROM rag._search_rows(v_checked_sql, p_vector, v_pool, p_filter::text, v_lexemes::text, v_wanted) s;
        END IF;
    END IF;
    IF c.ef_search IS NOT NULL AND v_ef_search IS NOT NULL THEN
        PERFORM set_config('hnsw.ef_search', v_ef_search, true);
    END IF;
    PERFORM rag._restore_search_counts(v_counts);
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    v_similarity_weight := rag._rerank_similarity_weight(c);
    -- The candidates' texts in rank order, each behind its header as it was embedded; they passed the search's
    -- visibility checks above.
    v_scores := rag._rerank(c.id, p_question,
                            ARRAY(SELECT rag._with_header(ch.header, ch.content) FROM unnest(v_ids) WITH ORDINALITY u(id, n)
                                    JOIN rag.chunks ch ON ch.collection_id = c.id AND ch.id = u.id ORDER BY u.n));
    -- The order is the cross-encoder's logit plus the bi-encoder's cosine similarity, weighted
    -- (rag._limit('rerank_similarity_weight'), local rerankers only): where the cross-encoder, trained on web
    -- search queries, is unsure between passages or misreads a paraphrase, the embedding's agreement decides
    -- (BENCHMARKS.md §5). A candidate without a distance (keyword mode) gets no share of it.
    -- The lead is the difference of two scores that are each a finite real, which need not be one itself
    -- (3.4e38 and -3.4e38 from a server's reranker made every search of the collection fail with "value out of
    -- range": red team 20): it is held within real's range, where any lead passes any threshold anyway.
    RETURN QUERY
    SELECT r.id, ch.document_id, ch.ordinal, r.distance, r.place::integer, r.score,
           (CASE WHEN r.place = 1 AND r.distance <= r.nearest
                 THEN least(greatest(r.combined - r.runner_up, -3.4e38), 3.4e38) END)::real
      FROM (SELECT b.*,
                   row_number() OVER (ORDER BY b.combined DESC, b.n) AS place,
                   lead(b.combined) OVER (ORDER BY b.combined DESC, b.n) AS runner_up,
                   min(b.distance) OVER () AS nearest
              FROM (SELECT u.id, u.distance, u.score, u.n,
                           u.score + v_similarity_weight * (1 - coalesce(u.distance, 1)) AS combined
                      FROM unnest(v_ids, v_distances, v_scores) WITH ORDINALITY u(id, distance, score, n)) b) r
      JOIN rag.chunks ch ON ch.collection_id = c.id AND ch.id = r.id
     ORDER BY r.place
     LIMIT p_k;
END $$;

-- Whether a found chunk is close enough to be returned or answered from: the refusal threshold, decided here
-- only. A reranked chunk passes on its relevance (the cross-encoder's logit, comparable across questions,
-- which one distance is not for a bi-encoder), or, as the reranker's first, on its lead (rag._search): ahead of
-- the second candidate by at least the collection's min_lead (0: never), and either no more than min_lead
-- below min_relevance or within the collection's own distance ceiling (the bi-encoder's threshold, per
-- model: what the collection would answer from without a reranker) and the one measured for its model
-- (rag_known_models(); none for a model not measured there): a ceiling an owner loosened to turn the distance
-- refusal off does not let a first chunk through at any relevance. A question about nothing in the
-- collection scores every candidate alike at the model's floor, so a chunk that stands out of its candidates
-- and is also the bi-encoder's nearest is what a paraphrase looks like; the cross-encoder alone may still score
-- such a paraphrase at its floor when the wording differs enough (BENCHMARKS.md §5). The caller's
-- max_distance, when given, applies as well. A chunk that was not reranked passes on its distance, under the
-- caller's ceiling or else the collection's.
CREATE FUNCTION rag._close_enough(c rag.collections, p_distance double precision, p_relevance real, p_lead real,
                                  p_max_distance double precision) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_relevance IS NOT NULL
                THEN (p_relevance >= c.min_relevance
                      OR coalesce(c.min_lead > 0 AND p_lead >= c.min_lead
                                  AND (p_relevance >= c.min_relevance - c.min_lead
                                       OR (p_distance <= c.max_distance
                                           AND p_distance <= rag._model_max_distance(c.embedding_model))),
                                  false))
                     AND (p_max_distance IS NULL OR p_distance <= p_max_distance)
                ELSE p_distance <= coalesce(p_max_distance, c.max_distance) END
$$;

CREATE FUNCTION @extschema@.rag_query(
    collection   text,
    query        text,
    k            integer DEFAULT 5,
    max_distance double precision DEFAULT NULL,
    filter       jsonb DEFAULT NULL,
    mode         text DEFAULT NULL
) RETURNS TABLE (document_id bigint, title text, chunk_id bigint, ordinal integer, content text,
                 distance double precision, metadata jsonb, page integer, source text, source_key jsonb,
                 relevance real)
-- SECURITY DEFINER, like rag_ask and rag_prompt: the collection's read privilege is checked first, and the
-- search checks every candidate made from a watched row by key as the caller (rag._row_visible), which the
-- policies on rag.documents and rag.chunks (watch.sql) do not do for a table the caller may read only in part.
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    c rag.collections;
    v_vector text;
    v_tokens bigint;
    v_started timestamptz := clock_timestamp();
    v_embedded timestamptz;
    v_count integer;
    v_nearest double precision;
    v_best real;
    v_ids bigint[];
    v_distances double precision[];
    v_relevances real[]; v_counts text[];
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = rag._collection_id(collection);
    PERFORM rag._require_search_request(query, k);
    PERFORM rag._require_max_distance(max_distance);
    IF filter IS NOT NULL AND jsonb_typeof(filter) <> 'object' THEN
        RAISE EXCEPTION 'filter must be a JSON object matched against document metadata'
            USING ERRCODE = 'invalid_parameter_value', HINT = 'For example ''{"department": "hr"}''.';
    END IF;
    -- Bounded as the metadata it is matched against: jsonb's containment test checks no interrupt, and a filter of
    -- a million array elements held a search for 77 s after its cancel (red team 22).
    IF octet_length(filter::text) > rag._limit('document_metadata_max_bytes')::integer THEN
        RAISE EXCEPTION 'filter is % bytes as JSON text; at most % are allowed', octet_length(filter::text),
                        rag._limit('document_metadata_max_bytes')
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'A filter names the metadata a document must have, which is itself at most that long.';
    END IF;
    IF c.dimensions IS NOT NULL THEN
        -- Embedded for the model of the row read above, whose vector column the search reads: a switch to
        -- another model between two reads would compare one model's question with the other's vectors.
        SELECT e.vector, e.prompt_tokens INTO v_vector, v_tokens
          FROM rag._embed_query_in(c.id, query, c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e;
        v_embedded := clock_timestamp();
        -- Every candidate counts for the ledger's nearest distance and best relevance, returned or not; the
        -- ones that pass the threshold are returned in the search's order, read in one query.
        SELECT min(f.distance), max(f.relevance),
               array_agg(f.chunk_id ORDER BY f.rank) FILTER (WHERE f.close),
               array_agg(f.distance ORDER BY f.rank) FILTER (WHERE f.close),
               array_agg(f.relevance ORDER BY f.rank) FILTER (WHERE f.close)
          INTO v_nearest, v_best, v_ids, v_distances, v_relevances
          FROM (SELECT s.*, rag._close_enough(c, s.distance, s.relevance, s.lead, max_distance) AS close
                  FROM rag._search(c, v_vector, k, filter, query, mode) s) f;
        -- Read only when something passed, and uncounted like the search (rag._hide_search_counts): once its
        -- plan was the session's generic one, reading no ids still scanned the collection's partition, so a
        -- reader's counters moved for a word no row holds and not for one only hidden rows hold (red team 17's
        -- test, once the tables were analyzed first); and a scan would count every chunk, hidden ones too.
        IF v_ids IS NOT NULL THEN
            v_counts := CASE WHEN rag._watched(c) THEN rag._hide_search_counts(c) END;
            RETURN QUERY
            SELECT d.id, d.title, ch.id, ch.ordinal, ch.content, u.distance, d.metadata, ch.page, d.source,
                   d.source_key, u.relevance
              FROM unnest(v_ids, v_distances, v_relevances) WITH ORDINALITY u(chunk_id, distance, relevance, n)
              JOIN rag.chunks ch ON ch.collection_id = c.id AND ch.id = u.chunk_id
              JOIN rag.documents d ON d.id = ch.document_id
             ORDER BY u.n;
            PERFORM rag._restore_search_counts(v_counts);
        END IF;
        v_count := coalesce(cardinality(v_ids), 0);
    END IF;
    -- The ledger: one row per call, even when nothing was found.
    PERFORM rag._record_query(
        p_collection_id => c.id, p_kind => 'query', p_question => query, p_outcome => 'retrieved',
        p_reason => CASE WHEN coalesce(v_count, 0) = 0 THEN
                        CASE WHEN v_best IS NOT NULL THEN 'nothing relevant enough (reranker)'
                             ELSE 'nothing within the distance ceiling' END END,
        p_nearest => v_nearest, p_best_relevance => v_best,
        p_sources_sent => coalesce(v_count, 0), p_citations => '[]', p_citations_stripped => 0,
        p_embedding_model => c.embedding_model, p_embed_tokens => v_tokens, p_chat_calls => 0,
        p_watches_ended => c.watches_ended,
        p_embed_ms => extract(epoch FROM v_embedded - v_started) * 1000,
        p_search_ms => extract(epoch FROM clock_timestamp() - v_embedded) * 1000,
        p_latency_ms => extract(epoch FROM clock_timestamp() - v_started) * 1000);
END $$;

-- Raises unless a search's question and k are ones rag_query and rag_explain take: a question of at most
-- rag._limit('question_max_bytes') (rag_prompt and rag_ask check the same limit in Rust), k within the search's
-- limits.
CREATE FUNCTION rag._require_search_request(p_query text, p_k integer) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_query IS NULL OR NOT rag._has_text(p_query) THEN
        RAISE EXCEPTION 'the query is empty' USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Pass the question to search for.';
    END IF;
    IF octet_length(p_query) > rag._limit('question_max_bytes')::integer THEN
        RAISE EXCEPTION 'the query is % bytes; at most % are allowed', octet_length(p_query), rag._limit('question_max_bytes')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Search with a question; to work with a long text, ingest it and ask about it.';
    END IF;
    IF p_k IS NULL OR p_k NOT BETWEEN rag._limit('search_k_min')::integer AND rag._limit('search_k_max')::integer THEN
        RAISE EXCEPTION 'k must be between % and %, not %', rag._limit('search_k_min'), rag._limit('search_k_max'),
                        coalesce(p_k::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'k is how many chunks the search returns.';
    END IF;
END $$;

-- Raises unless a caller's distance ceiling is one (rag_query's, rag_ask's and rag_prompt's max_distance): NaN
-- passed every distance, as no ceiling at all, where rag_create_collection refuses it (red team 20), and a
-- negative one could never pass. Any ceiling from 2 up is no ceiling, which callers ask for on purpose.
CREATE FUNCTION rag._require_max_distance(p_max_distance double precision) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_max_distance = 'NaN' OR p_max_distance < 0 THEN
        RAISE EXCEPTION 'max_distance must be a cosine distance of 0 or more, not %', p_max_distance
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL keeps the collection''s ceiling; 2 or more lets every distance through.';
    END IF;
END $$;

-- The plan of the search (rag._search) for a collection and question, for DBAs checking that the collection's
-- HNSW and GIN indexes are used.
-- SECURITY DEFINER as rag_query is, so that the plan shown is the one the search runs: as the extension's
-- owner, without the row-level security a reader's own query of rag.chunks would add.
CREATE FUNCTION @extschema@.rag_explain(collection text, query text DEFAULT 'explain', k integer DEFAULT 5,
                            mode text DEFAULT NULL)
RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    c rag.collections;
    v_line text;
    v_mode text;
    v_lexemes tsquery;
    v_keyword_slots integer;
    v_vector_schema text := rag._vector_schema();
    v_failed rag.upkeep_failures;
BEGIN
    SELECT * INTO c FROM rag.collections WHERE id = rag._collection_id(collection);
    PERFORM rag._require_search_request(query, k);
    IF c.dimensions IS NULL THEN
        RAISE EXCEPTION 'collection "%" has no vectors yet', collection
            USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Ingest a document and wait for it.';
    END IF;
    v_mode := coalesce(mode, c.search_mode);
    IF v_mode <> 'vector' THEN
        v_lexemes := rag._keyword_query(c, query);
    END IF;
    -- A build that fails is the reason, not a load (rag.status shows the same row as upkeep_error).
    SELECT * INTO v_failed FROM rag.upkeep_failures f WHERE f.collection_id = c.id AND f.step = 'index build';
    IF c.index_name IS NULL AND v_mode <> 'keyword' AND v_failed.collection_id IS NOT NULL THEN
        RETURN NEXT format('Vector side: exact search: building its HNSW index failed %s time(s) in a row (%s); the workers try again at %s, and rag_retry_upkeep(%L) tries at once once the cause is mended',
                           v_failed.failures, v_failed.last_error, v_failed.next_try, c.name);
    ELSIF c.index_name IS NULL AND v_mode <> 'keyword' THEN
        RETURN NEXT CASE WHEN c.dimensions > 2000
                         THEN format('Vector side: exact search (%s dimensions is above HNSW''s 2000)', c.dimensions)
                         ELSE format('Vector side: exact search: no HNSW index now (a bulk load builds it when fewer than %s of the collection''s documents are waiting, or, once %s are ready or waiting, when fewer than %s are due, after they are ready; rag.status shows them; without the workers, rag_process_queue builds it, also after rag_set_search changed its build parameters)',
                                     rag._limit('bulk_load_documents'), rag._limit('bulk_load_documents'),
                                     rag._limit('bulk_load_tail_documents')) END;
    ELSIF v_mode <> 'keyword' AND to_regclass(format('rag.%I', c.index_name)) IS NULL THEN
        -- The worker never builds a recorded index itself (rag._collections_missing_indexes says why).
        RETURN NEXT format('Vector side: exact search: its HNSW index rag.%s is missing (dropped, or left out of a restore); rag_reindex(%L) has the worker build it again',
                           c.index_name, c.name);
    ELSIF v_mode <> 'keyword' AND NOT rag._hnsw_index_current(c, c.index_name) THEN
        RETURN NEXT format('Vector side: HNSW index rag.%s, built with other build parameters than the collection now asks for (m %s, ef_construction %s): the worker builds its successor beside it, and searches use this one until then',
                           c.index_name, coalesce(c.hnsw_m::text, 'default'), coalesce(c.hnsw_ef_construction::text, 'default'));
    END IF;
    IF c.reranker IS NOT NULL THEN
        -- The search reranks at least the collection's candidates (rag._search's v_wanted).
        k := greatest(k, c.rerank_candidates);
        v_keyword_slots := k / rag._limit('rerank_keyword_one_in')::integer;
        RETURN NEXT format('Rerank: the best %s candidates of the plan below%s, by %s on provider %s (rag._rerank), ordered by %s',
                           k,
                           CASE WHEN v_mode = 'hybrid' AND v_lexemes IS NOT NULL
                                THEN format(' (first the keyword side''s best %s and the vector side''s best %s, then by fusion)',
                                            v_keyword_slots, k - v_keyword_slots)
                                ELSE '' END,
                           c.reranker, c.reranker_provider,
                           coalesce('its relevance + ' || nullif(rag._rerank_similarity_weight(c), 0)
                                    || ' x cosine similarity', 'its relevance'));
    END IF;
    FOR v_line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || rag._search_sql(c, v_mode, false, true, v_lexemes IS NOT NULL,
                                                                    rag._watched(c), c.reranker IS NOT NULL)
        -- The plan does not depend on the question's vector (it is shown as $1 below), so none is asked of the
        -- provider: an explain spends no provider call, which the ledger would not record.
        USING '[1' || repeat(',0', c.dimensions - 1) || ']',
              CASE WHEN v_mode = 'hybrid' THEN greatest(k, rag._limit('fusion_pool')::integer) ELSE k END,
              NULL::jsonb, v_lexemes, k
    LOOP
        -- pgvector's type and operator are named with their schema in rag's queries (off the search_path
        -- rag runs with), and the question's vector is noise in a plan: show where it goes instead.
        v_line := replace(replace(v_line, 'OPERATOR(' || v_vector_schema || '.<=>)', '<=>'),
                          v_vector_schema || '.vector', 'vector');
        RETURN NEXT regexp_replace(v_line, '''\[[^]]*\]''::vector', '$1::vector', 'g');
    END LOOP;
END $$;

-- The extension's schema again, where pgrx creates the Rust functions declared after this file.
SET LOCAL search_path = @extschema@, pg_temp;
