-- rag_chunk shows what the worker will store: paragraphs packed, sentences when a paragraph is too big,
-- a hard cut for text without sentences, overlap carried forward.
SELECT ordinality, length(c), c
  FROM rag_chunk(E'First paragraph is short.\n\nSecond paragraph is also short.', 100, 0) WITH ORDINALITY c;

-- An oversized paragraph is split on sentence boundaries: every chunk ends with a full stop.
SELECT ordinality, length(c) <= 120 AS within_size, right(c, 1) AS last_char
  FROM rag_chunk(repeat('This sentence is about the notice period for all staff. ', 12), 120, 0) WITH ORDINALITY c;

-- Overlap: each chunk after the first starts with text the previous one ended with.
WITH chunks AS (
    SELECT ordinality AS n, c FROM rag_chunk(repeat('Alpha beta gamma delta. Epsilon zeta eta theta. ', 20), 150, 50) WITH ORDINALITY c)
SELECT b.n, position(left(b.c, 10) IN a.c) > 0 AS starts_inside_previous
  FROM chunks a JOIN chunks b ON b.n = a.n + 1 ORDER BY b.n;

-- Text with no sentence structure (a table dump) is hard-cut within the size.
SELECT count(*) AS chunks, max(length(c)) <= 100 AS within_size
  FROM rag_chunk(repeat('col1|col2|col3|', 40), 100, 0) c;

-- Multibyte text is never cut inside a character: the chunks put back together give the input.
SELECT string_agg(c, '') = repeat('日本語のテキスト', 60) AS round_trips, bool_and(c ~ '^[日本語のテキスト]+$') AS clean
  FROM rag_chunk(repeat('日本語のテキスト', 60), 100, 0) c;

-- Bounds are checked with a clear error and a hint.
SELECT * FROM rag_chunk('text', 50, 0);
SELECT * FROM rag_chunk('text', 500, 500);
SELECT * FROM rag_chunk('text', 500, 6000);
SELECT * FROM rag_chunk('', 500, 0);
-- More text than a document may be is refused before any chunk is made (every chunk is made before the first
-- is returned).
SELECT count(*) FROM rag_chunk(repeat('x', 70 * 1024 * 1024));
