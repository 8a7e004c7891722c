-- Files in: text extraction in the database, page-aware ingestion, and clear errors for files that cannot
-- be read. The fixtures are real files from public test suites (crates/extract/tests/fixtures/README.md).
\getenv root ROOT
\set fixtures :root '/crates/extract/tests/fixtures/'

SELECT format, locator, left(text, 60) AS text
  FROM rag_extract_sections(pg_read_binary_file(:'fixtures' || 'two-different-pages.pdf'), 'two-different-pages.pdf');
SELECT format, locator, replace(text, E'\n', ' / ') AS text
  FROM rag_extract_sections(pg_read_binary_file(:'fixtures' || 'tbl-cell.pptx'), 'tbl-cell.pptx');
SELECT format, locator, replace(text, E'\t', ' ') AS text
  FROM rag_extract_sections(pg_read_binary_file(:'fixtures' || 'self_evaluation_report_2014-05-19.xlsx'));
SELECT position('They push the human race forward.' IN rag_extract_text(pg_read_binary_file(:'fixtures' || 'crazyones.pdf'))) > 0
       AS crazy_ones_words_intact;
SELECT rag_extract_text(convert_to('<html><head><style>p{}</style></head><body><h1>Title</h1><p>One &amp; two.</p><script>x()</script><p>Three</p></body></html>', 'UTF8'), 'page.html');

-- Ingest a PDF: each page is a page of the document, and chunks know theirs.
SELECT rag_create_collection('files', embedding_model => 'hash-384', chunk_size => 100, chunk_overlap => 0) > 0 AS created;
SELECT rag_ingest_file('files', 'tbl-cell.pptx', pg_read_binary_file(:'fixtures' || 'tbl-cell.pptx'),
                       metadata => '{"team": "design"}') AS deck \gset
SELECT rag_wait('files', '30 seconds') AS done;
SELECT title, source, metadata, page_labels, status FROM rag.documents WHERE id = :deck;
SELECT ordinal, page, left(replace(content, E'\n', ' / '), 40) AS content FROM rag.chunks WHERE document_id = :deck ORDER BY ordinal;
-- The same file again costs nothing.
SELECT rag_ingest_file('files', 'copy.pptx', pg_read_binary_file(:'fixtures' || 'tbl-cell.pptx')) = :deck AS deduplicated;
-- The file's format joins the metadata unless the metadata names one; no metadata gets the format alone;
-- metadata that is not an object, or too large, is refused as rag_ingest refuses it.
SELECT rag_ingest_file('files', 'a.txt', convert_to('Alpha file.', 'UTF8'), metadata => '{"format": "memo"}') > 0 AS a,
       rag_ingest_file('files', 'b.txt', convert_to('Beta file.', 'UTF8'), metadata => NULL) > 0 AS b;
SELECT title, metadata FROM rag.documents WHERE title IN ('a.txt', 'b.txt') ORDER BY title;
SELECT rag_ingest_file('files', 'c.txt', convert_to('Gamma file.', 'UTF8'), metadata => '[1, 2]');
SELECT rag_ingest_file('files', 'd.txt', convert_to('Delta file.', 'UTF8'),
                       metadata => jsonb_build_object('big', repeat('x', 70000)));

-- Files that cannot be read: an ERROR naming the problem, with a hint, and nothing written.
SELECT count(*) AS documents_before FROM rag.documents \gset
SELECT rag_ingest_file('files', 'secret.pdf', pg_read_binary_file(:'fixtures' || 'r4-user-password.pdf'));
SELECT rag_ingest_file('files', 'scan.pdf', pg_read_binary_file(:'fixtures' || 'imagemagick-lzw.pdf'));
SELECT rag_ingest_file('files', 'truncated.pdf', substring(pg_read_binary_file(:'fixtures' || 'crazyones.pdf') FROM 1 FOR 600));
SELECT rag_ingest_file('files', 'random.pdf', decode(repeat('deadbeef', 64), 'hex'));
-- The collection is checked before the file is read: not a file's error, and no extraction spent.
SELECT rag_ingest_file('no such collection', 'random.pdf', decode(repeat('deadbeef', 64), 'hex'));
SELECT rag_ingest_file('files', 'empty.txt', ''::bytea);
SELECT rag_ingest_file('files', 'latin1.txt', '\xe974e9'::bytea);
SET rag.max_file_size = '1kB';
SELECT rag_ingest_file('files', 'big.docx', pg_read_binary_file(:'fixtures' || 'test.docx'));
RESET rag.max_file_size;
SELECT count(*) - :documents_before AS documents_written FROM rag.documents;

-- A file is extracted in a child process under rag.extraction_memory and rag.extraction_cpu_time, at most
-- rag.max_concurrent_extractions at once in the cluster (tests/e2e/test_isolation.py tries them): only a
-- superuser may raise the first two, and the third is the server's.
SELECT name, setting, unit, context, min_val, max_val FROM pg_settings
 WHERE name IN ('rag.max_concurrent_extractions', 'rag.extraction_memory', 'rag.extraction_cpu_time') ORDER BY name;
CREATE ROLE rag_files_plain;
SET ROLE rag_files_plain;
SET rag.extraction_memory = '64GB';
SET rag.extraction_cpu_time = '1h';
SET rag.max_concurrent_extractions = 64;
RESET ROLE;
DROP ROLE rag_files_plain;
SET rag.extraction_memory = '256MB';
SELECT position('They push the human race forward.' IN rag_extract_text(pg_read_binary_file(:'fixtures' || 'crazyones.pdf'))) > 0
       AS extracted_under_a_small_bound;
RESET rag.extraction_memory;
