-- Reranking: a cross-encoder (ms-marco-MiniLM-L-12-v2, run in this backend) rescores the search's best candidates,
-- and its relevance replaces the distance ceiling as the refusal threshold.

-- On by default for collections on the local provider; off for collections on a server's model.
SELECT rag_create_collection('rr', embedding_provider => 'local') > 0 AS created;
SELECT rag_create_collection('rr-remote', embedding_model => 'hash-384') > 0 AS created;
SELECT name, reranker, rerank_candidates, min_relevance = rag._limit('min_relevance_default')::real AS default_threshold,
       min_lead = rag._limit('min_lead_default')::real AS default_lead
  FROM rag.collections WHERE name IN ('rr', 'rr-remote') ORDER BY name;
SELECT rag_create_collection('rr-off', embedding_provider => 'local', reranker => 'none') > 0 AS created;
SELECT reranker IS NULL AS off FROM rag.collections WHERE name = 'rr-off';

SELECT rag_ingest('rr', 'Leave', 'Employees receive twenty-five days of paid vacation every year. Unused days may be carried over until March.') > 0,
       rag_ingest('rr', 'Resignation', 'Anyone who wants to quit must tell their manager in writing one month in advance.') > 0,
       rag_ingest('rr', 'Expenses', 'Train tickets and hotel bills for business trips are refunded within two weeks.') > 0,
       rag_ingest('rr', 'Parking', 'Staff may leave their cars in the garage behind the building free of charge.') > 0,
       rag_ingest('rr', 'Payroll', 'Salaries are paid on the last working day of each month by bank transfer.') > 0;
SELECT rag_wait('rr', '120 seconds') AS ready;

-- Paraphrases, worded unlike the passage that answers them: the right document comes first, and passes.
SELECT q.question, r.title, r.relevance >= c.min_relevance AS passes
  FROM (VALUES (1, 'How much notice do I have to give before leaving the company?'),
               (2, 'How many holidays do I get?'),
               (3, 'Will I get my travel costs back?'),
               (4, 'Where can I park my car at work?'),
               (5, 'When do we get our wages?')) AS q(n, question)
  CROSS JOIN LATERAL (SELECT * FROM rag_query('rr', q.question, 1)) r
  JOIN rag.collections c ON c.name = 'rr'
 ORDER BY q.n;

