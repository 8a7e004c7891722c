-- Contextual chunk headers: each chunk after a document's opening carries what it sits under (the document's
-- title and the section heading above it), in front of its text where it is embedded, indexed for full text
-- and reranked; its stored content, what rag_query returns and rag_ask quotes, stays the document's own slice.
SELECT rag_create_collection('headers', embedding_model => 'hash-384', max_distance => 2, chunk_size => 200,
                             chunk_overlap => 0) > 0 AS created;
SELECT rag_ingest('headers', 'Parking garage',
    'The staff handbook covers the office building and the rules that everyone working in it follows. '
    || 'It applies to visitors as well while they are on site.'
    || E'\n\nVisitor spaces\n\n'
    || 'Guests sign in at the front desk before nine in the morning. Their cars go on the upper deck, in the bays '
    || 'marked in yellow. A pass from reception hangs behind the windscreen for the whole day. '
    || 'Passes are returned at the desk on the way out, and lost passes are reported the same day.'
    || E'\n\nFor example:\n\nA lost pass costs ten euros.'
    || E'\n\nBicycles\n\nRacks stand by the south door.') > 0 AS ingested;
SELECT rag_wait('headers', '60 seconds') AS ready;
SELECT ch.ordinal, ch.header, left(ch.content, 40) AS starts_with
  FROM rag.chunks ch JOIN rag.collections c ON c.id = ch.collection_id
 WHERE c.name = 'headers' ORDER BY ch.ordinal;
-- The content stays exactly the document's slice.
SELECT bool_and(ch.content = substr(d.body, ch.char_start + 1, ch.char_end - ch.char_start)) AS verbatim
  FROM rag.chunks ch JOIN rag.documents d ON d.id = ch.document_id JOIN rag.collections c ON c.id = d.collection_id
 WHERE c.name = 'headers';
-- What is embedded and indexed is the header, a blank line, then the content.
SELECT rag._with_header('Parking garage > Visitor spaces', 'Passes are returned.') AS joined,
       rag._with_header(NULL, 'Passes are returned.') AS alone;
SELECT ch.ordinal,
       ch.embedding <=> rag_embed(rag._with_header(ch.header, ch.content), 'hash-384', c.embedding_provider) < 1e-6 AS embedded_with_header,
       ch.tsv = to_tsvector(c.text_search_config::regconfig, rag._with_header(ch.header, ch.content)) AS indexed_with_header
  FROM rag.chunks ch JOIN rag.collections c ON c.id = ch.collection_id
 WHERE c.name = 'headers' ORDER BY ch.ordinal;
-- So a word only the title says finds the chunks under it, not the opening (which does not say it either), and
-- what comes back is the content alone.
SELECT ordinal, content LIKE 'Parking%' AS header_returned
  FROM rag_query('headers', 'garage', k => 10, mode => 'keyword') ORDER BY ordinal;
SELECT outcome, answer LIKE '%Parking garage%' AS header_quoted
  FROM rag_ask('headers', 'Where do visitors in the garage return passes?', k => 2);

-- The reranker reads the header too: the test server scores 10 * cosine - 5 of its hash embeddings, so a chunk
-- sharing no word with the question scores -5 exactly, and one whose header shares a word more.
SELECT rag_create_provider('header-rerank', 'openai', base_url => current_setting('rag.ollama_url') || '/v1');
SELECT rag_set_reranker('headers', 'rerank-test', reranker_provider => 'header-rerank', min_relevance => -10);
SELECT ordinal, round(relevance::numeric, 2) > -5 AS scored_above_nothing_shared
  FROM rag_query('headers', 'garage', k => 10, mode => 'keyword') ORDER BY ordinal;
SELECT rag_set_reranker('headers', NULL);

-- A watched row's title is in every chunk's header: a new title is embedded again; new metadata alone is not.
CREATE TABLE header_pages (id integer PRIMARY KEY, title text, body text, lang text);
INSERT INTO header_pages VALUES (1, 'Canteen', 'Lunch is served from noon until two, every working day of the '
    || 'week. The menu changes daily and is posted at the door.' || E'\n\nPrices\n\n'
    || 'A meal costs four euros for staff. Guests pay six euros and coffee is free for everyone all day long.', 'en');
SELECT rag_watch('header_pages', collection => 'headers', content => 'body', title => 'title',
                 metadata => ARRAY['lang']) > 0 AS watching;
CREATE FUNCTION pg_temp.page_chunks() RETURNS TABLE (ordinal integer, header text, embedded_with_header boolean)
LANGUAGE sql AS $$
    SELECT ch.ordinal, ch.header,
           ch.embedding <=> rag_embed(rag._with_header(ch.header, ch.content), 'hash-384', c.embedding_provider) < 1e-6
      FROM rag.chunks ch JOIN rag.documents d ON d.id = ch.document_id
      JOIN rag.collections c ON c.id = d.collection_id
     WHERE d.source_key = '{"id": 1}' AND c.name = 'headers' ORDER BY ch.ordinal
$$;
SELECT rag_wait('headers', '30 seconds') AS settled;
SELECT * FROM pg_temp.page_chunks();
UPDATE header_pages SET lang = 'de' WHERE id = 1;
SELECT rag_wait('headers', '30 seconds') AS settled;
SELECT d.metadata->>'lang' AS lang, d.embed_calls AS embed_calls_after_relabel
  FROM rag.documents d WHERE d.source_key = '{"id": 1}';
UPDATE header_pages SET title = 'Staff restaurant' WHERE id = 1;
SELECT rag_wait('headers', '30 seconds') AS settled;
SELECT * FROM pg_temp.page_chunks();
SELECT d.title, d.status, d.embed_calls AS embed_calls_after_retitle FROM rag.documents d WHERE d.source_key = '{"id": 1}';

SELECT rag_unwatch('header_pages');
DROP TABLE header_pages;
SELECT rag_drop_collection('headers');
SELECT rag_drop_provider('header-rerank');
