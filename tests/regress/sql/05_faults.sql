-- Provider failures are normal operation: each collection below points at a scripted fault of the test
-- provider. A short retry deadline keeps the test quick.

-- 401: fail at once with the provider's reason; nothing retried.
SELECT rag_create_collection('f401', embedding_model => 'hash-384@401') > 0;
SELECT rag_ingest('f401', 'Doc', 'Some text that will never be embedded.') AS d401 \gset
-- 429 three times with Retry-After, then success.
SELECT rag_create_collection('f429', embedding_model => 'hash-384@429x3') > 0;
SELECT rag_ingest('f429', 'Doc', 'Some text that is embedded after being throttled.') AS d429 \gset
-- 503 for ever: retried until the deadline, then failed.
SELECT rag_create_collection('f503', embedding_model => 'hash-384@503', retry_deadline => '3 seconds') > 0;
SELECT rag_ingest('f503', 'Doc', 'Some text the provider never takes.') AS d503 \gset
-- Malformed JSON, a wrongly shaped answer, a missing vector, a zero vector.
SELECT rag_create_collection('fjson', embedding_model => 'hash-384@badjson') > 0;
SELECT rag_ingest('fjson', 'Doc', 'Text for a provider that answers garbage.') AS djson \gset
SELECT rag_create_collection('fshape', embedding_model => 'hash-384@wrongshape') > 0;
SELECT rag_ingest('fshape', 'Doc', 'Text for a provider that answers the wrong shape.') AS dshape \gset
SELECT rag_create_collection('fcount', embedding_model => 'hash-384@countmismatch') > 0;
SELECT rag_ingest('fcount', 'Doc', 'Text for a provider that loses a vector.') AS dcount \gset
SELECT rag_create_collection('fzero', embedding_model => 'hash-384@nan') > 0;
SELECT rag_ingest('fzero', 'Doc', 'Text for a provider that answers zero vectors.') AS dzero \gset
-- Wrong dimension: a collection declared 768-dimensional fed 384-dimensional vectors, and a model that
-- changes its dimension after the first document.
SELECT rag_create_collection('fdim', embedding_model => 'hash-384', dimensions => 768) > 0;
SELECT rag_ingest('fdim', 'Doc', 'Text whose vectors have the wrong size.') AS ddim \gset
SELECT rag_create_collection('fflip', embedding_model => 'hash-384@dimflip1') > 0;
SELECT rag_ingest('fflip', 'First', 'The first document is embedded at 384 dimensions.') AS dflip1 \gset
SELECT rag_wait('fflip', '30 seconds');
SELECT rag_ingest('fflip', 'Second', 'The second document comes back at 385 dimensions.') AS dflip2 \gset
-- A model the provider does not have.
SELECT rag_create_collection('fmissing', embedding_model => 'missing') > 0;
SELECT rag_ingest('fmissing', 'Doc', 'Text for a model that was never pulled.') AS dmissing \gset

SELECT c.name, rag_wait(c.name, '40 seconds') AS settled FROM rag.collections c WHERE c.name LIKE 'f%' ORDER BY 1;

SELECT c.name AS collection, d.title, d.status, d.chunks_embedded, d.chunks_total,
       -- how many attempts fit in the deadline depends on the jitter drawn
       regexp_replace(d.failure_reason, '\([0-9]+ attempts\)', '(N attempts)') AS failure_reason
  FROM rag.documents d JOIN rag.collections c ON c.id = d.collection_id
 WHERE c.name LIKE 'f%' ORDER BY c.name, d.id;

-- Nothing failed is left in the queue, and the dimension of fflip stayed what it was.
SELECT count(*) AS queued FROM rag.queue q JOIN rag.documents d ON d.id = q.document_id
  JOIN rag.collections c ON c.id = d.collection_id WHERE c.name LIKE 'f%';
SELECT dimensions FROM rag.collections WHERE name = 'fflip';

-- Re-ingesting the text of a failed document queues it again under the same id.
SELECT rag_ingest('f401', 'Doc again', 'Some text that will never be embedded.') = :d401 AS same_document;
SELECT status FROM rag.documents WHERE id = :d401;
SELECT rag_wait('f401', '30 seconds');
SELECT status FROM rag.documents WHERE id = :d401;
