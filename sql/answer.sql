-- Run with pg_catalog first, then rag, and nothing else: schema.sql says why.
SET LOCAL search_path = pg_catalog, rag, pg_temp;

-- Answering and its ledger. Every rag_query and rag_ask leaves one row in rag.queries, answered, refused or
-- failed, with the provider's own token counts and the price in force when it ran. The tables are in
-- schema.sql with all the others.

-- Prices are the database's, not a collection's: every collection's ledger costs, past ones included (a
-- backdated price), are computed from them, so a superuser sets them, as a superuser decides where keys go.
CREATE FUNCTION @extschema@.rag_set_price(model text, input_usd_per_million numeric, output_usd_per_million numeric DEFAULT 0,
                              valid_from timestamptz DEFAULT now())
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM rag._require_writable('rag_set_price');
    IF NOT rag._caller_is_superuser() THEN
        RAISE EXCEPTION 'only a superuser may set prices' USING ERRCODE = 'insufficient_privilege',
            HINT = 'Prices apply to the ledger of every collection; ask a superuser to run rag_set_price.';
    END IF;
    INSERT INTO rag.prices AS p (model, input_usd_per_million, output_usd_per_million, valid_from)
    VALUES (rag_set_price.model, rag_set_price.input_usd_per_million, rag_set_price.output_usd_per_million,
            rag_set_price.valid_from)
    ON CONFLICT ON CONSTRAINT prices_pkey DO UPDATE
       SET input_usd_per_million = EXCLUDED.input_usd_per_million,
           output_usd_per_million = EXCLUDED.output_usd_per_million;
END $$;

CREATE FUNCTION rag._price_in_force(p_model text) RETURNS rag.prices
LANGUAGE sql STABLE AS $$
    SELECT * FROM rag.prices p WHERE p.model = p_model AND p.valid_from <= now()
     ORDER BY p.valid_from DESC LIMIT 1
$$;

-- What a call cost: the provider-reported usage at the prices in force now (a model without a price costs 0).
CREATE FUNCTION rag._query_cost(p_embedding_model text, p_chat_model text, p_embed_tokens bigint,
                                p_prompt_tokens bigint, p_completion_tokens bigint) RETURNS numeric
LANGUAGE sql STABLE AS $$
    SELECT trim_scale(
             coalesce(p_embed_tokens, 0) * coalesce((rag._price_in_force(p_embedding_model)).input_usd_per_million, 0) / 1000000
           + coalesce(p_prompt_tokens, 0) * coalesce((rag._price_in_force(p_chat_model)).input_usd_per_million, 0) / 1000000
           + coalesce(p_completion_tokens, 0) * coalesce((rag._price_in_force(p_chat_model)).output_usd_per_million, 0) / 1000000)
$$;

