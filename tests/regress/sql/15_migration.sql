-- Changing a collection's embedding model without downtime: the new vectors go to the column the collection does
-- not search, queries keep using the old model meanwhile, and one transaction switches.

-- Waits (at most 60 s) until the collection has no model change left, cleared column included.
CREATE FUNCTION pg_temp.settled(p_collection text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..1200 LOOP
        IF NOT EXISTS (SELECT 1 FROM rag.migrations m JOIN rag.collections c ON c.id = m.collection_id
                        WHERE c.name = p_collection) THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END $$;

SELECT rag_create_collection('mig', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_ingest('mig', 'Notice', 'Staff must give thirty days notice in writing before leaving.') > 0,
       rag_ingest('mig', 'Parking', 'The garage behind the building is free for staff.') > 0,
       rag_ingest('mig', 'Payroll', 'Salaries are paid on the last working day of the month.') > 0;
SELECT rag_wait('mig', '60 seconds') AS ready;
SELECT embedding_model, dimensions, vector_column, index_name ~ '^chunks_embedding_c' AS indexed
  FROM rag.collections WHERE name = 'mig';

-- A change whose provider keeps failing for now (HTTP 503): it stays in progress, and everything goes on with
-- the old model.
SELECT rag_set_embedding_model('mig', 'hash-768@503') AS queued;
SELECT collection, embedding_model, dimensions, migrating_to, migration_state
  FROM rag.status WHERE collection = 'mig';
SELECT title FROM rag_query('mig', 'Staff must give thirty days notice in writing before leaving.', 1);
-- A document written meanwhile is searchable at once with the old model.
SELECT rag_ingest('mig', 'Leave', 'Everyone gets twenty-five days of paid vacation.') > 0 AS ingested;
SELECT rag_wait('mig', '2 seconds') AS switched_already;
SELECT count(*) FILTER (WHERE status = 'ready') AS ready
  FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id WHERE c.name = 'mig';
SELECT title FROM rag_query('mig', 'Everyone gets twenty-five days of paid vacation.', 1);
-- One space per search: the search reads the searched column only.
SELECT rag._search_sql(c, 'hybrid', false, true, true) ~ 'embedding_alt' AS reads_the_new_column,
       rag._search_sql(c, 'hybrid', false, true, true) ~ 'ch\.embedding::([a-z_]+\.)?vector\(384\)' AS reads_the_old_one
  FROM rag.collections c WHERE c.name = 'mig';

-- The switch looks again under its locks: a change found complete may have been replaced since by one that has
-- embedded nothing (a second rag_set_embedding_model racing the worker), which must not switch. The race is
-- played here by a look that finds every change due, for one transaction.
BEGIN;
CREATE OR REPLACE FUNCTION rag._migrations_due() RETURNS integer[] LANGUAGE sql AS
    $$ SELECT array_agg(collection_id ORDER BY collection_id) FROM rag.migrations $$;
SELECT rag._advance_migrations() AS steps;
SELECT c.embedding_model, c.dimensions, m.state
  FROM rag.collections c JOIN rag.migrations m ON m.collection_id = c.id WHERE c.name = 'mig';
ROLLBACK;

-- Cancelling leaves the old model in place, and the worker clears what was made for the new one.
SELECT rag_cancel_embedding_model('mig') AS cancelled;
SELECT rag_cancel_embedding_model('mig') AS cancelled_again;
SELECT pg_temp.settled('mig') AS settled;
SELECT c.embedding_model, c.dimensions, c.vector_column, count(ch.embedding_alt) AS new_vectors_left,
       count(ch.embedding) = count(*) AS old_vectors_all_there
  FROM rag.collections c JOIN rag.chunks ch ON ch.collection_id = c.id WHERE c.name = 'mig'
 GROUP BY c.id;

-- A change that works: rag_wait returns once the collection has switched.
-- A question embedded before the switch (as rag_ask embeds it, then searches) is searched in no space after it:
-- rag_ask then embeds it again in the new one.
SELECT e.vector AS old_space_vector FROM rag.collections c,
       rag._embed_query_in(c.id, 'thirty days notice', c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e
 WHERE c.name = 'mig' \gset
SELECT rag_set_embedding_model('mig', 'hash-768') AS queued;
SELECT rag_wait('mig', '60 seconds') AS switched;
SELECT count(*) AS found_with_the_old_models_question
  FROM rag.collections c, rag._retrieve_context(c.id, c.embedding_provider, 'hash-384', c.query_prefix, 384,
                                                 :'old_space_vector', 3, 2, 'thirty days notice') r
 WHERE c.name = 'mig';
SELECT outcome, citations -> 0 ->> 'title' AS cited FROM rag_ask('mig', 'thirty days notice', max_distance => 2);
SELECT embedding_model, dimensions, vector_column, index_name = 'chunks_embedding_alt_c' || id AS indexed
  FROM rag.collections WHERE name = 'mig';
SELECT title FROM rag_query('mig', 'Staff must give thirty days notice in writing before leaving.', 1);
SELECT pg_temp.settled('mig') AS settled;
-- The column left behind is empty and its index gone; every chunk has a 768-dimensional vector.
SELECT count(ch.embedding) AS old_vectors_left, count(ch.embedding_alt) = count(*) AS new_vectors_all_there,
       min(vector_dims(ch.embedding_alt)) AS dims
  FROM rag.collections c JOIN rag.chunks ch ON ch.collection_id = c.id WHERE c.name = 'mig';
SELECT count(*) AS old_index_left FROM pg_indexes
 WHERE schemaname = 'rag' AND indexname = 'chunks_embedding_c' || (SELECT id FROM rag.collections WHERE name = 'mig');
SELECT rag._search_sql(c, 'vector', false, true, false) ~ 'ch\.embedding_alt::([a-z_]+\.)?vector\(768\)' AS reads_the_new_column
  FROM rag.collections c WHERE c.name = 'mig';

-- And back: the spaces alternate.
SELECT rag_set_embedding_model('mig', 'hash-384') AS queued;
SELECT rag_wait('mig', '60 seconds') AS switched, pg_temp.settled('mig') AS settled;
SELECT embedding_model, dimensions, vector_column FROM rag.collections WHERE name = 'mig';
SELECT count(ch.embedding) = count(*) AS vectors_all_there, count(ch.embedding_alt) AS other_column_left
  FROM rag.collections c JOIN rag.chunks ch ON ch.collection_id = c.id WHERE c.name = 'mig';
SELECT title FROM rag_query('mig', 'Salaries are paid on the last working day of the month.', 1);

-- A change whose model the provider refuses (HTTP 400) fails with the reason; the collection and its documents
-- are untouched.
SELECT rag_set_embedding_model('mig', 'hash-768@400') AS queued;
SELECT rag_wait('mig', '60 seconds') AS over;
SELECT migration_state, migration_error ~ '400' AS says_why, embedding_model, documents_ready, documents_failed
  FROM rag.status WHERE collection = 'mig';
SELECT title FROM rag_query('mig', 'The garage behind the building is free for staff.', 1);
SELECT rag_cancel_embedding_model('mig') AS cancelled;
SELECT pg_temp.settled('mig') AS settled;
-- One that fails on a row of a watched table does not quote the provider's answer to every reader of the
-- collection (rag.status, rag.migrations): a provider's refusal may quote the text it was sent, which the
-- table's rules may keep from them (red team 16). The server log has it.
CREATE TABLE mig_rows (id int PRIMARY KEY, body text);
INSERT INTO mig_rows VALUES (1, 'A watched row about the parking spaces.');
SELECT rag_create_collection('mig-watched', embedding_model => 'hash-384') IS NOT NULL AS created;
SELECT rag_watch('mig_rows', 'mig-watched', content => 'body') > 0 AS watching;
SELECT rag_wait('mig-watched', '60 seconds') AS ready;
SELECT rag_set_embedding_model('mig-watched', 'hash-768@400') AS queued;
SELECT rag_wait('mig-watched', '60 seconds') AS over;
SELECT migration_state, migration_error ~ '400' AS quotes_the_provider,
       migration_error ~ 'a row of a watched table' AS says_whose
  FROM rag.status WHERE collection = 'mig-watched';
SELECT rag_unwatch('mig_rows', drop_documents => true) AS unwatched;
SELECT rag_drop_collection('mig-watched') AS dropped;
DROP TABLE mig_rows;

-- A collection that never had a vector just takes the new model.
SELECT rag_create_collection('mig-empty', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_set_embedding_model('mig-empty', 'hash-768', dimensions => 768) AS queued;
SELECT embedding_model, dimensions, (SELECT count(*) FROM rag.migrations m WHERE m.collection_id = c.id) AS changes
  FROM rag.collections c WHERE name = 'mig-empty';

-- The distance ceiling follows the model when it was the old model's default (all-minilm 0.6, bge-small-en-v1.5
-- 0.44: rag_known_models()), at the switch or at once for a collection without vectors; a ceiling chosen by
-- argument is kept.
SELECT rag_create_collection('mig-ceiling', embedding_model => 'all-minilm') > 0 AS created,
       rag_create_collection('mig-ceiling-own', embedding_model => 'all-minilm', max_distance => 0.9) > 0 AS created,
       rag_create_collection('mig-ceiling-empty', embedding_model => 'all-minilm') > 0 AS created;
SELECT rag_ingest('mig-ceiling', 'Notice', 'Staff must give thirty days notice in writing before leaving.') > 0,
       rag_ingest('mig-ceiling-own', 'Notice', 'Staff must give thirty days notice in writing before leaving.') > 0;
SELECT rag_wait('mig-ceiling', '60 seconds') AS ready, rag_wait('mig-ceiling-own', '60 seconds') AS ready;
SELECT rag_set_embedding_model('mig-ceiling', 'bge-small-en-v1.5') AS queued,
       rag_set_embedding_model('mig-ceiling-own', 'bge-small-en-v1.5') AS queued,
       rag_set_embedding_model('mig-ceiling-empty', 'bge-small-en-v1.5') AS queued;
SELECT rag_wait('mig-ceiling', '60 seconds') AS switched, rag_wait('mig-ceiling-own', '60 seconds') AS switched;
SELECT name, embedding_model, max_distance FROM rag.collections WHERE name LIKE 'mig-ceiling%' ORDER BY name;
SELECT rag_drop_collection('mig-ceiling'), rag_drop_collection('mig-ceiling-own'), rag_drop_collection('mig-ceiling-empty');

-- Only an admin of the collection changes its model or cancels a change.
CREATE ROLE mig_reader LOGIN IN ROLE rag_reader;
SELECT rag_grant('mig', 'mig_reader', 'read');
SET ROLE mig_reader;
SELECT rag_set_embedding_model('mig', 'hash-768');
SELECT rag_cancel_embedding_model('mig');
SELECT collection, migrating_to FROM rag.status WHERE collection = 'mig';
RESET ROLE;
SELECT rag_set_embedding_model('mig', '');
SELECT rag_set_embedding_model('mig', 'hash-768', embedding_provider => 'nowhere');
SELECT rag_set_embedding_model('mig', 'hash-768', dimensions => 0);

SELECT rag_drop_collection('mig'), rag_drop_collection('mig-empty');
SELECT count(*) AS changes_left FROM rag.migrations;
DROP ROLE mig_reader;
