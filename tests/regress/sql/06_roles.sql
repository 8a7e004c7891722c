-- rag_reader queries, rag_writer ingests, rag_admin manages collections; PUBLIC gets nothing. Those roles
-- say what a role may do at all; which collections it may do it on is the collection's owner's grant.
CREATE ROLE regress_reader LOGIN IN ROLE rag_reader;
CREATE ROLE regress_writer LOGIN IN ROLE rag_writer;
CREATE ROLE regress_admin LOGIN IN ROLE rag_admin;
CREATE ROLE regress_nobody LOGIN;

-- Without a grant on 'docs' a reader neither queries it nor sees its rows.
SET ROLE regress_reader;
SELECT title FROM rag_query('docs', 'How much notice do I have to give?', 1);
SELECT count(*) AS documents_visible FROM rag.documents;
CALL rag_await('docs', '0');
RESET ROLE;
SELECT rag_grant('docs', 'regress_reader', 'read');
SELECT rag_grant('docs', 'regress_writer', 'write');

SET ROLE regress_nobody;
SELECT count(*) FROM rag.documents;
SELECT * FROM rag_query('docs', 'notice');
SELECT rag_ingest('docs', 'x', 'y');
CALL rag_await('docs', '0');
RESET ROLE;

SET ROLE regress_reader;
SELECT title FROM rag_query('docs', 'How much notice do I have to give?', 1);
SELECT count(*) > 0 AS can_read FROM rag.documents;
SELECT collection, worker_waiting_for FROM rag.status;
CALL rag_await('docs', '0');
SELECT rag_ingest('docs', 'x', 'y');
INSERT INTO rag.documents (collection_id, body, content_sha256) VALUES (1, 'x', 'x');
RESET ROLE;

SET ROLE regress_writer;
SELECT rag_ingest('docs', 'Written by a writer', 'Writers may ingest documents into existing collections.') > 0 AS ingested;
UPDATE rag.documents SET status = 'ready';
SELECT rag_create_collection('writer-made');
SELECT rag_process_queue();
RESET ROLE;

SET ROLE regress_admin;
SELECT rag_create_collection('admin-made', embedding_model => 'hash-384') > 0 AS created;
SELECT rag_drop_collection('admin-made') AS dropped;
SELECT * FROM rag._claim_next(0);
RESET ROLE;

SELECT rag_revoke('docs', 'regress_reader'), rag_revoke('docs', 'regress_writer');
DROP ROLE regress_reader, regress_writer, regress_admin, regress_nobody;