-- A text of a ledger row as its `rag ledger:` line carries it: whole up to rag._limit('ledger_log_text_max_chars')
-- characters, else that much, with its length and SHA-256 beside it (`question_chars`, `question_sha256`) to
-- match it against a text kept elsewhere. The line is all a standby keeps of a call, but the server log has no
-- retention: a reader's loop of 32 kB questions grew it by 32 kB a call (red team 19). Empty for NULL.
CREATE FUNCTION rag._log_text(p_key text, p_text text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_text IS NULL THEN '{}'::jsonb
        WHEN length(p_text) <= rag._limit('ledger_log_text_max_chars')::integer THEN jsonb_build_object(p_key, p_text)
        ELSE jsonb_build_object(p_key, left(p_text, rag._limit('ledger_log_text_max_chars')::integer),
                                p_key || '_chars', length(p_text),
                                p_key || '_sha256', encode(sha256(convert_to(p_text, 'UTF8')), 'hex'))
    END
$$;

-- Writes one ledger row and returns its id: the only writer of rag.queries, called with named arguments (only
-- the first four are required). The cost is computed here, from the provider-reported usage and the price rows
-- in force, which are stored beside it. The role is the caller's, not the definer's.
CREATE FUNCTION rag._record_query(
    p_collection_id integer, p_kind text, p_question text, p_outcome text,
    p_rewritten text DEFAULT NULL, p_conversation_id bigint DEFAULT NULL, p_answer text DEFAULT NULL,
    p_reason text DEFAULT NULL, p_nearest double precision DEFAULT NULL, p_sources_sent integer DEFAULT 0,
    p_citations jsonb DEFAULT '[]', p_citations_stripped integer DEFAULT 0, p_embedding_model text DEFAULT NULL,
    p_chat_model text DEFAULT NULL, p_embed_tokens bigint DEFAULT NULL, p_prompt_tokens bigint DEFAULT NULL,
    p_completion_tokens bigint DEFAULT NULL, p_chat_calls integer DEFAULT 0,
    p_embed_ms double precision DEFAULT NULL, p_search_ms double precision DEFAULT NULL,
    p_generate_ms double precision DEFAULT NULL, p_latency_ms double precision DEFAULT NULL,
    p_best_relevance real DEFAULT NULL, p_watches_ended integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_embed_price rag.prices := rag._price_in_force(p_embedding_model);
    v_chat_price rag.prices := rag._price_in_force(p_chat_model);
    v_cost numeric := 0;
    v_id bigint;
    v_role name := rag._calling_role();
    v_line jsonb;
    v_conversation_gone boolean := false;
BEGIN
    -- Only rag's own functions call this (rag_query and rag_ask, SECURITY DEFINER both; no role is
    -- granted it), each after its own checks; checked again here, for the role the row is written for.
    PERFORM rag._require_privilege(p_collection_id, 'read');
    v_cost := rag._query_cost(p_embedding_model, p_chat_model, p_embed_tokens, p_prompt_tokens, p_completion_tokens);
    -- The columns of rag.queries as one line of JSON: what a hot standby logs instead of writing the row, and
    -- what the server log gets if the row is rolled back (src/api/ledger_trail.rs).
    v_line := jsonb_strip_nulls(jsonb_build_object(
        'created_at', now(), 'collection', (SELECT c.name FROM rag.collections c WHERE c.id = p_collection_id),
        'kind', p_kind, 'outcome', p_outcome, 'nearest_distance', p_nearest, 'best_relevance', p_best_relevance,
        'sources_sent', p_sources_sent,
        'citations', p_citations, 'citations_stripped', p_citations_stripped, 'embedding_model', p_embedding_model,
        'chat_model', p_chat_model, 'embed_tokens', p_embed_tokens, 'prompt_tokens', p_prompt_tokens,
        'completion_tokens', p_completion_tokens, 'chat_calls', p_chat_calls, 'embed_ms', p_embed_ms,
        'search_ms', p_search_ms, 'generate_ms', p_generate_ms, 'latency_ms', p_latency_ms, 'cost_usd', v_cost,
        'role', v_role))
        || rag._log_text('question', p_question) || rag._log_text('rewritten_question', p_rewritten)
        || rag._log_text('answer', p_answer) || rag._log_text('reason', p_reason);
    IF pg_catalog.pg_is_in_recovery() OR pg_catalog.current_setting('transaction_read_only')::boolean THEN
        -- A hot standby, or a read-only transaction, cannot write the ledger. The call is recorded in the
        -- server log instead, one line of JSON per call with the columns of rag.queries (README,
        -- "Operations"), so an operator can read what was answered; the caller gets NULL as its query_id.
        RAISE LOG 'rag ledger: %', v_line;
        PERFORM rag._ledger_row_written(NULL);
        RETURN NULL;
    END IF;
    -- Its admin (or its owner, elsewhere) may delete the conversation while the chat model answers. Held from
    -- here (KEY SHARE, what the key's check takes) so that it cannot go between this look and the messages
    -- written after the row.
    IF p_conversation_id IS NOT NULL THEN
        PERFORM 1 FROM rag.conversations v WHERE v.id = p_conversation_id FOR KEY SHARE;
        v_conversation_gone := NOT FOUND;
    END IF;
    INSERT INTO rag.queries (collection_id, collection, kind, question, rewritten_question, conversation_id, outcome,
                             answer, reason, nearest_distance, best_relevance, sources_sent, citations,
                             citations_kept, citations_stripped, embedding_model, chat_model, embed_tokens,
                             prompt_tokens, completion_tokens, chat_calls, embed_ms, search_ms, generate_ms,
                             latency_ms, cost_usd, prices, role, role_id, watches_ended)
    SELECT c.id, coalesce(c.name, format('collection %s, dropped during the call', p_collection_id)), p_kind,
           p_question, p_rewritten, CASE WHEN NOT v_conversation_gone THEN p_conversation_id END, p_outcome,
           p_answer, p_reason, p_nearest, p_best_relevance, coalesce(p_sources_sent, 0), coalesce(p_citations, '[]'),
           jsonb_array_length(coalesce(p_citations, '[]')), coalesce(p_citations_stripped, 0),
           p_embedding_model, p_chat_model, p_embed_tokens, p_prompt_tokens, p_completion_tokens,
           coalesce(p_chat_calls, 0), p_embed_ms, p_search_ms, p_generate_ms, p_latency_ms, v_cost,
           jsonb_strip_nulls(jsonb_build_object(
               'embedding', CASE WHEN v_embed_price.model IS NOT NULL THEN to_jsonb(v_embed_price) END,
               'chat', CASE WHEN v_chat_price.model IS NOT NULL THEN to_jsonb(v_chat_price) END)),
           v_role, rag._lock_role((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = v_role))::regrole,
           -- As read before the search (rag.collections.watches_ended); a caller that did not say is taken to
           -- predate every count, so admins are not shown the row. In a conversation, the conversation's if
           -- lower: the question is rewritten and answered from its history, which may quote what is hidden.
           least(coalesce(p_watches_ended, -1),
                 (SELECT v.watches_ended FROM rag.conversations v WHERE v.id = p_conversation_id))
      -- A collection dropped while the call ran (rag_drop_collection does not wait for its searches) leaves the
      -- row without its id, as the drop leaves its earlier rows, and with its id in place of its name: the call
      -- is recorded all the same.
      FROM (SELECT) AS call LEFT JOIN rag.collections c ON c.id = p_collection_id
    RETURNING id INTO v_id;
    PERFORM rag._ledger_row_written((v_line || jsonb_build_object('query_id', v_id, 'rolled_back', true))::text);
    IF v_conversation_gone THEN
        -- Said so, rather than with the foreign key's own error; the row written above goes with the call's
        -- transaction, and so to the server log as a rolled-back line.
        RAISE EXCEPTION 'conversation % was deleted while its question was being answered', p_conversation_id
            USING ERRCODE = 'undefined_object',
                  HINT = 'Start another with rag_conversation_start(); the call is in the server log as a rolled-back ledger line.';
    END IF;
    RETURN v_id;
END $$;

-- The anchors (the top k chunks from rag._search in the collection's mode, reranked when the collection
-- reranks, whatever their distance or relevance, so the ledger knows the nearest and the best) and, for the
-- anchors that pass rag._close_enough, their neighbours (ordinal ±1) in one more join. `close` marks those
-- anchors; `rank` is the anchor's place in the search's order (a neighbour has its anchor's), which is the order
-- the sources are sent in. p_max_distance is the caller's ceiling (NULL: the collection's rule).
-- The question's vector was embedded in one space (p_provider, p_model, p_prefix, p_dimensions: the collection's
-- row as the embedding read it). If the collection has switched to another model since, nothing is found, and
-- the caller (src/api/ask.rs) embeds the question again: never one model's question against another's vectors.
CREATE FUNCTION rag._retrieve_context(p_collection_id integer, p_provider text, p_model text, p_prefix text,
                                      p_dimensions integer, p_vector text, p_k integer,
                                      p_max_distance double precision, p_question text)
RETURNS TABLE (chunk_id bigint, document_id bigint, title text, ordinal integer, char_start integer,
               char_end integer, content text, distance double precision, anchor_chunk_id bigint, locator text,
               relevance real, rank integer, close boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_counts text[];
BEGIN
    -- The looks into rag.chunks around the search are left out of the statistics as the search is
    -- (rag._hide_search_counts): run after it, they would count its partition's rows, hidden ones too. The
    -- search's own restore puts back the setting found, which is this one's.
    SELECT CASE WHEN rag._watched(c) THEN rag._hide_search_counts(c) END INTO v_counts
      FROM rag.collections c WHERE c.id = p_collection_id;
    -- PL/pgSQL, so that each look into rag.chunks is planned knowing the collection, over its partition alone
    -- (a SQL function's query is planned without its arguments' values).
    RETURN QUERY
    WITH anchors AS MATERIALIZED (
        SELECT s.chunk_id, s.document_id, s.ordinal, s.distance, s.relevance, s.rank,
               rag._close_enough(c, s.distance, s.relevance, s.lead, p_max_distance) AS close
          FROM rag.collections c, rag._search(c, p_vector, p_k, NULL, p_question) s
         WHERE c.id = p_collection_id AND c.embedding_provider = p_provider AND c.embedding_model = p_model
           AND c.query_prefix = p_prefix AND c.dimensions IS NOT DISTINCT FROM p_dimensions),
    wanted AS (
        SELECT a.chunk_id, a.distance, NULL::bigint AS anchor, a.relevance, a.rank, a.close FROM anchors a
        UNION ALL
        SELECT n.id, NULL::double precision, a.chunk_id, NULL::real, a.rank, NULL::boolean
          FROM anchors a
          JOIN rag.chunks n ON n.collection_id = p_collection_id AND n.document_id = a.document_id
                           AND n.ordinal IN (a.ordinal - 1, a.ordinal + 1)
         WHERE a.close)
    SELECT ch.id, ch.document_id, d.title, ch.ordinal, ch.char_start, ch.char_end, ch.content, w.distance, w.anchor,
           CASE WHEN ch.page IS NULL THEN NULL
                ELSE coalesce(d.page_labels[ch.page], 'p. ' || ch.page) END,
           w.relevance, w.rank, w.close
      FROM wanted w
      JOIN rag.chunks ch ON ch.collection_id = p_collection_id AND ch.id = w.chunk_id
      JOIN rag.documents d ON d.id = ch.document_id
     ORDER BY w.rank, w.anchor NULLS FIRST, ch.id;
    PERFORM rag._restore_search_counts(v_counts);
END $$;

-- One exchange of a conversation: the question and what was answered (or why not), tied to its ledger row.
CREATE FUNCTION rag._record_exchange(p_conversation_id bigint, p_question text, p_rewritten text,
                                     p_query_id bigint, p_reply text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO rag.messages (conversation_id, role, content, rewritten_question, query_id)
    VALUES (p_conversation_id, 'user', p_question, p_rewritten, p_query_id),
           (p_conversation_id, 'assistant', coalesce(p_reply, ''), NULL, p_query_id);
    -- The conversation is as old as its oldest answer (rag.collections.watches_ended).
    UPDATE rag.conversations v SET watches_ended = q.watches_ended
      FROM rag.queries q
     WHERE v.id = p_conversation_id AND q.id = p_query_id AND q.watches_ended < v.watches_ended;
$$;

CREATE FUNCTION @extschema@.rag_conversation_start(collection text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM rag._require_writable('a conversation');
    INSERT INTO rag.conversations (collection_id, owner, owner_id, watches_ended)
    SELECT c.id, r.rolname, rag._lock_role(r.oid)::regrole, c.watches_ended
      FROM rag.collections c, pg_catalog.pg_roles r
     WHERE c.id = rag._collection_id(collection, 'read') AND r.rolname = rag._calling_role()
    RETURNING id INTO v_id;
    RETURN v_id;
END $$;

CREATE FUNCTION rag._conversation_of_caller(p_id bigint) RETURNS rag.conversations
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v rag.conversations;
    v_caller pg_catalog.pg_roles;
BEGIN
    SELECT * INTO v FROM rag.conversations WHERE id = p_id;
    SELECT * INTO v_caller FROM pg_catalog.pg_roles r WHERE r.rolname = rag._calling_role();
    -- The policy of rag.conversations (schema.sql), for the caller rather than rag's owner; superusers, whom
    -- the policy does not apply to, read every conversation.
    IF v.id IS NULL OR NOT (coalesce(v.owner_id = v_caller.oid, false) OR coalesce(v_caller.rolsuper, false)
                         OR v.collection_id::bigint * 4294967296 + v.watches_ended
                            = ANY (rag._ledger_keys_visible(v_caller.rolname))) THEN
        RAISE EXCEPTION 'conversation % does not exist', p_id
            USING ERRCODE = 'undefined_object', HINT = 'Start one with rag_conversation_start(collection).';
    END IF;
    RETURN v;
END $$;

CREATE FUNCTION @extschema@.rag_conversation(conversation bigint)
RETURNS TABLE (role text, content text, rewritten_question text, query_id bigint, created_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint := (rag._conversation_of_caller(conversation)).id;
BEGIN
    RETURN QUERY
    SELECT m.role, m.content, m.rewritten_question, m.query_id, m.created_at
      FROM rag.messages m WHERE m.conversation_id = v_id ORDER BY m.id;
END $$;

CREATE FUNCTION @extschema@.rag_conversation_delete(conversation bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM rag._require_writable('rag_conversation_delete');
    v_id := (rag._conversation_of_caller(conversation)).id;
    DELETE FROM rag.conversations WHERE id = v_id;
    RETURN FOUND;
END $$;

-- The ledger per collection and day: what the service did, how often it refused, how fast, at what cost.
-- Ledger retention (rag.ledger_retention): the workers delete the rows older than p_retention, the oldest first,
-- at most p_batch per call (one call per idle moment, and every few seconds while busy), so that the first prune
-- of a large ledger neither holds the table for long nor writes one huge transaction. Only the oldest p_batch
-- rows by id are looked at (ids grow with time): when none of them is old enough the call costs one short index
-- read. A message that cites a row keeps its text and loses the link (ON DELETE SET NULL, by messages_by_query).
-- Returns how many rows went.
-- Rows another session holds (an open rag_drop_collection's or role rename's update of them, a message citing
-- one) are skipped or waited for at most lock_timeout: the worker, whose session waits without limit, stalled
-- with its whole database behind such a transaction (review of this function).
CREATE FUNCTION rag._prune_ledger(p_retention interval, p_batch integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql SET lock_timeout = '100ms' AS $$
DECLARE
    v_deleted integer;
BEGIN
    IF p_retention IS NULL OR p_retention <= interval '0' THEN
        RETURN 0;
    END IF;
    DELETE FROM rag.queries q
     WHERE q.id IN (SELECT o.id FROM rag.queries o
                     WHERE o.id <= (SELECT max(f.id) FROM (SELECT i.id FROM rag.queries i ORDER BY i.id
                                                            LIMIT greatest(p_batch, 1)) f)
                       AND o.created_at < now() - p_retention
                       FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
EXCEPTION WHEN lock_not_available THEN
    RETURN 0;
END $$;

-- Run as its caller (security_invoker), so rag.queries' own policy decides which rows count: an admin by grant
-- who may not read every row the collection indexes gets totals of the rows they may see only (a total of prompt
-- tokens would measure how much of the hidden rows' text was sent). A security barrier, as rag.status is.
CREATE VIEW rag.ledger_daily WITH (security_barrier, security_invoker) AS
SELECT collection,
       date_trunc('day', created_at)::date AS day,
       count(*) AS calls,
       count(*) FILTER (WHERE kind = 'ask') AS asks,
       count(*) FILTER (WHERE outcome = 'answered') AS answered,
       count(*) FILTER (WHERE outcome = 'refused') AS refused,
       count(*) FILTER (WHERE outcome = 'failed') AS failed,
       round(count(*) FILTER (WHERE outcome = 'refused')::numeric / nullif(count(*) FILTER (WHERE kind = 'ask'), 0), 3) AS refusal_rate,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) AS p50_latency_ms,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) AS p95_latency_ms,
       sum(coalesce(embed_tokens, 0)) AS embed_tokens,
       sum(coalesce(prompt_tokens, 0)) AS prompt_tokens,
       sum(coalesce(completion_tokens, 0)) AS completion_tokens,
       sum(cost_usd) AS cost_usd
  FROM rag.queries
 WHERE collection_id = ANY ((SELECT rag._collections_with(current_user, 'admin'))::integer[])
 GROUP BY 1, 2;

-- The extension's schema again, where pgrx creates the Rust functions declared after this file.
SET LOCAL search_path = @extschema@, pg_temp;