-- Results come in the reranked order: the relevance (the cross-encoder's logit) plus the weighted cosine
-- similarity never increases down the list, whatever the distances or the logits alone do (the threshold out of
-- the way, so every candidate is returned).
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_relevance => -100);
SELECT bool_and(combined <= previous + 1e-4) AS by_combined_score, count(*) AS returned,
       bool_or(distance > previous_distance) AS distances_not_in_order
  FROM (SELECT combined, lag(combined, 1, 'Infinity') OVER (ORDER BY ordinality) AS previous,
               distance, lag(distance, 1, 0) OVER (ORDER BY ordinality) AS previous_distance
          FROM (SELECT *, relevance + rag._limit('rerank_similarity_weight')::real * (1 - distance) AS combined
                  FROM rag_query('rr', 'Who pays for my train ticket when I travel for work?', 5, max_distance => 2)
                       WITH ORDINALITY) q) ranked;
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_relevance => rag._limit('min_relevance_default')::real);
-- The same search without reranking keeps the fused order and gives no relevance.
SELECT count(*) AS candidates, count(s.relevance) AS with_relevance
  FROM rag.collections c, rag._search(c, (SELECT e.vector FROM rag._embed_query_in(c.id, 'train ticket', c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e), 5, NULL, 'train ticket', NULL, false) s
 WHERE c.name = 'rr';

-- Off-domain questions: nothing passes, rag_ask refuses without a chat call, and the ledger keeps both the
-- nearest distance and the best relevance it saw.
SELECT count(*) AS returned FROM rag_query('rr', 'What is the boiling point of water at sea level?');
SELECT outcome, best_relevance < (SELECT min_relevance FROM rag.collections WHERE name = 'rr') AS below_threshold
  FROM rag_ask('rr', 'Who painted the Mona Lisa?');
SELECT kind, outcome, reason, chat_calls, nearest_distance IS NOT NULL AS has_nearest,
       best_relevance IS NOT NULL AS has_best_relevance
  FROM rag.queries WHERE collection = 'rr' AND question IN ('Who painted the Mona Lisa?',
                                                            'What is the boiling point of water at sea level?')
 ORDER BY id;
-- An answerable question is answered from the passage the reranker put first.
SELECT outcome, citations->0->>'title' AS cited, best_relevance >= 0 AS confident
  FROM rag_ask('rr', 'How far in advance must I tell my manager that I quit?');

-- The threshold's edge: a chunk whose relevance equals min_relevance passes; a hair above it, it does not (the
-- lead turned off, or the chunk would pass on it: see below).
SELECT relevance AS edge FROM rag_query('rr', 'Where can I park my car at work?', 1) \gset
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_relevance => :edge, min_lead => 0);
SELECT count(*) AS at_the_edge FROM rag_query('rr', 'Where can I park my car at work?', 1);
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_relevance => :edge + 0.001);
SELECT count(*) AS above_the_edge FROM rag_query('rr', 'Where can I park my car at work?', 1);
-- With its lead, the same chunk passes a hair above the threshold: it is far ahead of the next candidate.
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_lead => rag._limit('min_lead_default')::real);
SELECT count(*) AS above_the_edge_with_its_lead FROM rag_query('rr', 'Where can I park my car at work?', 1);
-- The caller's max_distance still applies on top of the relevance.
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_relevance => -100);
SELECT count(*) AS within_a_tiny_ceiling FROM rag_query('rr', 'Where can I park my car at work?', 5, max_distance => 0.01);
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_relevance => rag._limit('min_relevance_default')::real);

-- The lead (rag._close_enough): the reranker's first chunk passes below min_relevance, by up to min_lead, when it
-- leads the second candidate by min_lead or more. Both edges are inclusive; a chunk with no lead (not the first,
-- or not also the nearest by distance) has only the threshold; the caller's ceiling still applies.
SELECT rag._close_enough(c, c.max_distance + 0.1, -8, 3, NULL) AS at_both_edges,
       rag._close_enough(c, c.max_distance + 0.1, -8.01, 3, NULL) AS below_the_floor,
       rag._close_enough(c, c.max_distance + 0.1, -6, 2.99, NULL) AS lead_too_short,
       rag._close_enough(c, 0.5, -6, NULL, NULL) AS without_a_lead,
       rag._close_enough(c, 0.5, -5, NULL, NULL) AS at_the_threshold,
       rag._close_enough(c, 0.5, -6, 5, 0.4) AS beyond_the_callers_ceiling
  FROM rag.collections c WHERE c.name = 'rr';
-- With its lead, the first chunk also passes at any relevance within the collection's own distance ceiling
-- (the bi-encoder's threshold for its model), edge inclusive; not without the lead, nor beyond the ceiling.
SELECT c.max_distance = rag._default_max_distance(c.embedding_model) AS the_models_ceiling,
       rag._close_enough(c, c.max_distance, -11, 3, NULL) AS within_the_ceiling,
       rag._close_enough(c, c.max_distance + 0.001, -11, 3, NULL) AS beyond_the_ceiling,
       rag._close_enough(c, 0.3, -11, 2.99, NULL) AS near_but_lead_too_short,
       rag._close_enough(c, 0.3, -11, NULL, NULL) AS near_without_a_lead,
       rag._close_enough(c, 0.3, -11, 5, 0.2) AS near_beyond_the_callers_ceiling
  FROM rag.collections c WHERE c.name = 'rr';
-- The distance branch stops at the ceiling measured for the model too: a collection whose owner loosened its own
-- ceiling (1 here, no refusal by distance at all) gets the model's (a model rag_known_models() has not measured
-- gets no distance branch: rr-http below).
SELECT rag_create_collection('rr-loose', embedding_provider => 'local', max_distance => 1) > 0 AS created;
SELECT c.max_distance AS own_ceiling,
       rag._close_enough(c, rag._model_max_distance(c.embedding_model), -11, 5, NULL) AS at_the_models_ceiling,
       rag._close_enough(c, rag._model_max_distance(c.embedding_model) + 0.001, -11, 5, NULL) AS beyond_the_models_ceiling,
       rag._close_enough(c, 0.95, -11, 5, NULL) AS within_its_own_loose_ceiling,
       rag._close_enough(c, 0.95, -7, 5, NULL) AS near_the_threshold_with_the_lead
  FROM rag.collections c WHERE c.name = 'rr-loose';
