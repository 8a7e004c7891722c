-- rag_reader queries, rag_writer ingests, rag_admin manages collections; PUBLIC gets nothing.
CREATE ROLE regress_reader LOGIN IN ROLE rag_reader;
CREATE ROLE regress_writer LOGIN IN ROLE rag_writer;
CREATE ROLE regress_admin LOGIN IN ROLE rag_admin;
CREATE ROLE regress_nobody LOGIN;

SET ROLE regress_nobody;
SELECT count(*) FROM rag.documents;
SELECT * FROM rag_query('docs', 'notice');
SELECT rag_ingest('docs', 'x', 'y');
RESET ROLE;

SET ROLE regress_reader;
SELECT title FROM rag_query('docs', 'How much notice do I have to give?', 1);
SELECT count(*) > 0 AS can_read FROM rag.documents;
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

DROP ROLE regress_reader, regress_writer, regress_admin, regress_nobody;