SELECT rag_drop_collection('rr-loose');
-- min_lead 0 turns the lead off on both counts: only the threshold is left.
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_lead => 0);
SELECT rag._close_enough(c, 0.3, -11, 5, NULL) AS near_with_the_lead_off,
       rag._close_enough(c, 0.3, -8, 5, NULL) AS above_the_floor_with_the_lead_off
  FROM rag.collections c WHERE c.name = 'rr';
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_lead => rag._limit('min_lead_default')::real);
-- rag._search gives the lead to the first chunk only: its combined score (relevance plus the weighted
-- similarity) less the second candidate's.
SELECT count(s.lead) AS with_a_lead, bool_and(s.lead IS NULL OR s.rank = 1) AS only_the_first,
       bool_and(s.lead IS NULL OR abs(s.lead - (s.relevance + w * (1 - s.distance)
                                                - (SELECT t.relevance + w * (1 - t.distance) FROM rag._search(c, (SELECT e.vector FROM rag._embed_query_in(c.id, 'When do we get our wages?', c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e), 5, NULL, 'When do we get our wages?') t WHERE t.rank = 2))) < 1e-3) AS ahead_of_the_second
  FROM rag.collections c, rag._search(c, (SELECT e.vector FROM rag._embed_query_in(c.id, 'When do we get our wages?', c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e), 5, NULL, 'When do we get our wages?') s,
       CAST(rag._limit('rerank_similarity_weight') AS double precision) w
 WHERE c.name = 'rr';
-- Where the cross-encoder misreads a paraphrase, the bi-encoder's agreement decides: "the washers" goes to the
-- laundry rule, although the cross-encoder scores the bicycle rule (which mentions the laundry) higher. And
-- without a chat model the answer quotes the passage put first, even when only a lower one shares a word with
-- the question ("home": the remote work rule).
SELECT rag_create_collection('rr-blend', embedding_provider => 'local') > 0 AS created;
SELECT count(*) FILTER (WHERE rag_ingest('rr-blend', t.title, t.body) > 0) AS ingested
  FROM (VALUES ('Quiet hours', 'Residents must keep noise down between ten at night and seven in the morning.'),
               ('Rubbish', 'Household waste goes in the grey bins in the courtyard; glass is collected separately on Tuesdays.'),
               ('Bicycles', 'Bikes must be stored in the basement room next to the laundry, never in the stairwell.'),
               ('Laundry', 'The washing machines may be booked for two hours at a time using the sheet on the door.'),
               ('Parental leave', 'New parents may take up to six months off, of which the first three are paid in full.'),
               ('Remote work', 'Team members may work from home up to three days a week after agreeing it with their lead.')) t(title, body);
SELECT rag_wait('rr-blend', '120 seconds') AS ready;
SELECT s.rank, d.title, s.relevance = (SELECT max(t.relevance) FROM rag._search(c, (SELECT e.vector FROM rag._embed_query_in(c.id, 'How do I reserve the washers downstairs?', c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e), 3, NULL, 'How do I reserve the washers downstairs?') t) AS highest_logit
  FROM rag.collections c, rag._search(c, (SELECT e.vector FROM rag._embed_query_in(c.id, 'How do I reserve the washers downstairs?', c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e), 2, NULL, 'How do I reserve the washers downstairs?') s
  JOIN rag.documents d ON d.id = s.document_id WHERE c.name = 'rr-blend' ORDER BY s.rank;
SELECT outcome, citations->0->>'title' AS cited FROM rag_ask('rr-blend', 'How do I reserve the washers downstairs?');
SELECT outcome, jsonb_path_query_array(citations, '$[*].title') AS cited,
       answer LIKE 'New parents may take up to six months off%' AS quotes_the_first
  FROM rag_ask('rr-blend', 'How long can I stay at home after my baby is born?');
-- The cross-encoder scores "cycle" and "hallway" at its floor against the bicycle rule, but puts it first, far
-- ahead, and it is the nearest passage, within the model's distance ceiling: answered.
SELECT outcome, citations->0->>'title' AS cited, best_relevance < c.min_relevance - c.min_lead AS below_the_floor,
       nearest_distance <= c.max_distance AS within_the_ceiling
  FROM rag_ask('rr-blend', 'Is it ok to leave my cycle in the hallway?') a
  JOIN rag.collections c ON c.name = 'rr-blend';
SELECT rag_drop_collection('rr-blend');
-- Paraphrases the reranker scores below the threshold but far ahead of every other passage are answered;
-- off-domain questions, whose candidates all score alike, are still refused. Without the lead the paraphrases
-- are refused too.
SELECT rag_create_collection('rr-lead', embedding_provider => 'local') > 0 AS created;
SELECT count(*) FILTER (WHERE rag_ingest('rr-lead', t.title, t.body) > 0) AS ingested
  FROM (VALUES ('Leave', 'Employees receive twenty-five days of paid vacation every year. Unused days may be carried over until March.'),
               ('Parking', 'Staff may leave their cars in the garage behind the building free of charge.'),
               ('Payroll', 'Salaries are paid on the last working day of each month by bank transfer.'),
               ('Remote work', 'Team members may work from home up to three days a week after agreeing it with their lead.'),
               ('Sick days', 'If you are ill, call your supervisor before nine o''clock and send a doctor''s note after three days.'),
               ('Equipment', 'Laptops and phones issued by the IT desk remain company property and must be returned on the last day.'),
               ('Training', 'Each employee has a budget of 1,500 euros a year for courses and conferences related to their role.'),
               ('Security badge', 'A lost access card must be reported to reception immediately so that it can be blocked.')) t(title, body);
SELECT rag_wait('rr-lead', '120 seconds') AS ready;
CREATE TABLE rr_lead_questions (n int, question text, answerable boolean);
INSERT INTO rr_lead_questions VALUES
    (1, 'What should I do when I wake up with a fever and cannot come in?', true),
    (2, 'Can I keep my work computer when my contract ends?', true),
    (3, 'I misplaced the card that opens the doors, what now?', true),
    (4, 'How long should I boil an egg?', false),
    (5, 'How many players are on a football team?', false),
    (6, 'Who painted the Mona Lisa?', false);
SELECT q.question, a.outcome, a.citations->0->>'title' AS cited, a.best_relevance < c.min_relevance AS below_threshold
  FROM rr_lead_questions q CROSS JOIN LATERAL rag_ask('rr-lead', q.question) a
  JOIN rag.collections c ON c.name = 'rr-lead'
 ORDER BY q.n;
SELECT count(*) AS asked, sum(chat_calls) AS chat_calls FROM rag.queries WHERE collection = 'rr-lead';
SELECT rag_set_reranker('rr-lead', 'ms-marco-MiniLM-L-12-v2', min_lead => 0);
SELECT q.question, a.outcome
  FROM rr_lead_questions q CROSS JOIN LATERAL rag_ask('rr-lead', q.question) a
 WHERE q.answerable ORDER BY q.n;
DROP TABLE rr_lead_questions;

-- rag_explain says that the plan's candidates are reranked, and by what.
SELECT line FROM rag_explain('rr', 'parking', 3) AS line WHERE line ~ '^Rerank';

-- Turning it off: the distance ceiling decides again and no relevance is reported.
SELECT rag_set_reranker('rr', NULL);
SELECT count(*) AS returned, count(relevance) AS with_relevance
  FROM rag_query('rr', 'Where can I park my car at work?', 3, max_distance => 2);
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', rerank_candidates => 10);
SELECT reranker, rerank_candidates FROM rag.collections WHERE name = 'rr';

-- Bad settings fail with a reason and change nothing. (The messages name the model directory under the server's
-- share directory, shown as <sharedir> so that the expected output holds for every installation.)
DO $$
DECLARE
    v_model text;
    v_message text;
    v_hint text;
BEGIN
    FOREACH v_model IN ARRAY ARRAY['no-such-reranker', 'all-MiniLM-L6-v2'] LOOP
        BEGIN
            PERFORM rag_set_reranker('rr', v_model);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_message = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
            RAISE NOTICE 'ERROR (%): % HINT: %', SQLSTATE,
                replace(v_message, (SELECT setting FROM pg_catalog.pg_config WHERE name = 'SHAREDIR'), '<sharedir>'),
                v_hint;
        END;
    END LOOP;
END $$;
SELECT rag_set_reranker('rr', '../etc');
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', rerank_candidates => 0);
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_relevance => 'NaN');
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_lead => -1);
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_lead => 'NaN');
SELECT rag_create_collection('rr-bad', embedding_provider => 'local', rerank_candidates => 1000);
SELECT reranker, rerank_candidates, min_lead FROM rag.collections WHERE name = 'rr';
SELECT count(*) AS not_created FROM rag.collections WHERE name = 'rr-bad';
-- The table's own check holds the same range.
DO $$
BEGIN
    UPDATE rag.collections SET rerank_candidates = 201 WHERE name = 'rr';
EXCEPTION WHEN check_violation THEN
    RAISE NOTICE '%', SQLERRM;
END $$;

-- Only an admin of the collection chooses its reranker: not a reader of it, not an admin of other collections.
-- A reader's results are reranked all the same.
CREATE ROLE rr_reader LOGIN IN ROLE rag_reader;
CREATE ROLE rr_other_admin LOGIN IN ROLE rag_admin;
SELECT rag_grant('rr', 'rr_reader', 'read');
SET ROLE rr_reader;
SELECT rag_set_reranker('rr', NULL);
SELECT title, relevance IS NOT NULL AS reranked FROM rag_query('rr', 'Where can I park my car at work?', 1);
RESET ROLE;
SET ROLE rr_other_admin;
SELECT rag_set_reranker('rr', NULL);
SELECT rag_set_reranker('rr', 'ms-marco-MiniLM-L-12-v2', min_relevance => -100);
RESET ROLE;
SELECT reranker, min_relevance = rag._limit('min_relevance_default')::real AS unchanged FROM rag.collections WHERE name = 'rr';

-- A reranker served over HTTP: an OpenAI-compatible server with /rerank (llama.cpp's server, vLLM), here the test
-- server, whose score is 10 * cosine - 5 of its hash embeddings. The threshold is on the server's own scale.
SELECT rag_create_provider('rerank-server', 'openai', base_url => current_setting('rag.ollama_url') || '/v1');
SELECT rag_create_collection('rr-http', embedding_model => 'hash-384', reranker => 'rerank-test',
                             reranker_provider => 'rerank-server', min_relevance => -10) > 0 AS created;
-- Its model (the test server's hash-384) is not in rag_known_models(): the lead passes on relevance alone.
SELECT rag._model_max_distance(c.embedding_model) IS NULL AS unmeasured_model, c.min_lead > 0 AS with_a_lead,
       rag._close_enough(c, 0.01, (c.min_relevance - c.min_lead - 1)::real, 5, NULL) AS near_but_below_the_floor,
       rag._close_enough(c, 0.01, (c.min_relevance - c.min_lead)::real, 5, NULL) AS at_the_floor
  FROM rag.collections c WHERE c.name = 'rr-http';
SELECT rag_ingest('rr-http', 'Notice', 'Staff give thirty days notice in writing before leaving.') > 0,
       rag_ingest('rr-http', 'Parking', 'The garage behind the building is free for staff.') > 0,
       rag_ingest('rr-http', 'Payroll', 'Salaries are paid on the last working day of the month.') > 0;
SELECT rag_wait('rr-http', '60 seconds') AS ready;
SELECT title, round(relevance::numeric, 3) AS relevance
  FROM rag_query('rr-http', 'Staff give thirty days notice in writing before leaving.', 3, max_distance => 2);
SELECT line FROM rag_explain('rr-http', 'notice', 3) AS line WHERE line ~ '^Rerank';
-- Only what reaches the threshold on the server's scale comes back.
SELECT rag_set_reranker('rr-http', 'rerank-test', min_relevance => 0);
SELECT title FROM rag_query('rr-http', 'Staff give thirty days notice in writing before leaving.', 3, max_distance => 2);
-- Above every score, only the lead lets the first through: the server's first is also the nearest (its score is
-- the embeddings' cosine), far ahead of the second.
SELECT rag_set_reranker('rr-http', 'rerank-test', min_relevance => 6, min_lead => 3);
SELECT title, relevance < 6 AS below_threshold
  FROM rag_query('rr-http', 'Staff give thirty days notice in writing before leaving.', 3, max_distance => 2);
-- A reranker that disagrees with the vectors gives no lead. Reversed, the server puts first the passage farthest
-- from a question that repeats the other two: far ahead of the second, but not the nearest, so nothing passes.
\set both 'Staff give thirty days notice in writing before leaving. The garage behind the building is free for staff.'
SELECT rag_set_reranker('rr-http', 'rerank-test@reversed', min_relevance => 6, min_lead => 3);
SELECT count(*) AS returned FROM rag_query('rr-http', :'both', 3, max_distance => 2);
SELECT s.rank, d.title, s.relevance > 3 AS within_the_lead_of_the_threshold, s.lead IS NULL AS no_lead,
       s.relevance - lead(s.relevance) OVER (ORDER BY s.rank) > 3 AS far_ahead_of_the_next,
       s.distance = max(s.distance) OVER () AS farthest
  FROM rag.collections c, rag._search(c, (SELECT e.vector FROM rag._embed_query_in(c.id, :'both', c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e), 3, NULL, :'both') s
  JOIN rag.documents d ON d.id = s.document_id
 WHERE c.name = 'rr-http' ORDER BY s.rank;
SELECT rag_set_reranker('rr-http', 'rerank-test', min_relevance => 0, min_lead => rag._limit('min_lead_default')::real);
-- A server that fails, or answers what cannot be paired with the candidates, is an error naming it, not a
-- silently unranked list.
SELECT rag_set_reranker('rr-http', 'rerank-test@503');
SELECT count(*) FROM rag_query('rr-http', 'notice', 1);
SELECT rag_set_reranker('rr-http', 'rerank-test@countmismatch');
SELECT count(*) FROM rag_query('rr-http', 'notice', 1);
-- A server's scores at the two ends of real's range: each is finite, their difference is not a real. Every search
-- of the collection failed with "value out of range: overflow"; the lead is now held within the range.
SELECT rag_set_reranker('rr-http', 'rerank-test@extreme', min_relevance => 0);
SELECT title, relevance FROM rag_query('rr-http', 'Staff give thirty days notice in writing before leaving.', 3, max_distance => 2);
SELECT outcome, best_relevance FROM rag.queries WHERE collection = 'rr-http' ORDER BY id DESC LIMIT 1;
-- Ollama has no rerank API: refused when it is chosen.
SELECT rag_set_reranker('rr-http', 'anything', reranker_provider => 'ollama');
SELECT rag_set_reranker('rr-http', 'rerank-test', reranker_provider => 'nowhere');
SELECT reranker, reranker_provider FROM rag.collections WHERE name = 'rr-http';

-- Which candidates a reranker reads in hybrid mode: the keyword side's best N / 3 and the vector side's best of
-- the rest go first (in fused order), then the fused order fills the N. The fusion alone would leave out the
-- chunk that names the question's identifier: the keyword side's first, but its other words put it seventh on
-- the vector side.
SELECT rag_create_collection('rr-pool', embedding_model => 'hash-384', max_distance => 2, reranker => 'rerank-test',
                             reranker_provider => 'rerank-server', rerank_candidates => 3, min_relevance => -100) > 0 AS created;
SELECT rag_ingest('rr-pool', 'Long', 'E1234 disk controller failed, tape archive stopped.') > 0 AS a,
       rag_ingest('rr-pool', 'Full', 'Disk full.') > 0 AS b, rag_ingest('rr-pool', 'Slow', 'Disk slow.') > 0 AS c,
       rag_ingest('rr-pool', 'Quiet', 'Disk quiet.') > 0 AS d, rag_ingest('rr-pool', 'Spare', 'Disk spare.') > 0 AS e,
       rag_ingest('rr-pool', 'Cold', 'Disk cold.') > 0 AS f, rag_ingest('rr-pool', 'Warm', 'Disk warm.') > 0 AS g,
       rag_ingest('rr-pool', 'Other', 'Printers need toner.') > 0 AS h;
SELECT rag_wait('rr-pool', '60 seconds') AS ready;
CREATE FUNCTION pg_temp.side(p_mode text, p_question text) RETURNS TABLE (chunk_id bigint, rank integer)
LANGUAGE sql AS $$
    SELECT s.chunk_id, s.rank FROM rag.collections c,
           rag._search(c, (SELECT e.vector FROM rag._embed_query_in(c.id, p_question, c.embedding_provider, c.embedding_model, c.query_prefix, c.dimensions) e), 40, NULL, p_question, p_mode, false) s
     WHERE c.name = 'rr-pool'
$$;
WITH fused AS (SELECT f.chunk_id, f.rank, v.rank AS vector_rank, k.rank AS keyword_rank
                 FROM pg_temp.side('hybrid', 'disk E1234') f
                 LEFT JOIN pg_temp.side('vector', 'disk E1234') v ON v.chunk_id = f.chunk_id
                 LEFT JOIN pg_temp.side('keyword', 'disk E1234') k ON k.chunk_id = f.chunk_id)
SELECT (SELECT array_agg(d.title ORDER BY f.rank) FROM fused f JOIN rag.chunks ch ON ch.id = f.chunk_id
          JOIN rag.documents d ON d.id = ch.document_id WHERE f.rank <= 3) AS fused_top_3,
       (SELECT array_agg(d.title ORDER BY d.title) FROM fused f JOIN rag.chunks ch ON ch.id = f.chunk_id
          JOIN rag.documents d ON d.id = ch.document_id WHERE f.keyword_rank = 1) AS keyword_first,
       (SELECT array_agg(x.chunk_id ORDER BY x.chunk_id)
          FROM (SELECT f.chunk_id FROM fused f
                 ORDER BY coalesce(f.keyword_rank <= 1 OR f.vector_rank <= 2, false) DESC, f.rank LIMIT 3) x)
       = (SELECT array_agg(q.chunk_id ORDER BY q.chunk_id) FROM rag_query('rr-pool', 'disk E1234', 3) q) AS reranked_as_expected,
       (SELECT count(*) FROM rag_query('rr-pool', 'disk E1234', 3) q JOIN rag.documents d ON d.id = q.document_id
         WHERE d.title = 'Long') AS long_reranked;
SELECT line FROM rag_explain('rr-pool', 'disk E1234', 3) AS line WHERE line ~ '^Rerank';

SELECT rag_drop_collection('rr'), rag_drop_collection('rr-remote'), rag_drop_collection('rr-off'),
       rag_drop_collection('rr-http'), rag_drop_collection('rr-lead'), rag_drop_collection('rr-pool');
SELECT rag_drop_provider('rerank-server');
DROP ROLE rr_reader, rr_other_admin;

