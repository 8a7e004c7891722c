-- Run with pg_catalog first, then rag, and nothing else: schema.sql says why.
SET LOCAL search_path = pg_catalog, rag, pg_temp;

-- Content tables that stay indexed by themselves. rag_watch puts triggers on a table that queue only the keys
-- of rows whose indexed content changed, in the writer's transaction, one queue row per statement where it can
-- (rag._watch_trigger_mode says how: a row trigger in Rust gathering keys, transition tables, or PL/pgSQL row
-- triggers); an UPDATE's row trigger sits behind a WHEN clause, so an update of unrelated
-- columns calls no row trigger function. The worker reads each row's current content by key, so a burst of updates costs one
-- embedding of the final text, and only chunks whose text changed are embedded again.

-- jsonb_build_object('col', r.col, ...) for a list of columns, fifty columns to a call joined by ||: a function
-- takes at most 100 arguments, and a watch of 51 metadata columns was accepted and then failed on every row.
CREATE FUNCTION rag._columns_object(p_columns text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN cardinality(p_columns) = 0 OR p_columns IS NULL THEN '''{}''::jsonb'
                ELSE (SELECT string_agg(g.call, ' || ' ORDER BY g.part)
                        FROM (SELECT (n - 1) / 50 AS part,
                                     format('jsonb_build_object(%s)', string_agg(format('%L, r.%I', c, c), ', ' ORDER BY n)) AS call
                                FROM unnest(p_columns) WITH ORDINALITY u(c, n)
                               GROUP BY (n - 1) / 50) g)
           END
$$;

-- The SQL text of the bytes the columns of a row aliased r take as text, added up: what their metadata's JSON
-- takes at least, known before it is built (rag._sync_row).
CREATE FUNCTION rag._columns_size(p_columns text[]) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((SELECT string_agg(format('coalesce(octet_length(r.%I::text), 0)', c), ' + ' ORDER BY n)
                       FROM unnest(p_columns) WITH ORDINALITY u(c, n)), '0')
$$;

-- The SQL text of "what would be indexed" for a row aliased r: content, title, filter, metadata. Each
-- expression was checked by PostgreSQL's parser to be exactly one expression; the newline after it ends any
-- trailing "--" comment, so it cannot swallow the rest of the statement it is placed in.
CREATE FUNCTION rag._watch_exprs(w rag.watches, OUT content text, OUT title text, OUT filter text, OUT metadata text)
LANGUAGE sql IMMUTABLE AS $$
    SELECT format(E'(%s\n)::text', w.content_expr),
           format(E'(%s\n)::text', coalesce(w.title_expr, 'NULL')),
           format(E'coalesce((%s\n)::boolean, false)', coalesce(w.filter_expr, 'true')),
           rag._columns_object(w.metadata_columns)
$$;

-- The owner of the watched table.
CREATE FUNCTION rag._watch_owner(w rag.watches) RETURNS oid
LANGUAGE sql STABLE AS $$
    SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = w.source
$$;

-- The powers by which a role is, or can make itself, a superuser, its own or through any role it is a member of
-- (inherited or not, with or without SET: a member may give a SECURITY DEFINER function of theirs to the
-- role and call it): rolsuper ('superuser', or 'membership of superuser <role>'); the roles PostgreSQL
-- documents as able to gain superuser-level access, running programs (COPY … TO PROGRAM) or reading or writing
-- any file the server can; and before PostgreSQL 16, CREATEROLE, which could grant itself any of those (seen
-- on 15). Empty for a role without them; NULL for a role that does not exist (helper-97). A role that is a
-- member of no role (most owners of watched tables) has only its own attributes, without the walk: a filtered
-- insert's trigger asks at each statement, and the walk took about twice as long (not measured end to end).
CREATE FUNCTION rag._superuser_powers(p_role oid) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m WHERE m.member = p_role) THEN
            (SELECT CASE WHEN r.rolsuper THEN ARRAY['superuser']
                         WHEN r.rolcreaterole AND pg_catalog.current_setting('server_version_num')::integer < 160000
                         THEN ARRAY['CREATEROLE'] ELSE '{}'::text[] END
               FROM pg_catalog.pg_roles r WHERE r.oid = p_role)
        ELSE (WITH RECURSIVE reached(roleid) AS (
                  SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.oid = p_role
                  UNION
                  SELECT m.roleid FROM pg_catalog.pg_auth_members m JOIN reached ON m.member = reached.roleid)
              SELECT ARRAY(SELECT DISTINCT p.power
                             FROM reached JOIN pg_catalog.pg_roles g ON g.oid = reached.roleid
                            CROSS JOIN LATERAL (VALUES
                                (CASE WHEN g.rolsuper AND g.oid = p_role THEN 'superuser'
                                      WHEN g.rolsuper THEN 'membership of superuser ' || pg_catalog.quote_ident(g.rolname) END),
                                (CASE WHEN g.rolname IN ('pg_execute_server_program', 'pg_write_server_files',
                                                         'pg_read_server_files') THEN g.rolname::text END),
                                (CASE WHEN g.rolcreaterole
                                           AND pg_catalog.current_setting('server_version_num')::integer < 160000
                                      THEN 'CREATEROLE' END)) AS p(power)
                            WHERE p.power IS NOT NULL
                            ORDER BY 1)) END
$$;

-- Whether the watched table belongs to a role with a superuser's powers (rag._superuser_powers), or is being
-- given to one (p_owner), while its expressions were written by a role that could not act as that owner
-- already: a superuser, or a member of the owner role, could; an author with powers of their own could not
-- (one with pg_read_server_files only would have had a superuser run programs: helper-97). The expressions
-- run as the table's owner, as an index expression does, so a table handed to a superuser (ALTER TABLE …
-- OWNER TO, REASSIGN OWNED, or a superuser's pg_restore --no-owner) ran its author's code as a superuser: in
-- the worker unprompted and in the watch's trigger on any role's write, and an ordinary role made itself a
-- superuser by each route (helper-93); handed to a member of pg_execute_server_program, it let the author run
-- programs as the server. A written_by that names no role counts as a role that could not.
CREATE FUNCTION rag._watch_owner_untrusted(w rag.watches, p_owner oid DEFAULT NULL) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT coalesce(cardinality(rag._superuser_powers(o.owner)), 0) > 0
           AND NOT coalesce((SELECT r.rolsuper OR pg_catalog.pg_has_role(r.oid, o.owner, 'MEMBER')
                               FROM pg_catalog.pg_roles r WHERE r.rolname = w.written_by), false)
      FROM (SELECT coalesce(p_owner, rag._watch_owner(w)) AS owner) o
$$;

-- The role whose rights a watch's expressions run with: the owner of the watched table (or p_owner, whom it is
-- being given to), unless that is a superuser, or a role with a superuser's powers, who did not write them
-- (rag._watch_owner_untrusted), which is refused. Every evaluation of the expressions asks it: rag_watch's
-- check, rag_reindex, rag_watch_status, the worker, the triggers' install (ALTER TABLE … OWNER TO), REASSIGN
-- OWNED, and a filtered INSERT's trigger when its function's owner has such powers
-- (rag._watch_filter_may_run).
CREATE FUNCTION rag._watch_runs_as(w rag.watches, p_owner oid DEFAULT NULL) RETURNS oid
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_owner oid := coalesce(p_owner, rag._watch_owner(w));
BEGIN
    IF rag._watch_owner_untrusted(w, v_owner) THEN
        IF 'superuser' = ANY (rag._superuser_powers(v_owner)) THEN
            RAISE EXCEPTION 'the watch of % was written by %, and superuser % is to run it: rag runs no watch''s expressions as a superuser who did not write them',
                            w.source_name, coalesce(pg_catalog.quote_ident(w.written_by), 'a role not known'),
                            pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(v_owner))
                USING ERRCODE = 'insufficient_privilege',
                      DETAIL = 'A watch''s content, title and filter run with the rights of its table''s owner; giving the table to a superuser would run its author''s code as that superuser.',
                      HINT = format('Give the table to a role that is not a superuser, or rag_unwatch it; or, having read its expressions in rag.watches, have a superuser take them on: UPDATE rag.watches SET written_by = current_user WHERE id = %s.', w.id);
        END IF;
        RAISE EXCEPTION 'the watch of % was written by %, and % is to run it, with %: rag runs no watch''s expressions as a role with a superuser''s powers that did not write them',
                        w.source_name, coalesce(pg_catalog.quote_ident(w.written_by), 'a role not known'),
                        pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(v_owner)),
                        pg_catalog.array_to_string(rag._superuser_powers(v_owner), ', ')
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'A watch''s content, title and filter run with the rights of its table''s owner, and that role is, or can make itself, a superuser; only a superuser or a member of that role may write expressions it runs.',
                  HINT = format('Give the table to a role without those powers, or rag_unwatch it; or, having read its expressions in rag.watches, have a superuser take them on: UPDATE rag.watches SET written_by = current_user WHERE id = %s.', w.id);
    END IF;
    RETURN v_owner;
END $$;

-- For a filtered INSERT's trigger whose function's owner (p_role) has a superuser's powers: raises as
-- rag._watch_runs_as does when no such role wrote the filter, and is false when the watch's row is not in this
-- snapshot (then nothing is queued: rag._require_watches_current makes that a serialization failure under
-- REPEATABLE READ when the watch was made after the transaction began). SECURITY DEFINER: such an owner may
-- not read rag.watches. Executable only by owners of watched tables, whom it tells no more than the watch's
-- table, author and owner, which a reader of rag.watches and pg_class sees.
CREATE FUNCTION rag._watch_filter_may_run(p_watch_id integer, p_role oid, p_table oid) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    w rag.watches;
BEGIN
    SELECT * INTO w FROM rag.watches x WHERE x.id = p_watch_id;
    IF NOT FOUND THEN
        PERFORM rag._require_watches_current(ARRAY[p_table], false);
        RETURN false;
    END IF;
    PERFORM rag._watch_runs_as(w, p_role);
    RETURN true;
END $$;

-- Only the triggers a watch installed may queue keys for it: the row's watch must be on a table owned by the
-- role inserting (the triggers run as the table's owner), and the insert must come from inside a trigger.
-- The batch's id must be one the sequence has given (p_id; NULL when a trigger asks before it has one): the
-- table's owner may write batches for their own watch from a trigger of theirs, and one written with an id
-- ahead of the sequence (OVERRIDING SYSTEM VALUE) is what a restore half done looks like in a database that
-- never made a document (rag._restore_under_way), so every watch's indexing in the database stopped for good
-- (review of session 44). The same expression as the sign's probe, so no id passes here that it would count.
CREATE FUNCTION rag._may_queue_batch(p_watch_id integer, p_role name, p_id bigint DEFAULT NULL) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT pg_catalog.pg_trigger_depth() > 0
       AND (p_id IS NULL OR p_id < (SELECT s.last_value + s.is_called::integer FROM rag.row_batches_id_seq s))
       AND EXISTS (
        SELECT 1 FROM rag.watches w JOIN pg_catalog.pg_class c ON c.oid = w.source
         WHERE w.id = p_watch_id AND c.relowner = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = p_role))
$$;
ALTER TABLE rag.row_batches ENABLE ROW LEVEL SECURITY;
CREATE POLICY row_batches_from_own_triggers ON rag.row_batches FOR INSERT
    WITH CHECK (rag._may_queue_batch(watch_id, current_user, id));

-- A batch's id only orders the batches; nothing refers to it. A data-only restore replayed without
-- --disable-triggers hands the same ids out twice: the watched tables' rows fire their watches' triggers while
-- rag.row_batches' own rows come in, and both take ids before the restore sets the sequence (a dump sets every
-- sequence after every table's rows). The restore then failed at the table's key, at whichever of the two came
-- second: the dumped batches were lost, or the watched table's rows. Now a restored row whose id a trigger's
-- batch took goes past every row, and a trigger's batch passes over the ids restored rows hold (ON CONFLICT
-- in the inserts of rag._watch_install's triggers and of rag._queue_gathered_keys; without naming the key, which
-- would need SELECT on the table, and the table's owner only inserts).
-- - Past every row, not to the sequence's next value: restored rows past their sequence are how a worker tells
--   a restore under way in a database that never made a document (rag._restore_under_way), and it must not
--   spread the restored batches before their watches are in. In one step (max(id) + 1): however far ahead of
--   the sequence the restored ids run, one look, not a walk.
-- - Inserts made inside a trigger do not fire it (pg_trigger_depth), so a write to a watched table pays nothing
--   for it; a statement on a watched partition pays one look, when rag._queue_gathered_keys queues its keys at
--   its end. That row's id came from the sequence, and on a collision it takes the sequence's next one, as the
--   triggers' do (its loop; the setting rag_batch.from_sequence says so), rather than go past every row.
-- - Enabled ALWAYS: a replay run with session_replication_role = replica fires the watches' replica triggers,
--   which write batches as the others do. rag._on_alter_table puts it back after
--   the ENABLE TRIGGER ALL that ends a data-only pg_restore --disable-triggers.
-- - SECURITY DEFINER: a table owner's own INSERT outside a trigger, which the policy refuses after this trigger
--   has run, meets the policy's refusal and message, not a failed read of a table the owner may not read.
CREATE FUNCTION rag._row_batch_free_id() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_last bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM rag.row_batches b WHERE b.id = NEW.id) THEN
        IF pg_catalog.current_setting('rag_batch.from_sequence', true) = 'on' THEN
            -- rag._queue_gathered_keys' row, whose id the sequence gave: its loop takes the next one. Moved past
            -- every row, it went ahead of the sequence, which in a database that never made a document reads as
            -- a restore half done until the sequence passes it, and a table owner could make that happen by
            -- writing, from a trigger of theirs, the id the sequence was about to give (review of session 45).
            RETURN NEW;
        END IF;
        v_last := (SELECT max(b.id) FROM rag.row_batches b);
        IF v_last < 9223372036854775807 THEN
            NEW.id := v_last + 1;
        ELSE
            -- A row at the type's end (a dump holds whatever rag's owner wrote): the sequence's next free
            -- value, which moves the sequence past what it walks over.
            LOOP
                NEW.id := nextval('rag.row_batches_id_seq');
                EXIT WHEN NOT EXISTS (SELECT 1 FROM rag.row_batches b WHERE b.id = NEW.id);
            END LOOP;
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER row_batches_free_id BEFORE INSERT ON rag.row_batches FOR EACH ROW
    WHEN (pg_catalog.pg_trigger_depth() < 1) EXECUTE FUNCTION rag._row_batch_free_id();
ALTER TABLE rag.row_batches ENABLE ALWAYS TRIGGER row_batches_free_id;

-- The columns the indexed content can depend on: the columns the expressions read (rag.watches.read_columns:
-- NULL, every column, when one reads the whole row, has a subquery or calls a function that could read the
-- table itself, or no longer analyzes), the metadata columns and the key. This list decides who may read the
-- indexed text and which updates index it again. Catalogs only: a reader's search and the policies of
-- rag.documents call it, and nothing of the table's owner may run there. A recorded name the table no longer
-- has (a column renamed or dropped by a command rag_watch_alter does not see: ALTER VIEW … RENAME COLUMN on a
-- table, DROP TYPE … CASCADE) also means every column: left out, the indexed text of the renamed column would
-- be shown to whoever may read the others. NULL when the table has no column left, which readers must treat as
-- "not readable" (only a table-level SELECT then lets them in).
CREATE FUNCTION rag._watch_columns(w rag.watches) RETURNS text[]
LANGUAGE sql STABLE AS $$
    WITH live AS (
        SELECT a.attname::text AS name, a.attnum
          FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = w.source AND a.attnum > 0 AND NOT a.attisdropped),
    every AS (
        SELECT w.read_columns IS NULL
               OR EXISTS (SELECT 1 FROM unnest(w.read_columns || w.metadata_columns || w.key_columns) n(name)
                           WHERE NOT EXISTS (SELECT 1 FROM live l WHERE l.name = n.name)) AS all_columns)
    SELECT array_agg(l.name ORDER BY l.attnum)
      FROM live l, every e
     WHERE e.all_columns OR l.name = ANY (w.read_columns) OR l.name = ANY (w.metadata_columns)
        OR l.name = ANY (w.key_columns)
$$;

-- The columns a watch's expressions read, found by PostgreSQL's analyzer (rag._expression_columns, which runs
-- as the table's owner in a security-restricted operation: analysing a literal can run the owner's domain
-- checks); NULL, every column, when they read the whole row or could read the table by other means, or no
-- longer analyze (a column dropped since). Only rag._watch_install calls it, where the owner's code may run.
CREATE FUNCTION rag._watch_read_columns(w rag.watches) RETURNS text[]
LANGUAGE plpgsql AS $$
BEGIN
    -- Analysing is running code too (above): not as a superuser who did not write the expressions. What was
    -- found before stands; rag._watch_install refuses such an owner.
    IF rag._watch_owner_untrusted(w) THEN
        RETURN w.read_columns;
    END IF;
    RETURN rag._expression_columns(w.source, ARRAY[w.content_expr, w.title_expr, w.filter_expr]);
EXCEPTION WHEN OTHERS THEN
    -- Whatever failed (the owner's own domain check included), every column is the answer that cannot let a
    -- reader see more than their privileges allow; the abort of this block restores rag's identity.
    RETURN NULL;
END $$;

-- The schema of a type's equality operator (its default btree operator class's), quoted; pg_catalog where
-- there is none of its own (arrays, enums, records and domains over built-in types compare with pg_catalog's).
-- This and the two functions below are PL/pgSQL, not SQL, for their speed: a reader's search asks for a
-- watched row's condition once per candidate, and a SQL function with SET clauses is planned again at every
-- call (0.5 ms for this one; BENCHMARKS.md §4), where PL/pgSQL keeps its plans for the session.
CREATE FUNCTION rag._equality_schema(p_type oid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT pg_catalog.quote_ident(n.nspname)
                       FROM pg_catalog.pg_type t
                       JOIN pg_catalog.pg_opclass c
                         ON c.opcintype = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
                        AND c.opcmethod = 403 AND c.opcdefault
                       JOIN pg_catalog.pg_amop a ON a.amopfamily = c.opcfamily AND a.amopstrategy = 3
                        AND a.amoplefttype = c.opcintype AND a.amoprighttype = c.opcintype
                       JOIN pg_catalog.pg_operator o ON o.oid = a.amopopr
                       JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace
                      WHERE t.oid = p_type
                      LIMIT 1), 'pg_catalog');
END $$;

-- A table's name with its schema, whatever search_path reads it: a reader's row check runs with the reader's
-- own path (rag._row_visible), where regclass's output (qualified only as rag's own path needs) could name
-- another table.
CREATE FUNCTION rag._qualified_name(p_table regclass) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname)
              FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE c.oid = p_table);
END $$;

-- The condition that finds a watched row (as r) by its key ($1, jsonb): each key column compared with its
-- type's own equality operator, named with its schema. rag's search_path holds only pg_catalog and rag, and a
-- key of citext or isbn13 has its = elsewhere (unnamed, citext's would compare as text and miss the primary
-- key's index, and isbn13's would not be found at all).
CREATE FUNCTION rag._key_condition(w rag.watches) RETURNS text
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_table text := rag._qualified_name(w.source);
BEGIN
    RETURN (SELECT string_agg(format('r.%1$I OPERATOR(%2$s.=) (SELECT k.%1$I FROM pg_catalog.jsonb_populate_record(NULL::%3$s, $1) AS k)',
                                     k.column_name, rag._equality_schema(a.atttypid), v_table),
                              ' AND ' ORDER BY k.n)
              FROM unnest(w.key_columns) WITH ORDINALITY AS k(column_name, n)
              JOIN pg_catalog.pg_attribute a ON a.attrelid = w.source AND a.attname = k.column_name);
END $$;

-- Whether a trigger's batch of watch w not yet spread into rag.row_queue holds key p_key (rag._row_visible
-- asks the queue itself). The batch formats are rag.row_batches': key objects, a one-column key's values as
-- jsonb, or their array's text. A batch whose text does not read as an array counts as holding the key.
CREATE FUNCTION rag._row_batched(w rag.watches, p_key jsonb) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_batch record;
    v_value jsonb := CASE WHEN cardinality(w.key_columns) = 1 THEN p_key -> w.key_columns[1] END;
BEGIN
    FOR v_batch IN SELECT b.keys, b.key_values FROM rag.row_batches b WHERE b.watch_id = w.id LOOP
        IF v_batch.keys IS NOT NULL THEN
            IF v_batch.keys @> pg_catalog.jsonb_build_array(p_key)
               OR v_value IS NOT NULL AND v_batch.keys @> pg_catalog.jsonb_build_array(v_value) THEN
                RETURN true;
            END IF;
        ELSIF v_value IS NOT NULL THEN
            BEGIN
                IF v_batch.key_values::text[] @> ARRAY[p_key ->> w.key_columns[1]] THEN
                    RETURN true;
                END IF;
            EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
                RETURN true;
            END;
        END IF;
    END LOOP;
    RETURN false;
END $$;

-- May the calling role SELECT the watched row a document was made from, now? Table or column privileges on
-- every column the index reads, and the table's row-level security policies, evaluated as the caller (in a
-- security-restricted operation) by key: one indexed lookup. Retrieval asks this of every candidate chunk
-- that came from a watched table, so a reader finds only what the table itself would show them. The policies
-- (and the functions they call, which often name tables without a schema) run with the search_path the
-- caller called rag with, as they would in the caller's own SELECT of the table; the query itself names
-- everything with its schema, so that path cannot change what it reads.
-- p_collection_id is the searched collection: a watch of any other collection is answered false before
-- anything of its table runs. The search's join may evaluate the check on documents of every collection
-- before it joins them to the searched chunks, and another collection's table's policies then ran as every
-- reader who searched anything, copying what the reader may read, and their questions, for that table's
-- owner (red team 24).
-- Under row-level security the check is on the row's version too: a document whose row waits for the
-- worker after a write holds an earlier version's text, which the policies may have kept from this reader (a
-- row handed over and redacted in one UPDATE, a deleted row's key inserted again by the reader), so it is not
-- shown until it is synced (red team 24). Waiting: a trigger's batch not yet spread (rag._row_batched), or a
-- key in rag.row_queue that a write put there (not one rag_reindex only re-reads), including one whose sync
-- failed and waits out its back-off. One query, which looks into the batches only when the watch has some.
-- Its cost tells the planner what a call is (tens of microseconds: queries, and the owner's policies): at the
-- default cost, once the tables were analyzed, it preferred a scan that checked every chunk of the
-- collection before sorting them by distance to the HNSW index's ordered scan that checks a few candidates
-- (scripts/bench-visibility, red team 25).
CREATE FUNCTION rag._row_visible(p_collection_id integer, p_watch_id integer, p_key jsonb) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER COST 10000 AS $$
DECLARE
    w rag.watches;
    v_caller_name name;
    v_caller_path text;
    v_caller oid;
    v_super boolean;
    v_bypass boolean;
    v_column text;
BEGIN
    -- Role and path from one walk of the frames, read before the lookup: compared inside the query, the
    -- function would run once per role in pg_roles.
    SELECT i.role, i.search_path INTO v_caller_name, v_caller_path FROM rag._calling_identity() i;
    SELECT r.oid, r.rolsuper, r.rolbypassrls INTO v_caller, v_super, v_bypass
      FROM pg_catalog.pg_roles r WHERE r.rolname = v_caller_name;
    SELECT * INTO w FROM rag.watches WHERE id = p_watch_id AND collection_id = p_collection_id;
    -- No such watch in the searched collection: nothing to check a row against, so nothing is shown (the
    -- search never asks about a gone one: a watch's end sets its documents' watch_id to NULL in the same
    -- transaction).
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_super THEN
        RETURN true;
    END IF;
    IF NOT pg_catalog.has_table_privilege(v_caller, w.source, 'SELECT') THEN
        IF rag._watch_columns(w) IS NULL THEN
            RETURN false;
        END IF;
        FOREACH v_column IN ARRAY rag._watch_columns(w) LOOP
            IF NOT pg_catalog.has_column_privilege(v_caller, w.source, v_column, 'SELECT') THEN
                RETURN false;
            END IF;
        END LOOP;
    END IF;
    -- Privileges do not depend on the row's version; the policies do, for a role they apply to (PostgreSQL
    -- spares BYPASSRLS roles, and the table's owner unless it forces them).
    IF NOT v_bypass
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_class t
                    WHERE t.oid = w.source AND t.relrowsecurity
                      AND (t.relforcerowsecurity OR NOT pg_catalog.pg_has_role(v_caller, t.relowner, 'USAGE'))
                      AND (EXISTS (SELECT 1 FROM rag.row_queue q WHERE q.watch_id = w.id AND q.key = p_key AND q.changed)
                           OR EXISTS (SELECT 1 FROM rag.row_batches b WHERE b.watch_id = w.id)
                              AND rag._row_batched(w, p_key))) THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM rag._query_as(v_caller, rag._row_lookup_sql(w.id), p_key, v_caller_path));
END $$;

-- The watches whose whole table p_role may read without row-level security in the way: a superuser, a
-- role with the privileges of the table's owner (who bypasses its policies unless they are forced), or a role with SELECT on
-- every column the index reads of a table with no row-level security (or with BYPASSRLS). Catalog lookups
-- only: nothing of the table's owner's (policies, types, operators) runs for it. The policies below call it
-- once per query.
CREATE FUNCTION rag._watches_readable_whole(p_role name) RETURNS integer[]
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    -- Asked first, not inside the query, where the planner may never evaluate it (no watch to join with).
    v_role name := rag._acting_for(p_role);
BEGIN
    RETURN (
    SELECT coalesce(array_agg(w.id), '{}')
      FROM rag.watches w
      JOIN pg_catalog.pg_class t ON t.oid = w.source
      JOIN pg_catalog.pg_roles r ON r.rolname = v_role
     WHERE r.rolsuper
        OR pg_catalog.pg_has_role(r.oid, t.relowner, 'USAGE') AND NOT t.relforcerowsecurity
        OR ((NOT t.relrowsecurity OR r.rolbypassrls)
            AND (pg_catalog.has_table_privilege(r.oid, w.source, 'SELECT')
                 OR rag._watch_columns(w) IS NOT NULL
                    AND NOT EXISTS (SELECT 1 FROM unnest(rag._watch_columns(w)) col
                                 WHERE NOT pg_catalog.has_column_privilege(r.oid, w.source, col, 'SELECT')))));
END $$;

-- A plain SELECT of rag.documents or rag.chunks keeps the source table's rules too: a document made from a
-- watched row, and its chunks, are shown only to a role that may read that whole table (above). A reader who
-- may read only some of its rows finds them through retrieval (rag_query, rag_prompt, rag_ask: SECURITY
-- DEFINER, they bypass these policies and check every candidate row by key, rag._row_visible). Checking rows
-- by key here instead would run the table owner's policies with the rights of whoever selects, and cost a
-- lookup per row. The chunks' check goes through their document, and only in collections that watch a table.
ALTER TABLE rag.documents ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON rag.documents FOR SELECT
    USING (collection_id = ANY ((SELECT rag._collections_with(current_user, 'read'))::integer[])
           AND (watch_id IS NULL OR watch_id = ANY ((SELECT rag._watches_readable_whole(current_user))::integer[])));
ALTER TABLE rag.chunks ENABLE ROW LEVEL SECURITY;
CREATE POLICY readable ON rag.chunks FOR SELECT
    USING (collection_id = ANY ((SELECT rag._collections_with(current_user, 'read'))::integer[])
           AND (collection_id <> ALL ((SELECT coalesce(array_agg(w.collection_id), '{}') FROM rag.watches w)::integer[])
                OR EXISTS (SELECT 1 FROM rag.documents d WHERE d.id = chunks.document_id)));

CREATE FUNCTION rag._drop_watch_triggers(p_source oid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_trigger name;
    v_set_aside regprocedure[];
    v_function regprocedure;
BEGIN
    -- Functions these triggers run that no watch of this table has any more go with the last of them: set aside
    -- for a watch whose id another took (rag._set_aside_watch_functions), or left by a watch that is gone (a
    -- restore without rag's rows, rag_drop_collection). Only these, and only once nothing runs them: a function
    -- another table's triggers run is not this command's to drop (nor to wait for: its owner may hold a lock on
    -- it), though one these triggers run may belong to the table's earlier owner, whose lock would be waited for.
    v_set_aside := ARRAY(SELECT DISTINCT t.tgfoid::regprocedure FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
                          WHERE t.tgrelid = p_source AND t.tgparentid = 0 AND t.tgname LIKE 'rag\_watch\_%'
                            AND p.pronamespace = 'rag'::regnamespace
                            AND p.proname ~ '^_watch_[0-9]+(_row)?(_left_[0-9]+)?$'
                            AND NOT EXISTS (SELECT 1 FROM rag.watches w
                                             WHERE w.source = p_source
                                               AND p.proname IN ('_watch_' || w.id, '_watch_' || w.id || '_row')));
    -- Its own triggers only: a partition also has clones of its parent's, which go with the parent's.
    FOR v_trigger IN SELECT tgname FROM pg_trigger WHERE tgrelid = p_source AND tgparentid = 0
                                                     AND tgname LIKE 'rag\_watch\_%' LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', v_trigger, p_source::regclass);
    END LOOP;
    FOREACH v_function IN ARRAY v_set_aside LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgfoid = v_function) THEN
            EXECUTE format('DROP FUNCTION %s', v_function);
        END IF;
    END LOOP;
END $$;

-- How a statement trigger may pass a one-column key's values as array text, by the column's base type (a domain's
-- own type does not count): 'number' (int2/int4/int8/numeric) or 'string' (text/varchar/uuid), whose text forms
-- no session setting changes; NULL for any other type, whose keys go as jsonb. The worker turns the text back
-- with a cast to numeric[] or text[] only: never to the table owner's own types, whose input functions, domain
-- checks or casts it would otherwise run with its own rights.
-- How a watched table is named in rag.watches, rag_watch_status and its documents' "source": as a search_path
-- of the extension's schema (public, usually) would print it, whatever the path rag's functions run with
-- (sql/security.sql): the bare name in that schema (and for a temporary table), with its schema elsewhere.
CREATE FUNCTION rag._table_name(p_table regclass) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN c.relnamespace = (SELECT e.extnamespace FROM pg_catalog.pg_extension e WHERE e.extname = 'rag')
                     OR c.relpersistence = 't'
                THEN pg_catalog.quote_ident(c.relname)
                ELSE pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) END
      FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE c.oid = p_table
$$;

CREATE FUNCTION rag._plain_key_kind(p_source regclass, p_column name) RETURNS text
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE base(type_oid, depth) AS (
        SELECT a.atttypid, 0 FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = p_source AND a.attname = p_column AND NOT a.attisdropped
        UNION ALL
        SELECT t.typbasetype, b.depth + 1 FROM base b JOIN pg_catalog.pg_type t ON t.oid = b.type_oid
         WHERE t.typtype = 'd' AND b.depth < 32
    )
    SELECT CASE WHEN b.type_oid IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype, 'numeric'::regtype) THEN 'number'
                WHEN b.type_oid IN ('text'::regtype, 'varchar'::regtype, 'uuid'::regtype) THEN 'string' END
      FROM base b ORDER BY b.depth DESC LIMIT 1
$$;

-- How a watch's triggers find the keys of written rows. A partition or an inheritance child is written through
-- its parent too, which fires the child's row triggers but only the parent's statement triggers (rag_watch
-- refuses a partitioned table itself), so it has row triggers only:
-- - 'gather_at_end': the row trigger in Rust (rag._watch_key, third argument 'statement_end') gathers the keys
--   and rag queues them when the statement ends (src/api/watch_keys.rs, rag._queue_gathered_keys), for a
--   plain table's one-column key whose text needs no encoding conversion (rag._plain_key_kind; text only in a
--   UTF-8 database);
-- - 'rows': otherwise, a PL/pgSQL row trigger queues each row's key.
-- Any other table has statement triggers:
-- - 'gather': the row trigger in Rust gathers the keys and the statement trigger queues them, for such a key;
-- - 'statement': statement triggers with transition tables for INSERT and DELETE, and the PL/pgSQL row
--   trigger for UPDATE.
CREATE FUNCTION rag._watch_trigger_mode(w rag.watches) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN child THEN CASE WHEN gathers THEN 'gather_at_end' ELSE 'rows' END
        WHEN gathers THEN 'gather'
        ELSE 'statement' END
      FROM (SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = w.source AND c.relispartition)
                   OR EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhrelid = w.source) AS child,
                   cardinality(w.key_columns) = 1
                   AND (k.kind = 'number' OR (k.kind = 'string' AND pg_catalog.getdatabaseencoding() = 'UTF8'))
                   AND EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = w.source AND c.relkind = 'r')
                       AS gathers
              FROM (SELECT rag._plain_key_kind(w.source, w.key_columns[1]) AS kind) k) m
$$;

-- Queues the keys a partition's or an inheritance child's row trigger (rag._watch_key with 'statement_end')
-- gathered during one statement, as one batch. Called only by rag's library when the statement ends
-- (src/api/watch_keys.rs), through fmgr as PostgreSQL calls a trigger function: EXECUTE is granted to no one,
-- so no SQL can queue keys with it. It runs as rag's owner, which the queue's policy lets write, and queues
-- keys only for the watch of the table the trigger fired on, which a watch's own trigger always is. A watch
-- gone since the rows were written (rag_unwatch later in the same transaction) queues nothing and returns 0:
-- its table's rows are no longer indexed, and failing here could fail a COMMIT.
CREATE FUNCTION rag._queue_gathered_keys(p_watch_id integer, p_source oid, p_key_values text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_delay interval := coalesce(nullif(current_setting('rag.sync_delay', true), ''),
                                 rag._limit('sync_delay_default'))::interval;
    v_source oid;
    v_batch bigint;
BEGIN
    SELECT w.source INTO v_source FROM rag.watches w WHERE w.id = p_watch_id;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- A trigger naming another table's watch queues nothing for it. It used to fail its statement, which also
    -- failed every write to a watched partition whose watch a restore without rag's rows left out, once a new
    -- watch of another table took that id (review of session 44); queuing nothing keeps the other watch as safe.
    IF v_source <> p_source THEN
        RAISE WARNING 'rag: a rag._watch_key trigger on % names the watch of another table: the keys of its rows are not queued',
                      coalesce(rag._table_name(p_source::regclass), p_source::text)
            USING DETAIL = format('Watch %s watches %s.', p_watch_id, rag._table_name(v_source::regclass)),
                  HINT = 'Only the triggers rag_watch installs queue keys; drop this one, or run rag_watch for the table.';
        RETURN 0;
    END IF;
    -- Past the ids a data-only restore brought ahead of the sequence (rag._row_batch_free_id), taking the
    -- sequence's next ones: this insert is at trigger depth 0, so that trigger sees it, and is told (the setting)
    -- that its id came from the sequence.
    PERFORM pg_catalog.set_config('rag_batch.from_sequence', 'on', true);
    LOOP
        INSERT INTO rag.row_batches (watch_id, key_values, not_before)
        VALUES (p_watch_id, p_key_values, clock_timestamp() + v_delay)
        ON CONFLICT DO NOTHING
        RETURNING id INTO v_batch;
        EXIT WHEN FOUND;
    END LOOP;
    PERFORM pg_catalog.set_config('rag_batch.from_sequence', '', true);
    PERFORM rag._wake_worker();
    RETURN v_batch;
END $$;

-- The mode (rag._watch_trigger_mode) of the triggers a watched table has now, its own (not clones of a
-- parent's); NULL when the set is not whole: a restore creates them one at a time, with an ALTER TABLE between
-- them for a disabled or replica trigger (which runs rag._on_alter_table), and making them there would make
-- its next CREATE TRIGGER fail. pg_restore -j creates them in no fixed order, so a set counts as whole only by
-- its shape, never by which names are missing: the gathering statement triggers without their _key triggers
-- are no 'statement' set, whose DELETE trigger keeps the old rows (CI, PostgreSQL 18).
CREATE FUNCTION rag._watch_trigger_mode_installed(p_source oid) RETURNS text
LANGUAGE sql STABLE AS $$
    WITH own AS (SELECT t.tgname, t.tgtype, t.tgfoid, t.tgoldtable, t.tgnewtable FROM pg_catalog.pg_trigger t
                  WHERE t.tgrelid = p_source AND t.tgparentid = 0 AND t.tgname LIKE 'rag\_watch\_%')
    SELECT CASE
        WHEN (SELECT count(*) FROM own WHERE tgname IN ('rag_watch_insert', 'rag_watch_update', 'rag_watch_delete',
                                                        'rag_watch_truncate')) < 4
            THEN NULL
        -- Gathering: the three _key triggers, but for INSERT only where the insert trigger takes its own rows
        -- (a filtered watch's, which keeps the new rows).
        WHEN EXISTS (SELECT 1 FROM own WHERE tgname = 'rag_watch_update_key')
            THEN CASE WHEN EXISTS (SELECT 1 FROM own WHERE tgname = 'rag_watch_delete_key')
                           AND (EXISTS (SELECT 1 FROM own WHERE tgname = 'rag_watch_insert_key')
                                OR EXISTS (SELECT 1 FROM own WHERE tgname = 'rag_watch_insert' AND tgnewtable IS NOT NULL))
                      THEN 'gather' END
        WHEN EXISTS (SELECT 1 FROM own WHERE tgname LIKE 'rag\_watch\_%\_key')
            THEN NULL
        WHEN EXISTS (SELECT 1 FROM own WHERE tgname = 'rag_watch_insert' AND tgtype & 1 = 1
                                          AND tgfoid = pg_catalog.to_regprocedure('rag._watch_key()'))
            THEN 'gather_at_end'
        WHEN EXISTS (SELECT 1 FROM own WHERE tgname = 'rag_watch_insert' AND tgtype & 1 = 1)
            THEN 'rows'
        WHEN EXISTS (SELECT 1 FROM own WHERE tgname = 'rag_watch_delete' AND tgtype & 1 = 0 AND tgoldtable IS NOT NULL)
            THEN 'statement' END
$$;

-- What keeps a watched table's writes from reaching its watch, in words for rag.watch_status and rag_reindex;
-- NULL when nothing does. Its owner may drop or disable a trigger of rag's (the table is theirs), or make a
-- replica trigger ORIGIN, which a logical-replication subscriber's apply worker never fires (the ORIGIN that
-- ENABLE TRIGGER ALL leaves, rag._on_alter_table undoes). rag._on_alter_table leaves an incomplete set alone (it
-- cannot tell it from a restore half done), so nothing else would ever say so.
CREATE FUNCTION rag._watch_triggers_problem(p_source oid) RETURNS text
LANGUAGE sql STABLE AS $$
    WITH expected(tgname, fires) AS (
            VALUES ('rag_watch_insert', 'OA'), ('rag_watch_update', 'OA'), ('rag_watch_delete', 'OA'),
                   ('rag_watch_truncate', 'OA'), ('rag_watch_replica_insert', 'RA'),
                   ('rag_watch_replica_update', 'RA'), ('rag_watch_replica_delete', 'RA'),
                   ('rag_watch_replica_truncate', 'RA')),
         own AS (SELECT t.tgname, t.tgenabled FROM pg_catalog.pg_trigger t
                  WHERE t.tgrelid = p_source AND t.tgparentid = 0 AND t.tgname LIKE 'rag\_watch\_%'),
         missing AS (SELECT string_agg(e.tgname, ', ' ORDER BY e.tgname) AS names FROM expected e
                      WHERE NOT EXISTS (SELECT 1 FROM own o WHERE o.tgname = e.tgname)),
         idle AS (SELECT string_agg(o.tgname, ', ' ORDER BY o.tgname) AS names
                    FROM own o LEFT JOIN expected e ON e.tgname = o.tgname
                   WHERE pg_catalog.strpos(coalesce(e.fires, 'OA'), o.tgenabled::text) = 0)
    SELECT CASE
        WHEN (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = p_source) = 'p' THEN NULL
        WHEN m.names IS NOT NULL
            THEN format('the table lacks the watch''s triggers %s: writes to it since are not indexed', m.names)
        WHEN rag._watch_trigger_mode_installed(p_source) IS NULL
            THEN 'the table lacks some of the watch''s rag_watch_*_key triggers: writes to it since are not indexed'
        WHEN i.names IS NOT NULL
            THEN format('the watch''s triggers %s are disabled or enabled for the wrong sessions: writes they should '
                        'see are not indexed', i.names)
        -- A superuser replaced one of its functions by hand, and rag._silence_unmarked_watch_function made it do
        -- nothing.
        WHEN EXISTS (SELECT 1 FROM rag.watches w
                       JOIN pg_catalog.pg_proc p ON p.pronamespace = 'rag'::regnamespace
                                                AND p.proname IN ('_watch_' || w.id, '_watch_' || w.id || '_row')
                      WHERE w.source = p_source
                        AND p.prosrc = rag._watch_body_mark() || E'\n'
                                       || rag._silent_watch_body(w.id, p.proname LIKE '%\_row'))
            THEN 'the watch''s trigger functions were replaced and do nothing: writes to it since are not indexed'
        END
      FROM missing m, idle i
$$;

-- What a watched table's owner needs of rag to run the watch's triggers, which run as them: queue a batch,
-- wake the worker, drop their rights for the expressions, take the statement's keys; and, restoring a dump of
-- the table as its owner, create the row trigger (CREATE TRIGGER needs EXECUTE on its function).
CREATE FUNCTION rag._grant_watch_owner(p_owner name) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_function text;
BEGIN
    -- Only what the role lacks: a GRANT rewrites the object's catalog row even when nothing changes, and waits
    -- for any other transaction that is changing it (review of session 36).
    IF NOT pg_catalog.has_schema_privilege(p_owner, 'rag', 'USAGE') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA rag TO %I', p_owner);
    END IF;
    IF NOT pg_catalog.has_table_privilege(p_owner, 'rag.row_batches', 'INSERT') THEN
        EXECUTE format('GRANT INSERT ON rag.row_batches TO %I', p_owner);
    END IF;
    FOREACH v_function IN ARRAY rag._watch_owner_functions() LOOP
        IF NOT pg_catalog.has_function_privilege(p_owner, v_function, 'EXECUTE') THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', v_function, p_owner);
        END IF;
    END LOOP;
    PERFORM rag._revoke_watch_functions_public(p_owner);
END $$;

-- With p_owner, only that role's functions: rag_watch and rag_reindex call this for their table's owner, and a
-- REVOKE waits for any transaction changing the function's catalog row, which another owner may hold open on
-- a function of theirs (review of session 45). The worker's upkeep takes every owner's, with a lock_timeout
-- (src/store/mod.rs grant_watch_owners).
CREATE FUNCTION rag._revoke_watch_functions_public(p_owner name DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_function text;
BEGIN
    FOREACH v_function IN ARRAY rag._watch_functions_public(p_owner) LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', v_function);
    END LOOP;
END $$;

-- The watches' trigger functions that PUBLIC may run (p_owner's only, when given). rag_watch takes that away
-- (they run as the table's owner and queue keys for its watch, and CREATE TRIGGER needs nothing more than
-- EXECUTE), but a restore without privileges (pg_restore --no-acl, pg_dump -x) leaves a function's default,
-- PUBLIC's EXECUTE: any role could put one on a table of its own and queue keys for another owner's watch (red
-- team 27). Every function named as a watch's, not only those of the watches there are: a restore without rag's
-- rows as well brings functions back without their watch, which run as their owner all the same, and whose id a
-- later watch may take (review of session 44). Found by name, from the index on it (proname is of type name,
-- whose collation is C).
CREATE FUNCTION rag._watch_functions_public(p_owner name DEFAULT NULL) RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(p.oid::regprocedure::text ORDER BY p.oid), '{}')
      FROM pg_catalog.pg_proc p
     WHERE p.proname >= '_watch_0' AND p.proname < '_watch_:'
       AND p.pronamespace = 'rag'::regnamespace
       AND (p_owner IS NULL OR p.proowner = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = p_owner))
       AND p.proname ~ '^_watch_[0-9]+(_row)?(_left_[0-9]+)?$'
       AND (p.proacl IS NULL
            -- Only the owner's own grant, which the REVOKE takes back (one by a grantee it let grant would stay,
            -- and the worker would try again at every rest).
            OR EXISTS (SELECT 1 FROM pg_catalog.aclexplode(p.proacl) a
                        WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE' AND a.grantor = p.proowner))
$$;

-- The functions a watched table's owner must be able to run for the watch's triggers.
CREATE FUNCTION rag._watch_owner_functions() RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY['rag._wake_worker()', 'rag._restrict_to_current_user()', 'rag._may_queue_batch(integer, name, bigint)',
                 'rag._watch_keys_taken(integer, oid)', 'rag._watch_key()', 'rag._watch_filter_may_run(integer, oid, oid)',
                 'rag._superuser_powers(oid)']
$$;

-- Owners of watched tables who lack what the watch's triggers need (rag._grant_watch_owner): REASSIGN OWNED gave
-- a table to a role rag_watch never granted to, or a restore without privileges (pg_restore --no-acl, pg_dump -x)
-- left the grants out, after which every write to the table failed, a superuser's too (red team 23). The idle
-- worker asks at every rest: each owner once, and the functions by oid, named once per call (checked by name
-- for each watch it took 2.5 ms with five watches, growing with every watch; session 36's reread).
CREATE FUNCTION rag._watch_owners_lacking() RETURNS name[]
LANGUAGE sql STABLE AS $$
    WITH functions AS (
        SELECT array_agg(f::regprocedure) AS oids FROM unnest(rag._watch_owner_functions()) f
    ), owners AS (
        SELECT DISTINCT c.relowner FROM rag.watches w JOIN pg_catalog.pg_class c ON c.oid = w.source
    )
    SELECT coalesce(array_agg(r.rolname ORDER BY r.rolname), '{}')
      FROM owners o JOIN pg_catalog.pg_roles r ON r.oid = o.relowner, functions
     WHERE NOT pg_catalog.has_schema_privilege(o.relowner, 'rag', 'USAGE')
        OR NOT pg_catalog.has_table_privilege(o.relowner, 'rag.row_batches', 'INSERT')
        OR EXISTS (SELECT 1 FROM unnest(functions.oids) f
                    WHERE NOT pg_catalog.has_function_privilege(o.relowner, f::oid, 'EXECUTE'))
$$;

-- Grants them what they lack: after REASSIGN OWNED (rag._reassign_owned; no event trigger fires for that
-- command), and from the worker once no superuser's pg_restore is connected to the database (src/store/mod.rs
-- grant_watch_owners). rag_reindex grants its own table's owner. Granted to no role.
CREATE FUNCTION rag._grant_watch_owners() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_owner name;
BEGIN
    FOREACH v_owner IN ARRAY rag._watch_owners_lacking() LOOP
        PERFORM rag._grant_watch_owner(v_owner);
    END LOOP;
END $$;

-- Before REASSIGN OWNED (src/api/roles.rs, only for a caller with the privileges of every role it names, as
-- PostgreSQL then requires): a watched table's trigger functions belong to its owner but live in schema rag,
-- and PostgreSQL lets only a superuser give an object to a role without CREATE on its schema, so the command
-- failed for any other role. They go to the new role here, as rag's owner, before the command moves the tables;
-- rag._reassign_owned then grants the new owner what they need. Granted to no role.
CREATE FUNCTION rag._reassign_watch_functions(p_old oid[], p_new oid[]) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_function regprocedure;
    v_new name := (SELECT r.rolname FROM pg_catalog.pg_roles r WHERE r.oid = p_new[1]);
BEGIN
    IF v_new IS NULL THEN
        RETURN;
    END IF;
    -- The tables go to the new role too; to a superuser only where one wrote the watch.
    PERFORM rag._watch_runs_as(w, p_new[1])
       FROM rag.watches w JOIN pg_catalog.pg_class c ON c.oid = w.source
      WHERE c.relowner = ANY (p_old)
      ORDER BY w.id;
    FOR v_function IN
        SELECT p.oid::regprocedure
          FROM rag.watches w
          JOIN pg_catalog.pg_proc p ON p.pronamespace = 'rag'::regnamespace
                                   AND p.proname IN ('_watch_' || w.id, '_watch_' || w.id || '_row')
         WHERE p.proowner = ANY (p_old)
         ORDER BY p.oid
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO %I', v_function, v_new);
    END LOOP;
END $$;

-- The first line of every body rag makes for a watch's trigger function. rag._on_create_function tells by it a
-- function rag made (or a restore of a dump of this release brings back) from one made by a release whose
-- bodies ran the owner's expressions without this release's checks. A later release that changes it must go on
-- accepting this one: a dump of this release restores bodies that carry it, for watches whose rows come back.
CREATE FUNCTION rag._watch_body_mark() RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '-- made by rag._watch_install, format 2 (rag 0.2.0)'
$$;

-- (Re)makes one of a watch's trigger functions with the settings every one of them runs with: as its owner
-- (rag._watch_install and rag._silence_watch give it to the table's owner), rag's path, standard strings.
CREATE FUNCTION rag._replace_watch_function(p_function text, p_body text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE OR REPLACE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
                    SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on AS %L',
                   p_function, rag._watch_body_mark() || E'\n' || p_body);
END $$;

-- (Re)creates the trigger function and triggers of a watch. The trigger does as little as it can in the
-- writer's transaction: it finds the keys whose indexed content changed and writes them as ONE row per
-- statement (rag.row_batches); the worker spreads them into rag.row_queue later.
CREATE FUNCTION rag._watch_install(p_watch_id integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    w rag.watches;
    e record;
    v_owner name;
    v_key text;
    v_key_new text;
    v_key_old text;
    v_changed text;
    v_function text;
    v_referenced text[];
    v_row_function text;
    v_aggregate text;
    v_body text;
    v_key_kind text;
    v_mode text;
    -- rag._watch_key gathers the keys (every trigger but a filtered plain table's INSERT, and the replica ones).
    v_gathers boolean;
    v_event text;
    v_transition text;
    v_trigger name;
    v_when text;
    v_insert_keys text;
    v_delete_keys text;
    v_take_keys text;
    v_restore_session text;
    v_restore_session_end text;
    v_granted record;
BEGIN
    SELECT * INTO w FROM rag.watches WHERE id = p_watch_id;
    -- Its triggers run the filter as the table's owner: an ALTER TABLE … OWNER TO or REASSIGN OWNED that hands
    -- the table to a superuser who did not write the watch fails here.
    PERFORM rag._watch_runs_as(w);
    UPDATE rag.watches SET read_columns = rag._watch_read_columns(w) WHERE id = p_watch_id
    RETURNING * INTO w;
    SELECT * INTO e FROM rag._watch_exprs(w);
    SELECT pg_get_userbyid(c.relowner) INTO v_owner FROM pg_class c WHERE c.oid = w.source;
    v_key := rag._columns_object(w.key_columns);
    v_key_new := format('jsonb_build_object(%s)', (SELECT string_agg(format('%L, NEW.%I', k, k), ', ') FROM unnest(w.key_columns) k));
    v_key_old := format('jsonb_build_object(%s)', (SELECT string_agg(format('%L, OLD.%I', k, k), ', ') FROM unnest(w.key_columns) k));
    -- An UPDATE that changes none of the columns the index depends on cannot change what is indexed, and is
    -- recognised without evaluating any expression. Compared by their stored images (record_image_eq, called
    -- as a function: ROW(...) *= ROW(...) would compare column by column), not with each type's own =: that needs no operator of the column's type (hstore's, pgvector's, a user's
    -- type's are outside rag's search_path), and it errs towards "changed" (1.0 and 1.00 differ).
    v_referenced := rag._watch_columns(w);
    v_changed := format('NOT pg_catalog.record_image_eq(ROW(%s), ROW(%s))',
                        (SELECT string_agg(format('NEW.%I', c), ', ') FROM unnest(v_referenced) c),
                        (SELECT string_agg(format('OLD.%I', c), ', ') FROM unnest(v_referenced) c));
    -- A single-column key is kept as the text of a plain array of values (the cheapest to build for 100,000
    -- rows: to_jsonb of the array took longer than the array); the worker makes it jsonb, then turns each value
    -- back into {"column": value} when it spreads the batch.
    v_key_kind := CASE WHEN cardinality(w.key_columns) = 1 THEN rag._plain_key_kind(w.source, w.key_columns[1]) END;
    v_aggregate := CASE WHEN cardinality(w.key_columns) > 1 THEN format('jsonb_agg(%s), NULL::text', v_key)
                        WHEN v_key_kind IS NOT NULL
                        THEN format('NULL::jsonb, array_agg(r.%I)::text', w.key_columns[1])
                        ELSE format('to_jsonb(array_agg(r.%I)), NULL::text', w.key_columns[1]) END;
    -- The keys of inserted, updated and deleted rows are gathered by a row trigger in Rust (rag._watch_key,
    -- src/api/watch_keys.rs) and queued as one batch by the statement trigger, rather than read from a
    -- transition table (which copies every inserted or deleted row whole) or queued row by row by PL/pgSQL (an
    -- UPDATE of 100,000 rows' content: 100,000 function calls and batches), where rag._watch_trigger_mode
    -- says it can; for inserts, only without a filter (the owner's expression needs the owner's rights, which
    -- the statement trigger gives once, and a row trigger would have to give per row; an UPDATE's or a
    -- DELETE's keys are queued whatever the filter says, and the worker applies it).
    v_mode := rag._watch_trigger_mode(w);
    v_gathers := v_mode IN ('gather', 'gather_at_end');
    -- A restore's session has row_security off (pg_dump's scripts and pg_restore set it), under which the
    -- queue's policy fails the insert of an owner who is not a superuser instead of applying it: a data-only
    -- restore, whose rows fire these triggers, stopped at the first watched table such an owner had. There the
    -- batch is queued with it on for that one statement (set back at once, so the session goes on as it was),
    -- and not at all while the watch's own row is not restored yet (a table in a schema that sorts before rag:
    -- its documents come with the dump). Elsewhere this costs a look at one setting.
    v_restore_session := format($f$IF pg_catalog.current_setting('row_security') = 'off' THEN
                IF NOT rag._may_queue_batch(%s, current_user) THEN
                    RETURN NULL;
                END IF;
                v_row_security_off := true;
                PERFORM pg_catalog.set_config('row_security', 'on', true);
            END IF;$f$, w.id);
    v_restore_session_end := $f$IF v_row_security_off THEN
                PERFORM pg_catalog.set_config('row_security', 'off', true);
            END IF;$f$;
    v_take_keys := format('v_key_values := rag._watch_keys_taken(%s, TG_RELID);', w.id);
    -- A filter runs here as this function's owner. Where that owner has a superuser's powers (a superuser's
    -- pg_restore --no-owner makes such a copy without any install; a role granted pg_read_server_files after
    -- its table was handed over is another), it asks first whether such a role wrote the filter
    -- (rag._watch_filter_may_run); for anyone else the look costs a walk up pg_auth_members. Without its watch's row in
    -- this snapshot it runs nothing and queues nothing: a restore without rag's rows, or one not restored yet (a
    -- data-only replay, which v_restore_session also lets pass), or, under REPEATABLE READ, a watch made after
    -- the transaction began (a serialization failure: retried, the row is queued).
    v_insert_keys := CASE WHEN v_mode = 'gather' AND w.filter_expr IS NULL THEN v_take_keys
                          WHEN w.filter_expr IS NULL
                          THEN format('SELECT %s INTO v_keys, v_key_values FROM new_rows r WHERE %s;', v_aggregate, e.filter)
                          ELSE format($f$v_runs_as := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user);
                IF pg_catalog.cardinality(rag._superuser_powers(v_runs_as)) > 0 THEN
                    IF NOT rag._watch_filter_may_run(%1$s, v_runs_as, TG_RELID) THEN
                        RETURN NULL;
                    END IF;
                END IF;
                SELECT %2$s INTO v_keys, v_key_values FROM new_rows r WHERE %3$s;$f$, w.id, v_aggregate, e.filter) END;
    v_delete_keys := CASE WHEN v_mode = 'gather' THEN v_take_keys
                          ELSE format('SELECT %s INTO v_keys, v_key_values FROM old_rows r;', v_aggregate) END;
    v_function := format('rag.%I', '_watch_' || w.id);
    v_row_function := format('rag.%I', '_watch_' || w.id || '_row');
    -- The bodies are made first and passed as one quoted literal (%L): an expression holds whatever a string
    -- literal may, "$body$" included, and spliced inside dollar quotes it could end the body and add
    -- statements of its own to what this function runs as the extension's owner.
    v_body := format($f$
        DECLARE
            -- A burst of writes to one row keeps pushing its turn back: the worker embeds the final text once.
            v_delay interval := coalesce(nullif(current_setting('rag.sync_delay', true), ''), %4$L)::interval;
            v_keys jsonb;
            v_key_values text;
            v_row_security_off boolean := false;
            v_runs_as oid;
        BEGIN
            -- The owner's filter runs in the writer's statement: as the owner, in a security-restricted
            -- operation, the way PostgreSQL runs an index expression (and rag refuses to act for anyone there).
            PERFORM rag._restrict_to_current_user();
            IF TG_OP = 'INSERT' THEN
                %5$s
            ELSIF TG_OP = 'UPDATE' THEN
                %7$s
            ELSE
                %6$s
            END IF;
            IF v_keys IS NOT NULL OR v_key_values IS NOT NULL THEN
                %8$s
                -- Past the ids a data-only restore brought ahead of the sequence (rag._row_batch_free_id).
                LOOP
                    INSERT INTO rag.row_batches (watch_id, keys, key_values, not_before)
                    VALUES (%1$s, v_keys, v_key_values, clock_timestamp() + v_delay)
                    ON CONFLICT DO NOTHING;
                    EXIT WHEN FOUND;
                END LOOP;
                %9$s
                PERFORM rag._wake_worker();
            END IF;
            RETURN NULL;
        END $f$, w.id, v_aggregate, e.filter, rag._limit('sync_delay_default'), v_insert_keys, v_delete_keys, v_take_keys,
           v_restore_session, v_restore_session_end);
    PERFORM rag._set_aside_watch_functions(w.id, w.source);
    PERFORM rag._replace_watch_function(v_function, v_body);
    -- Where rag._watch_key does not gather the keys, UPDATE is row-level behind a WHEN clause over the columns
    -- the index depends on (as rag._watch_key's trigger is): an UPDATE of other columns never calls a
    -- function and captures no transition table, which a statement-level trigger with one cannot avoid
    -- (PostgreSQL captures every updated row for it first). In the 'rows' mode INSERT and DELETE are
    -- row-level too. It evaluates no expression of the owner's: only the key columns (the worker applies the
    -- filter).
    v_body := format($f$
        DECLARE
            v_delay interval := coalesce(nullif(current_setting('rag.sync_delay', true), ''), %4$L)::interval;
            v_new jsonb;
            v_old jsonb;
            v_keys jsonb;
            v_row_security_off boolean := false;
        BEGIN
            IF TG_OP = 'INSERT' THEN
                v_keys := jsonb_build_array(%2$s);
            ELSIF TG_OP = 'DELETE' THEN
                v_keys := jsonb_build_array(%3$s);
            ELSE
                v_new := %2$s;
                v_old := %3$s;
                v_keys := CASE WHEN v_new = v_old THEN jsonb_build_array(v_new) ELSE jsonb_build_array(v_new, v_old) END;
            END IF;
            %5$s
            LOOP
                INSERT INTO rag.row_batches (watch_id, keys, not_before)
                VALUES (%1$s, v_keys, clock_timestamp() + v_delay)
                ON CONFLICT DO NOTHING;
                EXIT WHEN FOUND;
            END LOOP;
            %6$s
            PERFORM rag._wake_worker();
            RETURN NULL;
        END $f$, w.id, v_key_new, v_key_old, rag._limit('sync_delay_default'), v_restore_session, v_restore_session_end);
    -- The table's owner runs the triggers, so the expressions never run with more rights than the table's.
    -- Where rag._watch_key gathers the keys, no trigger runs the row function (the replica triggers gather
    -- too); one an earlier install made goes with the table's triggers below.
    IF NOT v_gathers THEN
        PERFORM rag._replace_watch_function(v_row_function, v_body);
        EXECUTE format('ALTER FUNCTION %s() OWNER TO %I', v_row_function, v_owner);
    END IF;
    EXECUTE format('ALTER FUNCTION %s() OWNER TO %I', v_function, v_owner);
    -- Nobody may put them on a table of their own (CREATE TRIGGER needs EXECUTE; firing one does not): they run
    -- as the watched table's owner and queue keys for this watch. Not PUBLIC, nor anyone the functions' earlier
    -- owner granted them to: CREATE OR REPLACE keeps the grants and ALTER FUNCTION … OWNER hands them to the new
    -- owner, so after the table changed hands its old owner's grantees (the old owner among them, through a
    -- role of theirs) could attach the function, which then ran as the new owner, over rows they chose
    -- (review of session 45).
    -- One pass over both functions' grants, PUBLIC's included (a new function's NULL acl is the default: its
    -- owner's and PUBLIC's EXECUTE).
    FOR v_granted IN
        SELECT DISTINCT p.oid::regprocedure::text AS function,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(r.rolname) END AS grantee
          FROM pg_catalog.pg_proc p
         CROSS JOIN LATERAL pg_catalog.aclexplode(coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))) a
          LEFT JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
         WHERE p.oid IN (pg_catalog.to_regprocedure(v_function || '()'), pg_catalog.to_regprocedure(v_row_function || '()'))
           AND a.grantee <> p.proowner
         ORDER BY 1, 2
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %s CASCADE', v_granted.function, v_granted.grantee);
    END LOOP;
    PERFORM rag._grant_watch_owner(v_owner);
    PERFORM rag._drop_watch_triggers(w.source);
    -- Dropped with no trigger left that runs it; set aside when the owner put it on a table of theirs under
    -- another trigger's name, which rag._drop_watch_triggers leaves (a DROP would fail this install).
    IF v_gathers AND pg_catalog.to_regprocedure(v_row_function || '()') IS NOT NULL THEN
        PERFORM rag._set_aside_watch_function(w.id, '_watch_' || w.id || '_row');
    END IF;
    FOR v_event, v_transition IN VALUES ('INSERT', 'NEW'), ('UPDATE', NULL), ('DELETE', 'OLD') LOOP
        v_trigger := 'rag_watch_' || lower(v_event);
        v_when := CASE WHEN v_event = 'UPDATE' THEN format(' WHEN (%s)', v_changed) ELSE '' END;
        IF v_mode = 'gather' AND NOT (v_event = 'INSERT' AND w.filter_expr IS NOT NULL) THEN
            -- PostgreSQL fires a statement's row events before its statement event, so the statement trigger
            -- finds every key of its statement gathered. It fires for every UPDATE of the table, a few
            -- microseconds for one that changed nothing indexed; UPDATE OF its columns would not fire when a
            -- BEFORE trigger of the owner's changed them.
            EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW%s EXECUTE FUNCTION rag._watch_key(%L, %L)',
                           v_trigger || '_key', v_event, w.source::regclass, v_when, w.id, w.key_columns[1]);
            EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()',
                           v_trigger, v_event, w.source::regclass, v_function);
        ELSIF v_mode = 'gather_at_end' THEN
            -- No statement trigger: rows written through the parent would not fire it. rag queues what the row
            -- trigger gathered when the statement ends.
            EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW%s EXECUTE FUNCTION rag._watch_key(%L, %L, %L)',
                           v_trigger, v_event, w.source::regclass, v_when, w.id, w.key_columns[1], 'statement_end');
        ELSIF v_mode = 'rows' OR v_transition IS NULL THEN
            EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW%s EXECUTE FUNCTION %s()',
                           v_trigger, v_event, w.source::regclass, v_when, v_row_function);
        ELSE
            EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s REFERENCING %s TABLE AS %I FOR EACH STATEMENT EXECUTE FUNCTION %s()',
                           v_trigger, v_event, w.source::regclass, v_transition, lower(v_transition) || '_rows', v_function);
        END IF;
    END LOOP;
    EXECUTE format('CREATE TRIGGER rag_watch_truncate AFTER TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION rag._watch_truncated()',
                   w.source::regclass);
    -- A logical-replication subscriber's apply worker runs with session_replication_role = replica, which fires
    -- only triggers enabled REPLICA or ALWAYS, and of statement triggers only TRUNCATE's: the triggers above
    -- (enabled ORIGIN) would miss every row it applies, and enabling them ALWAYS would still lose the keys that
    -- their statement triggers queue. So each watch also has row triggers enabled REPLICA, which fire in nothing
    -- but such a session: an ordinary writer never pays more than PostgreSQL's look at a disabled trigger.
    -- Where rag._watch_key can read the key, they gather keys as a partition's do: rag queues them when a
    -- statement ends, or, in an apply worker, which ends no statement, at its commit, one batch per applied
    -- transaction and table (and one per WATCH_KEYS_FLUSH_BYTES of keys within it, src/limits.rs). The PL/pgSQL
    -- row function they ran before queued a batch per row: a subscription's initial copy of 200,000 rows took
    -- about 10 times as long as into a table not watched (BENCHMARKS.md §3, "Rows a subscriber applies"). A
    -- filtered watch's inserts are gathered unfiltered: the worker applies the filter. Other keys keep the 'rows'
    -- way (the PL/pgSQL row function, one batch per row).
    -- They stay idle in any other session even when someone enables them ALWAYS, or ENABLE TRIGGER ALL (what
    -- pg_restore --disable-triggers ends with) resets them to ORIGIN: they would otherwise queue every row a
    -- second time. rag._watch_key's 'replica' asks the setting itself; a WHEN clause, which the apply worker
    -- compiles again for every row, asks it for the PL/pgSQL function, and UPDATE's also holds the columns the
    -- index depends on.
    FOR v_event IN VALUES ('INSERT'), ('UPDATE'), ('DELETE') LOOP
        v_trigger := 'rag_watch_replica_' || lower(v_event);
        IF v_gathers THEN
            v_when := CASE WHEN v_event = 'UPDATE' THEN format(' WHEN (%s)', v_changed) ELSE '' END;
            EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW%s EXECUTE FUNCTION rag._watch_key(%L, %L, %L)',
                           v_trigger, v_event, w.source::regclass, v_when, w.id, w.key_columns[1], 'replica');
        ELSE
            v_when := format(' WHEN (pg_catalog.current_setting(%L) = %L%s)', 'session_replication_role', 'replica',
                             CASE WHEN v_event = 'UPDATE' THEN format(' AND %s', v_changed) ELSE '' END);
            EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s FOR EACH ROW%s EXECUTE FUNCTION %s()',
                           v_trigger, v_event, w.source::regclass, v_when, v_row_function);
        END IF;
        EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER %I', w.source::regclass, v_trigger);
    END LOOP;
    EXECUTE format('CREATE TRIGGER rag_watch_replica_truncate AFTER TRUNCATE ON %s FOR EACH STATEMENT '
                   'WHEN (pg_catalog.current_setting(%L) = %L) EXECUTE FUNCTION rag._watch_truncated()',
                   w.source::regclass, 'session_replication_role', 'replica');
    EXECUTE format('ALTER TABLE %s ENABLE REPLICA TRIGGER rag_watch_replica_truncate', w.source::regclass);
END $$;

-- The worker's first step: spread statement batches of keys into one queue row per key, the newest turn
-- winning, so a key written by many statements is processed once.
-- The watches whose batches this session found held by another transaction within the last 5 seconds; with an
-- argument, records that watch as held now. Kept in the session (a worker's memory, as a setting of its own
-- backend): it is only a hint to spare a lock_timeout per look, and a held watch is looked at again after it.
CREATE FUNCTION rag._spread_waiting(p_held integer DEFAULT NULL) RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    v_now double precision := extract(epoch FROM clock_timestamp());
    v_kept jsonb := coalesce(nullif(current_setting('rag_worker.held_watches', true), ''), '{}')::jsonb;
    v_watches integer[];
BEGIN
    -- Nothing held and nothing to record, a worker's every round: no setting is written.
    IF p_held IS NULL AND v_kept = '{}' THEN
        RETURN '{}';
    END IF;
    SELECT coalesce(jsonb_object_agg(k, v), '{}') INTO v_kept
      FROM jsonb_each(v_kept) e(k, v) WHERE (e.v)::double precision > v_now - 5;
    IF p_held IS NOT NULL THEN
        v_kept := v_kept || jsonb_build_object(p_held::text, v_now);
    END IF;
    PERFORM set_config('rag_worker.held_watches', v_kept::text, false);
    SELECT coalesce(array_agg(k::integer), '{}') INTO v_watches FROM jsonb_object_keys(v_kept) k;
    RETURN v_watches;
END $$;

CREATE FUNCTION rag._spread_batches(p_limit integer DEFAULT 1000) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_count bigint;
    v_batch record;
    v_waiting integer[] := '{}';
    -- rag_process_queue run by a role that is not a superuser spreads only the batches of the watches of the
    -- collections it may process (rag._claim_scope): the others', held until its caller's transaction ends, kept
    -- every other session's rows from the worker meanwhile (review of red team 12).
    v_scope integer[] := rag._claim_scope();
    v_outside integer[] := CASE WHEN rag._claim_scope() IS NOT NULL
                                THEN ARRAY(SELECT w.id FROM rag.watches w
                                            WHERE NOT w.collection_id = ANY (rag._claim_scope())) END;
BEGIN
    -- Values of a one-column key, as a trigger left them, become a jsonb array: numbers for a numeric key, as
    -- rag.row_queue's keys and the UPDATE trigger's have them, strings otherwise (rag._plain_key_kind). A batch
    -- whose values do not cast (the key column's type changed meanwhile) keeps them as strings, and so does a
    -- batch whose watch is gone (the triggers a restore brought back without their watch, on a table a
    -- superuser owns, queue them): rag._spread_batches_of then drops it with the other batches of watches that
    -- are gone, where before it stayed for good.
    FOR v_batch IN
        SELECT b.id, rag._plain_key_kind(w.source, w.key_columns[1]) AS kind
          FROM rag.row_batches b
          LEFT JOIN rag.watches w ON w.id = b.watch_id
         WHERE b.key_values IS NOT NULL AND (v_scope IS NULL OR w.collection_id = ANY (v_scope))
         ORDER BY b.id LIMIT p_limit
           FOR UPDATE OF b SKIP LOCKED
    LOOP
        BEGIN
            IF v_batch.kind = 'number' THEN
                UPDATE rag.row_batches SET keys = to_jsonb(key_values::numeric[]), key_values = NULL WHERE id = v_batch.id;
            ELSE
                UPDATE rag.row_batches SET keys = to_jsonb(key_values::text[]), key_values = NULL WHERE id = v_batch.id;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            BEGIN
                UPDATE rag.row_batches SET keys = to_jsonb(key_values::text[]), key_values = NULL WHERE id = v_batch.id;
            EXCEPTION WHEN data_exception OR integrity_constraint_violation OR program_limit_exceeded THEN
                -- Not an array's text at all: nothing can be made of it, and it must not stop every other watch.
                RAISE WARNING 'rag: dropping batch % of watched keys, which cannot be read: %', v_batch.id, SQLERRM;
                DELETE FROM rag.row_batches WHERE id = v_batch.id;
            END;
        END;
    END LOOP;
    -- Watches whose keys another transaction held at one of this session's last rounds (below) are left out for
    -- a few seconds: each look at them costs a lock_timeout, and a worker spreads before every row it claims.
    v_waiting := rag._spread_waiting() || coalesce(v_outside, '{}');
    BEGIN
        RETURN rag._spread_batches_of(NULL, p_limit, v_waiting);
    EXCEPTION WHEN data_exception OR integrity_constraint_violation OR program_limit_exceeded
                   OR lock_not_available THEN
        -- Something in one batch must not stop every other watch's: each batch alone then.
        -- - One whose own data fails (a table's owner may write their own watch's batches) is dropped with a
        --   WARNING naming it.
        -- - One whose keys another transaction holds in rag.row_queue (a rag_reindex, a TRUNCATE of the watched
        --   table or a rag_process_queue left open: rag._spread_batches_of waits at most lock_timeout) stays
        --   for a later round with the rest of its watch's, and the watch is left out for a few seconds; the
        --   others go on, however many batches the held watch has.
        -- Any other error (a cancel, memory) is not the batch's fault and stops the round, keeping every batch.
        v_count := 0;
        FOR i IN 1..p_limit LOOP
            SELECT b.id, b.watch_id INTO v_batch FROM rag.row_batches b
             WHERE b.keys IS NOT NULL AND b.watch_id <> ALL (v_waiting)
             ORDER BY b.id LIMIT 1 FOR UPDATE SKIP LOCKED;
            EXIT WHEN NOT FOUND;
            BEGIN
                v_count := v_count + rag._spread_batches_of(v_batch.id, 1, '{}');
            EXCEPTION
                WHEN lock_not_available THEN
                    v_waiting := v_waiting || v_batch.watch_id;
                    PERFORM rag._spread_waiting(v_batch.watch_id);
                WHEN data_exception OR integrity_constraint_violation OR program_limit_exceeded THEN
                    RAISE WARNING 'rag: dropping batch % of watch %, whose keys cannot be queued: %',
                                  v_batch.id, v_batch.watch_id, SQLERRM;
                    DELETE FROM rag.row_batches WHERE id = v_batch.id;
            END;
        END LOOP;
        RETURN v_count;
    END;
END $$;

-- Moves batches of keys into rag.row_queue: p_batch_id alone, or the first p_limit (any batch written since the
-- caller looked waits for the next round). A key whose queue row another transaction holds makes it wait at
-- most lock_timeout: a user's open transaction must not hold the worker, which serves every collection.
CREATE FUNCTION rag._spread_batches_of(p_batch_id bigint, p_limit integer, p_skip_watches integer[])
RETURNS bigint
LANGUAGE plpgsql SET lock_timeout = '20ms' AS $$
DECLARE
    v_count bigint;
BEGIN
    WITH taken AS (
        DELETE FROM rag.row_batches WHERE id IN (
            SELECT id FROM rag.row_batches WHERE keys IS NOT NULL AND (p_batch_id IS NULL OR id = p_batch_id)
               AND watch_id <> ALL (p_skip_watches)
             ORDER BY id LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING watch_id, keys, not_before
    ), keys AS (
        SELECT DISTINCT ON (t.watch_id, key) t.watch_id, key, t.not_before
          FROM taken t
          JOIN rag.watches w ON w.id = t.watch_id
          CROSS JOIN LATERAL jsonb_array_elements(t.keys) AS k(element)
          CROSS JOIN LATERAL (SELECT CASE WHEN jsonb_typeof(k.element) = 'object' THEN k.element
                                          ELSE jsonb_build_object(w.key_columns[1], k.element) END) AS o(key)
         ORDER BY t.watch_id, key, t.not_before DESC
    )
    INSERT INTO rag.row_queue AS q (watch_id, key, not_before)
    SELECT watch_id, key, not_before FROM keys
    ON CONFLICT (watch_id, key) DO UPDATE
       SET version = q.version + 1, attempts = 0, changed = true,
           -- A failed row waiting out its back-off is tried again as soon as it is written to again. A write
           -- pushes back the turn of a row still waiting out its delay (a burst is embedded once), not of one
           -- already due: rag.sync_delay is the writer's setting, and one writer's hour must not hold back
           -- what another wrote before (red team 24).
           not_before = CASE WHEN q.attempts > 0 THEN EXCLUDED.not_before
                             WHEN q.not_before <= pg_catalog.now() THEN q.not_before
                             ELSE greatest(q.not_before, EXCLUDED.not_before) END;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;

-- Drops the pending keys of a watch. Batches go before queue rows, the order in which _spread_batches locks
-- them: the other order deadlocks with a worker that is spreading this watch's batches (it holds the batch
-- rows and waits on queue rows this transaction deleted), which a TRUNCATE right after a large INSERT hit.
-- A watch that ends without its table in hand (rag_drop_collection: its watches go with the collection's row)
-- leaves its triggers on the table and makes their functions do nothing. Left as they were, the triggers queued
-- keys for a watch that was gone, which the queue's policy refuses: every write to a table whose owner is not a
-- superuser failed from then on. Dropping the triggers takes the table's ACCESS EXCLUSIVE lock, which waits
-- behind whatever holds the table (a pg_dump holds every table for the whole dump) while every reader and
-- writer of the table waits behind it; replacing a function's body takes no lock on the table. The statement
-- function still takes the keys the row trigger gathered (rag._watch_keys_taken), so none is left over for the
-- transaction's end. rag_watch or rag_unwatch of the table, or DROP TRIGGER by its owner, removes them. The functions keep
-- their owner and privileges.
CREATE FUNCTION rag._silence_watch(p_watch_id integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_function text := format('rag.%I', '_watch_' || p_watch_id);
    v_row_function text := format('rag.%I', '_watch_' || p_watch_id || '_row');
BEGIN
    IF pg_catalog.to_regprocedure(v_function || '()') IS NOT NULL THEN
        PERFORM rag._replace_watch_function(v_function, rag._silent_watch_body(p_watch_id, false));
    END IF;
    IF pg_catalog.to_regprocedure(v_row_function || '()') IS NOT NULL THEN
        PERFORM rag._replace_watch_function(v_row_function, rag._silent_watch_body(p_watch_id, true));
    END IF;
    PERFORM rag._forget_queued_rows(p_watch_id);
END $$;

-- The body of a watch's trigger function that does nothing: the statement function still takes the keys its
-- table's row trigger gathered for the watch (rag._watch_keys_taken), so none is left over for the transaction's
-- end, which would warn about them.
CREATE FUNCTION rag._silent_watch_body(p_watch_id integer, p_row boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_row THEN 'BEGIN RETURN NULL; END'
                ELSE format('BEGIN PERFORM rag._watch_keys_taken(%s, TG_RELID); RETURN NULL; END', p_watch_id) END
$$;

-- A new watch's id may name trigger functions that are already there: a restore without rag's rows (pg_dump
-- --exclude-table-data 'rag.*') brings the watched tables' triggers and functions back without their watches and
-- starts the ids again, and rag_drop_collection leaves its watches' triggers with silenced functions.
-- rag._watch_install replaced such a function in place (CREATE OR REPLACE keeps its oid and its grants), so the
-- other table's triggers ran the new watch's body, as its owner: that owner's filter read the other table's rows
-- (an owner's expression over another owner's data), its keys were queued for the new watch, and a filter
-- reading new_rows failed every write to a table whose trigger had no such transition table (review of session
-- 44). For a new watch (p_new, rag_watch) every such function goes: dropped when no trigger runs it (its owner
-- could otherwise attach it later, or have granted it to others, and it would run the new watch's body), else
-- set aside under a name of its own (the triggers hold its oid) and made to do nothing; rag._drop_watch_triggers
-- drops it with the last of its table's triggers. When an existing watch's triggers are made again, only a
-- function whose triggers sit on another table is set aside.
CREATE FUNCTION rag._set_aside_watch_functions(p_watch_id integer, p_source oid, p_new boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT p.proname::text AS name
               FROM pg_catalog.pg_proc p
              WHERE p.pronamespace = 'rag'::regnamespace
                AND p.proname IN ('_watch_' || p_watch_id, '_watch_' || p_watch_id || '_row')
                AND (p_new OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                                       WHERE t.tgfoid = p.oid AND t.tgparentid = 0 AND t.tgrelid <> p_source))
              ORDER BY p.oid
    LOOP
        PERFORM rag._set_aside_watch_function(p_watch_id, f.name);
    END LOOP;
END $$;

-- One function of watch p_watch_id's (rag.<p_name>, which exists): dropped when no trigger runs it, else set
-- aside under a name of its own and made to do nothing.
CREATE FUNCTION rag._set_aside_watch_function(p_watch_id integer, p_name text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_function oid := pg_catalog.to_regprocedure(format('rag.%I()', p_name));
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t WHERE t.tgfoid = v_function) THEN
        EXECUTE format('DROP FUNCTION rag.%I()', p_name);
    ELSE
        EXECUTE format('ALTER FUNCTION rag.%I() RENAME TO %I', p_name, p_name || '_left_' || v_function);
        PERFORM rag._replace_watch_function(format('rag.%I', p_name || '_left_' || v_function),
                                            rag._silent_watch_body(p_watch_id, p_name LIKE '%\_row'));
    END IF;
END $$;

-- Drops the trigger functions a watch has: a watch whose keys rag._watch_key gathers has no row function, and
-- DROP FUNCTION IF EXISTS would say so in a NOTICE to whoever dropped the table.
CREATE FUNCTION rag._drop_watch_functions(p_watch_id integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_function regprocedure;
BEGIN
    FOR v_function IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
                       WHERE p.pronamespace = 'rag'::regnamespace AND p.pronargs = 0
                         AND p.proname IN ('_watch_' || p_watch_id, '_watch_' || p_watch_id || '_row')
                       ORDER BY p.oid LOOP
        EXECUTE format('DROP FUNCTION %s', v_function);
    END LOOP;
END $$;

CREATE FUNCTION rag._forget_queued_rows(p_watch_id integer) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM rag.row_batches WHERE watch_id = p_watch_id;
    DELETE FROM rag.row_queue WHERE watch_id = p_watch_id;
$$;

-- Deletes a watch's documents (and with them their chunks and queue items), in id order: a store under way
-- locks its group's documents so (rag._store_documents), and a DELETE that met them in its scan's order could
-- hold one the store waited for while waiting for one the store held ("deadlock detected").
CREATE FUNCTION rag._delete_watch_documents(p_watch_id integer) RETURNS void
LANGUAGE sql AS $$
    SELECT 1 FROM rag.documents WHERE watch_id = p_watch_id ORDER BY id FOR UPDATE;
    DELETE FROM rag.documents WHERE watch_id = p_watch_id;
$$;

-- The watches of p_sources, and with p_documents their documents, as counted under this transaction's snapshot
-- and under the latest one (rag._count_latest): a REPEATABLE READ or SERIALIZABLE transaction that is about to
-- act on them for a command of its own fails, as PostgreSQL fails a write its snapshot cannot see through,
-- when others changed them since it began. A DROP TABLE left the watch made meanwhile pointing at a table that
-- no longer exists, a RENAME COLUMN let every later write fail, a TRUNCATE kept documents of rows that were
-- gone (red team 29). In READ COMMITTED each statement sees what was committed before it: nothing to do.
CREATE FUNCTION rag._count_watches_on(p_sources oid[]) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM rag.watches w WHERE w.source = ANY (p_sources)
$$;

CREATE FUNCTION rag._count_documents_of_watches_on(p_sources oid[]) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM rag.watches w JOIN rag.documents d ON d.watch_id = w.id WHERE w.source = ANY (p_sources)
$$;

CREATE FUNCTION rag._require_watches_current(p_sources oid[], p_documents boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') = 'read committed' OR coalesce(cardinality(p_sources), 0) = 0 THEN
        RETURN;
    END IF;
    IF rag._count_latest('watches_on', p_sources) <> rag._count_watches_on(p_sources)
       OR (p_documents AND rag._count_latest('documents_of_watches_on', p_sources)
                           <> rag._count_documents_of_watches_on(p_sources)) THEN
        RAISE EXCEPTION 'could not serialize access: the watches of a table this command changes, or their documents, changed after this transaction began'
            USING ERRCODE = 'serialization_failure', HINT = 'Run the transaction again.';
    END IF;
END $$;

CREATE FUNCTION rag._watch_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM rag._require_watches_current(ARRAY[TG_RELID], true);
    PERFORM rag._forget_queued_rows(w.id) FROM rag.watches w WHERE w.source = TG_RELID;
    PERFORM rag._delete_watch_documents(w.id) FROM rag.watches w WHERE w.source = TG_RELID;
    RETURN NULL;
END $$;

-- Watching a table into a collection sends its rows wherever the collection's texts go: the embedding
-- provider, a model change's new provider (in progress, seen only in rag.migrations), a server's reranker and
-- the chat model's provider. Each must be the server's own (rag._provider_is_the_servers) or made by the
-- table's owner (p_role) or a role with the owner's privileges: an admin by grant may have chosen a provider
-- of their own while the collection watched nothing.
CREATE FUNCTION rag._require_providers_trusted_by(p_collection_id integer, p_role name, p_table text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_provider text;
    v_creator name;
BEGIN
    SELECT p.name, p.created_by INTO v_provider, v_creator
      FROM rag.collections c
     CROSS JOIN LATERAL (VALUES (c.embedding_provider),
                                (CASE WHEN c.reranker IS NOT NULL THEN c.reranker_provider END),
                                (CASE WHEN c.chat_model IS NOT NULL THEN c.chat_provider END),
                                ((SELECT m.embedding_provider FROM rag.migrations m WHERE m.collection_id = c.id))) v(name)
      JOIN rag.providers p ON p.name = v.name
     WHERE c.id = p_collection_id
       AND NOT rag._provider_is_the_servers(p.name)
       -- Its creator may read the table anyway: the owner, or a role with the owner's privileges (not the
       -- other way round: every watcher is a member of rag_admin, which anyone of it can create as).
       AND NOT (EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = p.created_by_id)
                AND pg_catalog.pg_has_role(p.created_by_id::oid, p_role, 'USAGE'))
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'watching % would send its rows to provider "%", which % chose', p_table, v_provider,
                        coalesce(quote_ident(v_creator), 'a role on record nowhere')
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'A collection''s texts go to its embedding provider, a model change''s new provider, a server''s reranker and its chat model''s provider.',
                  HINT = 'Watch into a collection whose providers a superuser or the table''s owner made (rag.collections and rag.migrations name them), or have a superuser create the provider.';
    END IF;
END $$;

CREATE FUNCTION @extschema@.rag_watch(
    source     regclass,
    collection text,
    content    text,
    title      text DEFAULT NULL,
    key        text[] DEFAULT NULL,
    filter     text DEFAULT NULL,
    metadata   text[] DEFAULT NULL,
    format     text DEFAULT 'text'
) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_collection integer := rag._collection_id(collection, 'admin');
    v_key text[] := key;
    v_column text;
    v_id integer;
    v_caller name := rag._calling_role();
    v_watch rag.watches;
    v_exprs record;
BEGIN
    PERFORM rag._require_writable('rag_watch');
    PERFORM rag._require_read_committed('rag_watch');
    -- A partitioned table holds no rows of its own: the worker reads a watched row from the table itself
    -- (FROM ONLY), which would find none, and its partitions may be written directly, which fires none of its
    -- statement triggers. Each partition is watched instead.
    IF (SELECT relkind FROM pg_class WHERE oid = source) = 'p' THEN
        RAISE EXCEPTION '% is a partitioned table', rag._table_name(source) USING ERRCODE = 'wrong_object_type',
            HINT = 'Watch each of its partitions.';
    END IF;
    IF (SELECT relkind FROM pg_class WHERE oid = source) <> 'r' THEN
        RAISE EXCEPTION '% is not a table', rag._table_name(source) USING ERRCODE = 'wrong_object_type',
            HINT = 'rag_watch keeps an ordinary table indexed.';
    END IF;
    -- A temporary table goes with its session, and no event trigger sees it go: its watch, trigger functions
    -- and documents would outlive it.
    IF (SELECT relpersistence FROM pg_class WHERE oid = source) = 't' THEN
        RAISE EXCEPTION '% is a temporary table', rag._table_name(source) USING ERRCODE = 'wrong_object_type',
            HINT = 'Watch a permanent (or unlogged) table.';
    END IF;
    IF NOT pg_has_role(v_caller, (SELECT relowner FROM pg_class WHERE oid = source), 'USAGE') THEN
        RAISE EXCEPTION 'only the owner of % may watch it', rag._table_name(source) USING ERRCODE = 'insufficient_privilege',
            HINT = 'Ask the table''s owner, who must also be a member of rag_admin.';
    END IF;
    PERFORM rag._require_providers_trusted_by(v_collection,
                                              (SELECT r.rolname FROM pg_catalog.pg_class t
                                                 JOIN pg_catalog.pg_roles r ON r.oid = t.relowner WHERE t.oid = source),
                                              rag._table_name(source));
    IF format IS NULL OR format NOT IN ('text', 'html', 'markdown') THEN
        RAISE EXCEPTION 'format must be text, html or markdown, not %', coalesce(quote_literal(format), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'html and markdown are turned into clean text before chunking.';
    END IF;
    IF content IS NULL OR btrim(content) = '' THEN
        RAISE EXCEPTION 'content must be an expression over the row, not %', coalesce(quote_literal(content), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'For example ''body'', a text column of the table, or an expression such as ''title || '' '' || body''.';
    END IF;
    IF EXISTS (SELECT 1 FROM rag.watches w WHERE w.source = rag_watch.source) THEN
        RAISE EXCEPTION '% is already watched', rag._table_name(source) USING ERRCODE = 'duplicate_object',
            HINT = 'rag_unwatch it first to change how it is indexed.';
    END IF;
    IF v_key IS NULL THEN
        SELECT array_agg(a.attname ORDER BY array_position(i.indkey::int2[], a.attnum)) INTO v_key
          FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
         WHERE i.indrelid = source AND i.indisprimary;
        IF v_key IS NULL THEN
            RAISE EXCEPTION '% has no primary key', rag._table_name(source) USING ERRCODE = 'invalid_table_definition',
                HINT = 'Add one, or name the key columns with key => ARRAY[...].';
        END IF;
    END IF;
    FOREACH v_column IN ARRAY v_key || coalesce(metadata, '{}') LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = source AND attname = v_column AND attnum > 0 AND NOT attisdropped) THEN
            RAISE EXCEPTION 'column "%" does not exist in %', v_column, rag._table_name(source) USING ERRCODE = 'undefined_column',
                HINT = 'key and metadata name columns of the table.';
        END IF;
    END LOOP;
    IF NOT rag._key_is_unique(source, v_key) THEN
        RAISE EXCEPTION 'the key (%) of % does not name one row: no unique index covers it', array_to_string(v_key, ', '),
                        rag._table_name(source)
            USING ERRCODE = 'invalid_table_definition',
                  DETAIL = 'A reader is shown a watched row''s document when they may read the row with its key; with a key two rows share, that could be another row than the one indexed.',
                  HINT = 'Name the primary key''s columns, or columns a unique index (not partial, without expressions) covers, or add such an index.';
    END IF;
    v_column := rag._key_unstable_column(source, v_key);
    IF v_column IS NOT NULL THEN
        RAISE EXCEPTION 'key column "%" of % has a type whose text depends on session settings',
                        v_column, rag._table_name(source)
            USING ERRCODE = 'invalid_table_definition',
                  DETAIL = 'A watch compares keys as written by each writer''s session; a timestamptz, float, bytea, interval, money or reg* key, or a range of dates or timestamps, is spelled differently under another TimeZone, extra_float_digits, bytea_output, IntervalStyle, lc_monetary, search_path or DateStyle, and the row''s document would be neither replaced nor hidden.',
                  HINT = 'Watch the table by another unique key (an integer, numeric, text or uuid column), or add one.';
    END IF;
    -- Expressions are checked now, not in the worker later: PostgreSQL's parser must read each as exactly one
    -- expression, and together they must evaluate over the table's row as its owner, with the owner's rights
    -- only (a security-restricted operation, as for index expressions).
    PERFORM rag._check_expression(content, 'content');
    PERFORM rag._check_expression(title, 'title');
    PERFORM rag._check_expression(filter, 'filter');
    INSERT INTO rag.watches (source, source_name, collection_id, content_expr, title_expr, filter_expr, key_columns,
                             metadata_columns, format, written_by)
    VALUES (source, rag._table_name(source), v_collection, content, title, filter, v_key, coalesce(metadata, '{}'), format,
            v_caller)
    RETURNING * INTO v_watch;
    v_id := v_watch.id;
    SELECT * INTO v_exprs FROM rag._watch_exprs(v_watch);
    BEGIN
        -- In a WHERE clause, where PostgreSQL's parser refuses what is not one value of one row: an aggregate
        -- content ("count(*)") made a deleted row's document read as present, with a count of nothing (review
        -- of session 35), and a set-returning one kept its first value only.
        PERFORM rag._query_as(rag._watch_runs_as(v_watch),
                              format('SELECT to_jsonb(true) FROM ONLY %s AS r WHERE ROW(%s, %s, %s) IS NOT NULL LIMIT 0',
                                     source, v_exprs.content, v_exprs.title, v_exprs.filter));
    EXCEPTION WHEN OTHERS THEN
        RAISE EXCEPTION 'invalid content, title or filter expression for %: %', rag._table_name(source), SQLERRM
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'They are SQL expressions giving one value for one row (no aggregate, window or set-returning function), evaluated with the rights of the table''s owner, e.g. content => ''title || E''''\n\n'''' || body''.';
    END;
    PERFORM rag._set_aside_watch_functions(v_id, source, p_new => true);
    PERFORM rag._watch_install(v_id);
    PERFORM rag._reindex_watch(v_id);
    RETURN v_id;
END $$;

-- Queues every qualifying row of a watch again (Drupal's queue-all) and every document whose row is gone.
CREATE FUNCTION rag._reindex_watch(p_watch_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    w rag.watches;
    e record;
    v_count bigint;
    v_gone bigint;
BEGIN
    SELECT * INTO w FROM rag.watches WHERE id = p_watch_id;
    SELECT * INTO e FROM rag._watch_exprs(w);
    -- The filter runs as the table's owner; only the keys come back to be queued.
    BEGIN
        -- Re-read, not changed: a reader keeps finding the row meanwhile (rag._row_visible); a key a write had
        -- queued stays changed.
        INSERT INTO rag.row_queue AS q (watch_id, key, changed)
        SELECT w.id, k.key, false
          FROM rag._query_as(rag._watch_runs_as(w),
                             format('SELECT %s FROM ONLY %s AS r WHERE %s',
                                    rag._columns_object(w.key_columns), w.source::regclass, e.filter)) AS k(key)
        ON CONFLICT (watch_id, key) DO UPDATE SET version = q.version + 1, not_before = now(), attempts = 0;
        GET DIAGNOSTICS v_count = ROW_COUNT;
    EXCEPTION WHEN OTHERS THEN
        -- The filter's error may quote a row's values (a failed cast names the value): told as it is only to a
        -- caller who may read every row of the table, as rag_watch_status tells a row's error (red team 16).
        IF w.id = ANY (rag._watches_readable_whole(rag._calling_role())) THEN
            RAISE;
        END IF;
        RAISE EXCEPTION 're-reading the rows of % failed: its filter or key columns raised an error on a row',
                        rag._table_name(w.source)
            USING ERRCODE = SQLSTATE,
                  DETAIL = 'The error is not shown: the table''s rules keep rows of it from you.',
                  HINT = 'The table''s owner sees it by running rag_reindex on the table.';
    END;
    INSERT INTO rag.row_queue AS q (watch_id, key, changed)
    SELECT w.id, d.source_key, false FROM rag.documents d WHERE d.watch_id = w.id
    ON CONFLICT (watch_id, key) DO NOTHING;
    GET DIAGNOSTICS v_gone = ROW_COUNT;
    PERFORM rag._wake_worker();
    RETURN v_count + v_gone;
END $$;

-- Stopping or re-reading a watch is for the watched table's owner or an admin of its collection.
CREATE FUNCTION rag._require_watch_control(w rag.watches) RETURNS void
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_caller name := rag._calling_role();
BEGIN
    IF NOT pg_catalog.pg_has_role(v_caller, rag._watch_owner(w), 'USAGE') THEN
        -- The caller named a table, not its collection: one who may not even read the collection is not told
        -- its name or its owner's.
        IF NOT rag._has_collection_privilege(w.collection_id, (SELECT c.owner FROM rag.collections c WHERE c.id = w.collection_id),
                                             (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = v_caller), 'read') THEN
            RAISE EXCEPTION 'permission denied for the watch of %', rag._table_name(w.source)
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'Only the table''s owner or an admin of the collection it is indexed into may do this.';
        END IF;
        PERFORM rag._require_privilege(w.collection_id, 'admin');
    END IF;
END $$;

CREATE FUNCTION @extschema@.rag_reindex(source regclass) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_id integer;
    v_problem text;
BEGIN
    PERFORM rag._require_writable('rag_reindex');
    SELECT id INTO v_id FROM rag.watches w WHERE w.source = rag_reindex.source;
    IF v_id IS NULL THEN
        RAISE EXCEPTION '% is not watched', rag._table_name(source) USING ERRCODE = 'undefined_object',
            HINT = 'Watch it with rag_watch first.';
    END IF;
    PERFORM rag._require_watch_control(w) FROM rag.watches w WHERE w.id = v_id;
    -- Also the way to mend a watched table whose owner lost the triggers' rights (a restore without
    -- privileges), should the worker not have done it yet: this table's owner only.
    PERFORM rag._grant_watch_owner(r.rolname)
       FROM pg_catalog.pg_class c JOIN pg_catalog.pg_roles r ON r.oid = c.relowner
      WHERE c.oid = rag_reindex.source AND r.rolname = ANY (rag._watch_owners_lacking());
    -- And of a table that lost triggers of the watch (rag._watch_triggers_problem): the rows are read again
    -- below, which catches the writes they missed. Only its owner's call puts them back, as only the owner may
    -- have taken them away: a collection's admin is told.
    v_problem := rag._watch_triggers_problem(source);
    IF v_problem IS NOT NULL THEN
        IF (SELECT pg_catalog.pg_has_role(rag._calling_role()::name, rag._watch_owner(w), 'USAGE')
              FROM rag.watches w WHERE w.id = v_id) THEN
            PERFORM rag._watch_install(v_id);
        ELSE
            RAISE WARNING 'the watch of % is not complete: %', rag._table_name(source), v_problem
                USING HINT = 'Only the table''s owner can put the triggers back, with rag_reindex of the table.';
        END IF;
    END IF;
    RETURN rag._reindex_watch(v_id);
END $$;

CREATE FUNCTION @extschema@.rag_unwatch(source regclass, drop_documents boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    w rag.watches;
BEGIN
    PERFORM rag._require_writable('rag_unwatch');
    SELECT * INTO w FROM rag.watches WHERE watches.source = rag_unwatch.source;
    IF NOT FOUND THEN
        -- A table whose watch is gone but not its triggers (a restore without rag's rows, rag_drop_collection):
        -- its owner takes them away here, with the functions they ran. Left, they refused every write of a table
        -- whose owner is not a superuser (the queue's policy) until it was watched again, and "not watched" was
        -- all this said (review of session 45). A plain table only, which is all a watch can have had: LOCK TABLE
        -- of a view locks what the view reads, checked (security_invoker) against rag's owner, so any role could
        -- have held pg_class itself (helper-86).
        IF (SELECT c.relkind = 'r' AND pg_catalog.pg_has_role(rag._calling_role()::name, c.relowner, 'USAGE')
              FROM pg_catalog.pg_class c WHERE c.oid = rag_unwatch.source)
           AND EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                        WHERE t.tgrelid = rag_unwatch.source AND t.tgparentid = 0 AND t.tgname LIKE 'rag\_watch\_%') THEN
            EXECUTE format('LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE', source);
            -- Watched by another session while this one waited for the lock: the triggers are that watch's now.
            -- (Under REPEATABLE READ, a watch this transaction cannot see fails it, as PostgreSQL fails a write.)
            PERFORM rag._require_watches_current(ARRAY[source::oid], false);
            IF EXISTS (SELECT 1 FROM rag.watches x WHERE x.source = rag_unwatch.source) THEN
                RAISE EXCEPTION '% was watched by another session meanwhile', rag._table_name(source)
                    USING ERRCODE = 'object_in_use', HINT = 'Run rag_unwatch again to end that watch.';
            END IF;
            PERFORM rag._drop_watch_triggers(source);
            RETURN true;
        END IF;
        RETURN false;
    END IF;
    PERFORM rag._require_watch_control(w);
    -- Kept documents are ordinary documents, read by every reader of the collection without the table's
    -- check: turning rows into that is a disclosure only the table's owner may make.
    IF NOT drop_documents AND NOT pg_catalog.pg_has_role(rag._calling_role()::name, rag._watch_owner(w), 'USAGE') THEN
        RAISE EXCEPTION 'only the owner of % may keep its rows as documents of the collection', rag._table_name(source)
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = 'Kept documents are no longer checked against the table: every reader of the collection would read rows the table may not show them.',
                  HINT = format('Unwatch it with drop_documents => true, or ask %s.', pg_catalog.pg_get_userbyid(rag._watch_owner(w)));
    END IF;
    -- Locks in the order DROP TABLE takes them (rag._on_sql_drop): the table (its triggers are dropped under an
    -- ACCESS EXCLUSIVE lock), then the collection's row, then its documents, the order a store takes those two in
    -- (rag._lock_for_store); the watch's end is counted on that row (rag._watches_ended).
    EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', source);
    PERFORM 1 FROM rag.collections c WHERE c.id = w.collection_id FOR NO KEY UPDATE;
    PERFORM rag._drop_watch_triggers(source);
    PERFORM rag._drop_watch_functions(w.id);
    PERFORM rag._forget_queued_rows(w.id);
    IF drop_documents THEN
        PERFORM rag._delete_watch_documents(w.id);
    END IF;
    DELETE FROM rag.watches WHERE id = w.id;
    RETURN true;
END $$;

-- Whether a unique index of the table (valid, not partial, without expressions) has all its columns among
-- p_key: then no two rows share a key, which rag._row_visible's check by key relies on.
CREATE FUNCTION rag._key_is_unique(p_table regclass, p_key text[]) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index i
         WHERE i.indrelid = p_table AND i.indisunique AND i.indisvalid
           AND i.indpred IS NULL AND i.indexprs IS NULL
           AND NOT EXISTS (SELECT 1 FROM unnest((i.indkey::int2[])[0:i.indnkeyatts - 1]) AS k(attnum)
                            WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                                               WHERE a.attrelid = p_table AND a.attnum = k.attnum
                                                 AND a.attname = ANY (p_key))))
$$;

-- The first key column (of p_key, in p_table) whose value a session setting spells differently in JSON;
-- NULL when there is none. A watch compares keys as JSON built in the writer's session: with such a key two
-- writers spelled one row two ways, and a write from another time zone neither replaced the row's document
-- nor hid its earlier text from readers (rag._row_visible) (red team 25). Followed through domains, arrays,
-- composite types, ranges and multiranges. Always: timestamptz (TimeZone), float4 and float8
-- (extra_float_digits), bytea (bytea_output), interval (IntervalStyle), money (lc_monetary) and the reg*
-- types (search_path). Inside a range or multirange, whose JSON is its text, a date or timestamp too
-- (DateStyle; as a value of its own, an array element or a field JSON writes it in ISO form whatever the
-- setting) (review of red team 25).
CREATE FUNCTION rag._key_unstable_column(p_table regclass, p_key text[]) RETURNS text
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE parts(column_name, type_oid, as_text, depth) AS (
        SELECT a.attname::text, a.atttypid, false, 0 FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = p_table AND a.attname = ANY (p_key) AND a.attnum > 0 AND NOT a.attisdropped
        UNION ALL
        SELECT p.column_name, n.type_oid, p.as_text OR n.as_text, p.depth + 1
          FROM parts p JOIN pg_catalog.pg_type t ON t.oid = p.type_oid
          CROSS JOIN LATERAL (SELECT t.typbasetype, false WHERE t.typtype = 'd'
                              UNION ALL SELECT t.typelem, false WHERE t.typcategory = 'A' AND t.typelem <> 0
                              UNION ALL SELECT r.rngsubtype, true FROM pg_catalog.pg_range r WHERE r.rngtypid = t.oid
                              UNION ALL SELECT r.rngsubtype, true FROM pg_catalog.pg_range r WHERE r.rngmultitypid = t.oid
                              UNION ALL SELECT a.atttypid, false FROM pg_catalog.pg_attribute a
                                         WHERE t.typtype = 'c' AND a.attrelid = t.typrelid AND a.attnum > 0
                                           AND NOT a.attisdropped) AS n(type_oid, as_text)
         WHERE p.depth < 16
    )
    SELECT p.column_name FROM parts p
     WHERE p.type_oid IN ('timestamptz'::regtype, 'float4'::regtype, 'float8'::regtype, 'bytea'::regtype,
                          'interval'::regtype, 'money'::regtype, 'regclass'::regtype, 'regproc'::regtype,
                          'regprocedure'::regtype, 'regoper'::regtype, 'regoperator'::regtype, 'regtype'::regtype,
                          'regconfig'::regtype, 'regdictionary'::regtype, 'regnamespace'::regtype,
                          'regrole'::regtype, 'regcollation'::regtype)
        OR p.as_text AND p.type_oid IN ('date'::regtype, 'timestamp'::regtype)
     ORDER BY array_position(p_key, p.column_name) LIMIT 1
$$;

-- DROP TABLE of a watched table takes its documents and its watch along; dropping the last unique index (or
-- primary key) a watch's key relies on draws a WARNING.
CREATE FUNCTION rag._on_sql_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    w rag.watches;
BEGIN
    PERFORM rag._require_watches_current(ARRAY(SELECT o.objid FROM pg_event_trigger_dropped_objects() o
                                                WHERE o.object_type = 'table'), false);
    -- A watch whose key this command left without a unique index: its rows' documents are shown to no reader
    -- who needs the row check from now on (rag._row_lookup_sql fails closed), which its owner is told here. Not
    -- refused: the drop may be someone else's command on another table, while this watch's key was left
    -- without an index earlier (DROP INDEX CONCURRENTLY, or a watch made by an older version).
    IF EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() o WHERE o.object_type IN ('index', 'table constraint')) THEN
        -- Told to the tables' owners only (the login role: this function runs as rag's owner): another role's
        -- drop elsewhere learns nothing of their tables.
        FOR w IN SELECT wa.* FROM rag.watches wa JOIN pg_catalog.pg_class t ON t.oid = wa.source
                  WHERE pg_catalog.pg_has_role(session_user, t.relowner, 'USAGE')
                    AND NOT rag._key_is_unique(wa.source, wa.key_columns) LOOP
            RAISE WARNING 'the key (%) of watched table % no longer names one row: its documents are shown only to roles that may read the whole table',
                          array_to_string(w.key_columns, ', '), w.source_name
                USING HINT = 'Create a unique index on the key''s columns (or a subset of them) again.';
        END LOOP;
    END IF;
    -- By collection, so that two commands dropping several watched tables lock the collections in one order.
    FOR w IN SELECT wa.* FROM pg_event_trigger_dropped_objects() o JOIN rag.watches wa ON wa.source = o.objid
              WHERE o.object_type = 'table' ORDER BY wa.collection_id, wa.id LOOP
        -- As rag_unwatch: the collection's row first.
        PERFORM 1 FROM rag.collections c WHERE c.id = w.collection_id FOR NO KEY UPDATE;
        PERFORM rag._forget_queued_rows(w.id);
        PERFORM rag._delete_watch_documents(w.id);
        PERFORM rag._drop_watch_functions(w.id);
        DELETE FROM rag.watches WHERE id = w.id;
    END LOOP;
END $$;
CREATE EVENT TRIGGER rag_watch_drop ON sql_drop EXECUTE FUNCTION rag._on_sql_drop();

-- Whether a function is a watch's trigger function (rag._watch_N, _watch_N_row, or one set aside as
-- _watch_N[_row]_left_M) that rag did not make: its body lacks rag._watch_body_mark().
CREATE FUNCTION rag._watch_function_unmarked(p_function oid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                    WHERE p.oid = p_function AND p.pronamespace = 'rag'::regnamespace
                      AND p.proname ~ '^_watch_[0-9]+(_row)?(_left_[0-9]+)?$'
                      AND p.pronargs = 0 AND p.prorettype = 'pg_catalog.trigger'::pg_catalog.regtype::pg_catalog.oid
                      AND NOT pg_catalog.starts_with(p.prosrc, rag._watch_body_mark()))
$$;

-- Makes a watch's trigger function that rag did not make do nothing, keeping its oid, owner and grants, and
-- names it in a WARNING. Mostly a restore of a dump of release 0.1.0, which brings the functions its watches
-- made (ordinary functions of schema rag to pg_dump) but none of rag's rows (0.1.0 did not mark its tables for
-- pg_dump), so their watches are gone whatever happens. Their bodies evaluate the owner's filter with none of
-- this release's checks: restored by a superuser with --no-owner, they ran whatever the filter's author wrote
-- as that superuser (rag._watch_runs_as keeps this release's own bodies from it), and restored with owners,
-- every write to the table failed on the queue's policy (a batch for a watch that is not there). The body
-- left is the one rag_drop_collection leaves (rag._silent_watch_body): where the watch of that id is there
-- (a superuser replaced a live watch's function by hand), its statement function still takes the keys its
-- row triggers gathered; elsewhere it runs nothing at all (a 0.1.0 table has no such row triggers, and its
-- owner may not execute rag._watch_keys_taken).
CREATE FUNCTION rag._silence_unmarked_watch_function(p_function oid) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_name name := (SELECT p.proname FROM pg_catalog.pg_proc p WHERE p.oid = p_function);
    v_watch integer := pg_catalog.substring(v_name, '^_watch_([0-9]+)')::integer;
    v_live boolean := EXISTS (SELECT 1 FROM rag.watches w WHERE w.id = v_watch);
BEGIN
    PERFORM rag._replace_watch_function(format('rag.%I', v_name),
                                        rag._silent_watch_body(v_watch, v_name ~ '_row($|_left_)' OR NOT v_live));
    IF v_live THEN
        RAISE WARNING 'trigger function % was not made by rag: it now does nothing', format('rag.%I()', v_name)
            USING DETAIL = 'Its watch no longer indexes what its triggers see (rag_watch_status says so).',
                  HINT = 'rag_reindex the watched table as its owner to make the watch''s triggers again.';
    ELSE
        RAISE WARNING 'trigger function % was not made by this release of rag: it now does nothing', format('rag.%I()', v_name)
            USING DETAIL = 'A dump of rag 0.1.0 brings the trigger functions of its watches but none of rag''s rows, '
                           'so the watch is gone; the old body would run the table owner''s expressions without '
                           'this release''s checks, as the function''s owner.',
                  HINT = 'rag_watch the table again, or rag_unwatch it to drop the old triggers (README, "Backups").';
    END IF;
END $$;

-- A watch's trigger function that rag did not make, as it is created or renamed (a restore of a dump of 0.1.0;
-- rag._silence_unmarked_watch_function); an update from 0.1.0 does the same for those it finds. Only a
-- superuser or rag's owner can create a function in schema rag or move one there, so nobody else can pass one
-- off as rag's. Anyone's CREATE or ALTER FUNCTION fires this: for a function outside schema rag it reads
-- pg_event_trigger_ddl_commands() and nothing else (rag's internal functions are not theirs to execute). Its
-- path is set here, not only by security.sql: rag's install script fires it, partly under the path the
-- extension's schema gives (public, usually), where an operator planted there matched its comparisons more
-- closely than pg_catalog's.
CREATE FUNCTION rag._on_create_function() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, rag, pg_temp AS $$
DECLARE
    v_function oid;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() d
                    WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid
                      AND d.schema_name = 'rag') THEN
        RETURN;
    END IF;
    FOR v_function IN
        SELECT DISTINCT d.objid
          FROM pg_catalog.pg_event_trigger_ddl_commands() d
         WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid AND d.schema_name = 'rag'
           AND rag._watch_function_unmarked(d.objid)
         ORDER BY d.objid
    LOOP
        PERFORM rag._silence_unmarked_watch_function(v_function);
    END LOOP;
END $$;
CREATE EVENT TRIGGER rag_watch_functions ON ddl_command_end WHEN TAG IN ('CREATE FUNCTION', 'ALTER FUNCTION')
    EXECUTE FUNCTION rag._on_create_function();

-- A watch that ends (rag_unwatch, its table dropped, not its collection) leaves answers that may quote its rows
-- behind in the ledger: rag.collections.watches_ended keeps them from admins from then on (schema.sql).
CREATE FUNCTION rag._watches_ended() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    UPDATE rag.collections c SET watches_ended = c.watches_ended + 1
     WHERE c.id IN (SELECT g.collection_id FROM gone g);
    RETURN NULL;
END $$;
CREATE TRIGGER watches_ended AFTER DELETE ON rag.watches REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION rag._watches_ended();

-- A watched table that becomes a partition or an inheritance child (ATTACH PARTITION, INHERIT), or stops being
-- one, gets the triggers its new place needs (rag._watch_trigger_mode): its triggers are made again whenever
-- they no longer match (not while its set is not whole: a restore makes them itself), or when the table
-- changes owner. Every ALTER TABLE pays a look at rag.watches for the tables it altered.
CREATE FUNCTION rag._on_alter_table() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    v_watch integer;
    v_table text;
    v_column text;
    v_replica_table text;
    v_replica_enables text;
    -- The tables the command altered, with their partitions and inheritance children (ATTACH and a column
    -- renamed on the parent name the parent) and the tables typed by a composite type it altered (ALTER TYPE …
    -- RENAME ATTRIBUTE … CASCADE names only the type, by its pg_class row); never inside an extension's script,
    -- which may not replace objects it does not own.
    v_altered oid[] := ARRAY(
        SELECT d.objid FROM pg_catalog.pg_event_trigger_ddl_commands() d
         WHERE d.classid = 'pg_catalog.pg_class'::regclass AND NOT d.in_extension
        UNION
        SELECT i.inhrelid FROM pg_catalog.pg_event_trigger_ddl_commands() d
          JOIN pg_catalog.pg_inherits i ON i.inhparent = d.objid
         WHERE d.classid = 'pg_catalog.pg_class'::regclass AND NOT d.in_extension
        UNION
        SELECT t.oid FROM pg_catalog.pg_event_trigger_ddl_commands() d
          JOIN pg_catalog.pg_class ct ON ct.oid = d.objid AND ct.relkind = 'c'
          JOIN pg_catalog.pg_class t ON t.reloftype = ct.reltype
         WHERE d.classid = 'pg_catalog.pg_class'::regclass AND NOT d.in_extension);
    -- The schemas it altered (ALTER SCHEMA … RENAME names no table).
    v_schemas oid[] := ARRAY(
        SELECT d.objid FROM pg_catalog.pg_event_trigger_ddl_commands() d
         WHERE d.classid = 'pg_catalog.pg_namespace'::regclass AND NOT d.in_extension);
BEGIN
    PERFORM rag._require_watches_current(v_altered, false);
    -- A watch's expressions, key and metadata columns are kept as names: a column among them renamed or
    -- dropped (CASCADE drops the triggers that depend on it), on the table or through its parent, would leave
    -- the watch failing every row (or every write to the table) from then on. Refused, as PostgreSQL refuses
    -- to drop a column a view reads. Where the columns the expressions read are not known (NULL: a function of
    -- the owner's, a whole row), the expressions must still find theirs.
    FOR v_watch, v_table, v_column IN
        SELECT w.id, rag._table_name(w.source), col
          FROM rag.watches w
          LEFT JOIN LATERAL (
                SELECT c FROM unnest(w.key_columns || w.metadata_columns || coalesce(w.read_columns, '{}')) c
                 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute t
                                    WHERE t.attrelid = w.source AND t.attname = c AND t.attnum > 0 AND NOT t.attisdropped)
                 LIMIT 1) missing(col) ON true
         WHERE w.source = ANY (v_altered) AND (missing.col IS NOT NULL OR w.read_columns IS NULL)
         ORDER BY w.id
    LOOP
        IF v_column IS NULL THEN
            BEGIN
                -- Not analysed as a superuser who did not write them (rag._watch_owner_untrusted): analysing runs
                -- code too, and a superuser's pg_restore --no-owner adds a restored table's keys with ALTER TABLE.
                PERFORM rag._expression_columns(w.source, ARRAY[w.content_expr, w.title_expr, w.filter_expr])
                   FROM rag.watches w WHERE w.id = v_watch AND NOT rag._watch_owner_untrusted(w);
            EXCEPTION
                WHEN undefined_column THEN
                    v_column := substring(SQLERRM FROM 'column "?([^" ]+)"? does not exist');
                -- Anything else (a function of the owner's gone, under rag's search_path since the upgrade: the
                -- upgrade named such watches) is not this command's doing, and must not stop it (a restore
                -- adds a watched table's keys and triggers with ALTER TABLE).
                WHEN OTHERS THEN
                    NULL;
            END;
        END IF;
        IF v_column IS NOT NULL THEN
            RAISE EXCEPTION 'column "%" of % is read by its watch', v_column, v_table
                USING ERRCODE = 'dependent_objects_still_exist',
                      HINT = format('rag_unwatch(%L) first and rag_watch it again with the new names, or keep the column.', v_table);
        END IF;
    END LOOP;
    FOR v_watch IN
        WITH altered AS (
            SELECT unnest(v_altered) AS objid
            UNION
            -- DETACH names the parent, which the detached table no longer is a child of; the detach rewrote the
            -- table's pg_class row in this transaction. Without that test, an owner who gave their own watched
            -- table triggers named like a child's would have every other role's ALTER TABLE remake them, and
            -- wait for any lock the owner holds on it.
            SELECT w.source FROM rag.watches w JOIN pg_catalog.pg_class c ON c.oid = w.source
             WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() d WHERE NOT d.in_extension)
               AND rag._written_by_this_transaction(c.xmin::text::bigint)
               AND rag._watch_trigger_mode_installed(w.source) IN ('rows', 'gather_at_end')
               AND rag._watch_trigger_mode(w) NOT IN ('rows', 'gather_at_end'))
        SELECT w.id FROM rag.watches w JOIN altered a ON a.objid = w.source
          JOIN pg_catalog.pg_class c ON c.oid = w.source
         WHERE rag._watch_trigger_mode(w) <> rag._watch_trigger_mode_installed(w.source)
            -- A new owner: the trigger functions run as the table's owner, whom the queue's policy checks.
            OR (rag._watch_trigger_mode_installed(w.source) IS NOT NULL
                AND (SELECT p.proowner FROM pg_catalog.pg_proc p
                      WHERE p.oid = pg_catalog.to_regprocedure(pg_catalog.format('rag.%I()', '_watch_' || w.id)))
                    IS DISTINCT FROM c.relowner)
            -- Columns renamed, added or dropped: what the expressions read may have changed, and with it who
            -- may read the index and which updates the UPDATE trigger's WHEN clause lets through.
            OR (rag._watch_trigger_mode_installed(w.source) IS NOT NULL
                AND rag._watch_read_columns(w) IS DISTINCT FROM w.read_columns)
         ORDER BY w.id
    LOOP
        PERFORM rag._watch_install(v_watch);
    END LOOP;
    -- ALTER TABLE … ENABLE TRIGGER ALL, which a data-only pg_restore --disable-triggers ends with, makes a watch's
    -- replica triggers ORIGIN ones, which a logical-replication subscriber's apply worker never fires: the rows
    -- it applied were not indexed from then on (red team 27). They go back to REPLICA, in one ALTER TABLE (whose
    -- own run of this trigger then finds nothing to do); in other sessions they stay idle (rag._watch_key's
    -- 'replica', or a WHEN clause).
    FOR v_replica_table, v_replica_enables IN
        SELECT w.source::regclass::text,
               string_agg(format('ENABLE REPLICA TRIGGER %I', t.tgname), ', ' ORDER BY t.tgname)
          FROM rag.watches w
          JOIN pg_catalog.pg_trigger t ON t.tgrelid = w.source AND t.tgparentid = 0 AND t.tgenabled = 'O'
                                      AND t.tgname LIKE 'rag\_watch\_replica\_%'
         -- Only those this command made ORIGIN: any other ALTER TABLE (SET STATISTICS, which takes a weaker
         -- lock, or a parent's, which names another owner's child) must not take the table's trigger lock.
         WHERE w.source = ANY (v_altered) AND rag._written_by_this_transaction(t.xmin::text::bigint)
         GROUP BY w.source
    LOOP
        EXECUTE format('ALTER TABLE %s %s', v_replica_table, v_replica_enables);
    END LOOP;
    -- The same command on rag's own tables (a restore with --disable-triggers runs it on every table whose
    -- rows it loads, partitions of rag.chunks included) makes their triggers ORIGIN, which
    -- session_replication_role = replica skips: a replay run so must still give restored batches free ids
    -- (rag._row_batch_free_id), and a role allowed to set it wrote rag's tables past their guard
    -- (rag._written_by_rag_only, security.sql; helper-99). A trigger left disabled stays so.
    FOR v_replica_table, v_replica_enables IN
        SELECT t.tgrelid::pg_catalog.regclass::text,
               string_agg(format('ENABLE ALWAYS TRIGGER %I', t.tgname), ', ' ORDER BY t.tgname)
          FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
         WHERE t.tgrelid = ANY (v_altered) AND c.relnamespace = 'rag'::pg_catalog.regnamespace
           AND t.tgname IN ('written_by_rag', 'row_batches_free_id', 'row_batches_policy_kept') AND t.tgenabled = 'O'
         GROUP BY t.tgrelid
    LOOP
        EXECUTE format('ALTER TABLE %s %s', v_replica_table, v_replica_enables);
    END LOOP;
    -- A table renamed or moved to another schema goes by its new name in its watch and its documents'
    -- "source" (the name is text there: it is what citations show). Only the watches of the tables this
    -- command altered, or of the tables in a schema it altered (ALTER SCHEMA … RENAME names the schema):
    -- looking at every watch whose name is out of date would have one role's DDL rewrite, and wait for the
    -- row locks on, another role's documents (whose owner can make the name stale on purpose).
    PERFORM rag._require_watches_current(
        ARRAY(SELECT w.source FROM rag.watches w JOIN pg_catalog.pg_class t ON t.oid = w.source
               WHERE (w.source = ANY (v_altered) OR t.relnamespace = ANY (v_schemas))
                 AND w.source_name IS DISTINCT FROM rag._table_name(w.source)), true);
    WITH renamed AS (
        UPDATE rag.watches w SET source_name = rag._table_name(w.source)
          FROM pg_catalog.pg_class t
         WHERE t.oid = w.source
           AND (w.source = ANY (v_altered) OR t.relnamespace = ANY (v_schemas))
           AND w.source_name IS DISTINCT FROM rag._table_name(w.source)
        RETURNING w.id, w.source_name)
    UPDATE rag.documents d
       SET source = r.source_name,
           metadata = CASE WHEN d.metadata ? 'source' THEN d.metadata || jsonb_build_object('source', r.source_name)
                           ELSE d.metadata END
      FROM renamed r WHERE d.watch_id = r.id;
END $$;
-- Besides ALTER TABLE: PostgreSQL lets ALTER INDEX rename a table, and ALTER VIEW, ALTER MATERIALIZED VIEW and
-- ALTER FOREIGN TABLE rename a table's columns (the command's kind is not checked against the relation's there).
CREATE EVENT TRIGGER rag_watch_alter ON ddl_command_end
    WHEN TAG IN ('ALTER TABLE', 'ALTER SCHEMA', 'ALTER INDEX', 'ALTER VIEW', 'ALTER MATERIALIZED VIEW',
                 'ALTER FOREIGN TABLE', 'ALTER TYPE')
    EXECUTE FUNCTION rag._on_alter_table();

-- A publication FOR ALL TABLES (or one given schema rag or one of its tables) publishes rag's own tables too:
-- PostgreSQL gives an extension no way to keep its tables out of such a publication. A subscriber without rag
-- then cannot subscribe at all (CREATE SUBSCRIPTION fails on the first table it lacks), and one with rag would
-- have this database's collections, documents and chunks applied over its own (clashing ids stop its apply
-- worker). So the command is named in a WARNING, with the way out; it still runs: refusing it would break
-- tools that publish everything on purpose. Runs as the user who ran the command and reads only catalogs.
CREATE FUNCTION rag._on_publication() RETURNS event_trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_publication name;
BEGIN
    FOR v_publication IN
        WITH touched AS (
            SELECT CASE d.classid
                       WHEN 'pg_catalog.pg_publication'::regclass THEN d.objid
                       WHEN 'pg_catalog.pg_publication_rel'::regclass
                           THEN (SELECT r.prpubid FROM pg_catalog.pg_publication_rel r WHERE r.oid = d.objid)
                       WHEN 'pg_catalog.pg_publication_namespace'::regclass
                           THEN (SELECT n.pnpubid FROM pg_catalog.pg_publication_namespace n WHERE n.oid = d.objid)
                   END AS publication
              FROM pg_catalog.pg_event_trigger_ddl_commands() d)
        SELECT p.pubname
          FROM (SELECT DISTINCT publication FROM touched) t
          JOIN pg_catalog.pg_publication p ON p.oid = t.publication
         WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_publication_tables pt
                        WHERE pt.pubname = p.pubname AND pt.schemaname = 'rag')
         ORDER BY p.pubname
    LOOP
        RAISE WARNING 'publication "%" includes tables of schema rag', v_publication
            USING DETAIL = 'A subscriber without rag cannot subscribe to it, and one with rag would have this '
                           'database''s collections, documents and chunks applied over its own.',
                  HINT = 'Publish your own tables by name or with FOR TABLES IN SCHEMA, leaving schema rag out '
                         '(README, "Logical replication").';
    END LOOP;
END $$;
CREATE EVENT TRIGGER rag_publication ON ddl_command_end WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION')
    EXECUTE FUNCTION rag._on_publication();

------------------------------------------------------------------------------------------------------------
-- The worker's side.

CREATE FUNCTION rag._claim_row(p_worker integer, p_after_watch integer DEFAULT NULL)
RETURNS TABLE (row_queue_id bigint, version bigint, watch_id integer)
LANGUAGE plpgsql AS $$
DECLARE
    q rag.row_queue;
    v_watch integer;
    -- rag_process_queue run by a role that is not a superuser: only the watches of the collections it may
    -- process (rag._claim_scope).
    v_scope integer[] := rag._claim_scope();
BEGIN
    -- Watches take turns: the first due row of each watch with queued rows, starting after the watch this
    -- worker served last (p_after_watch). One queue in due order let a watch with a million queued keys (a large
    -- write, or an owner writing their own watch's batches) keep every other watch's rows waiting for as long
    -- as it took to sync them all. The watches are found by a skip scan of the (watch_id, key) index, one probe
    -- per watch with queued rows.
    FOR v_watch IN
        WITH RECURSIVE queued(id) AS (
            (SELECT rq.watch_id FROM rag.row_queue rq ORDER BY rq.watch_id LIMIT 1)
            UNION ALL
            SELECT (SELECT rq.watch_id FROM rag.row_queue rq WHERE rq.watch_id > queued.id ORDER BY rq.watch_id LIMIT 1)
              FROM queued WHERE queued.id IS NOT NULL)
        SELECT queued.id FROM queued
         WHERE queued.id IS NOT NULL
           AND (v_scope IS NULL OR EXISTS (SELECT 1 FROM rag.watches w
                                            WHERE w.id = queued.id AND w.collection_id = ANY (v_scope)))
           -- Not a watch whose table has none of its triggers: a restore that has not reached them (post-data)
           -- may not have brought the table's rows either, and a key synced then deleted its row's document for
           -- good (red team 27). The keys wait; rag.watch_status says what the table lacks.
           AND EXISTS (SELECT 1 FROM rag.watches w JOIN pg_catalog.pg_trigger t ON t.tgrelid = w.source
                        WHERE w.id = queued.id AND t.tgname LIKE 'rag\_watch\_%')
         ORDER BY queued.id <= coalesce(p_after_watch, 0), queued.id
    LOOP
        SELECT * INTO q FROM rag.row_queue rq
         WHERE rq.watch_id = v_watch AND rq.not_before <= now()
           AND (rq.claimed_by IS NULL OR rq.claimed_by = p_worker
                OR NOT rag._claim_held(rq.claimed_by))
         ORDER BY rq.not_before, rq.id
         LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            -- Its last claimer is gone before it finished: a crash or a restart (once: tried again at once), or
            -- a worker that ended itself because the watch's expressions ran past twice
            -- rag.expression_timeout, catching the cancel (src/security.rs). From the second such end on, the
            -- row backs off like a failed one, so that one table's code cannot hold the worker in a loop.
            IF q.claimed_by IS NOT NULL AND q.claimed_by <> p_worker AND q.attempts >= 2 THEN
                UPDATE rag.row_queue
                   SET claimed_by = NULL,
                       last_error = format('the worker stopped %s times while syncing this row, the last time '
                                           'without finishing: a crash, or the watch''s expressions ran past twice '
                                           'rag.expression_timeout and went on after the cancel', q.attempts),
                       not_before = now() + least(interval '30 seconds' * power(2, least(q.attempts - 2, 7)),
                                                  interval '1 hour')
                 WHERE id = q.id;
                CONTINUE;
            END IF;
            -- Counted when claimed, so that a worker that never comes back from the row still counts it.
            UPDATE rag.row_queue SET claimed_by = p_worker, attempts = attempts + 1 WHERE id = q.id;
            RETURN QUERY SELECT q.id, q.version, q.watch_id;
            RETURN;
        END IF;
    END LOOP;
END $$;

-- Reads the row's current content by key, as the table's owner, and brings its document up to date.
-- Returns the action taken (nothing, deleted, relabelled, unchanged, queued: a new document, chunked as ingested
-- ones are; chunk: a changed one) and, for 'chunk', the settings the worker chunks the new text with. The text
-- itself the worker reads from the document once this function's copies of it are gone.
CREATE FUNCTION rag._sync_row(p_row_queue_id bigint,
    OUT action text, OUT document_id bigint,
    OUT chunk_size integer, OUT chunk_overlap integer, OUT chunk_unit text,
    OUT provider_kind text, OUT embedding_model text, OUT document_prefix text)
LANGUAGE plpgsql AS $$
DECLARE
    q rag.row_queue;
    w rag.watches;
    c rag.collections;
    e record;
    v_found boolean := false;
    v_content text;
    v_content_bytes bigint;
    v_title_bytes bigint;
    v_metadata_bytes bigint;
    v_raw_limit bigint;
    v_title text;
    v_metadata jsonb;
    v_sha bytea;
    d record;
BEGIN
    SELECT * INTO q FROM rag.row_queue WHERE id = p_row_queue_id;
    SELECT * INTO w FROM rag.watches WHERE id = q.watch_id;
    SELECT * INTO c FROM rag.collections WHERE id = w.collection_id;
    SELECT * INTO e FROM rag._watch_exprs(w);
    chunk_size := c.chunk_size; chunk_overlap := c.chunk_overlap; chunk_unit := c.chunk_unit;
    -- A local model's tokenizer measures the chunks, so the worker needs to know which model embeds them.
    SELECT p.kind INTO provider_kind FROM rag.providers p WHERE p.name = c.embedding_provider;
    embedding_model := c.embedding_model; document_prefix := c.document_prefix;
    -- The expressions run with the table owner's rights and nothing more (a security-restricted operation, so
    -- they cannot change role), under rag.expression_timeout. The filter is a condition of the row's query, so
    -- the content, title and metadata of a row it leaves out are never built (an unpublished row of a large
    -- text cost the worker as much as a published one, and one whose content expression failed failed its
    -- sync), and such a row is read as gone. It is asked only of the row with the key (CASE): a qual of its
    -- own could run first on other rows of a scanned table, and fail on them. It adds no name the
    -- expressions could mean (a column of the owner's named like it made them ambiguous: review of session 35).
    -- The content comes back only when it is within the bound rag_ingest puts on the same text (the markup's
    -- rag.max_file_size, plain text's rag.max_document_size), and its size always: a 206 MB row was put in the
    -- reply's JSON whole (an allocation of 1.7 GB that failed, and again at every retry), and a 121 MB one
    -- became a document of twice the largest rag_ingest takes (red team 20).
    v_raw_limit := pg_size_bytes(rag._setting(CASE WHEN w.format = 'text' THEN 'rag.max_document_size'
                                                    ELSE 'rag.max_file_size' END));
    -- Likewise the title and the metadata, within what rag_ingest takes (checked below from their sizes); the
    -- metadata's JSON is built only when its columns' text fits (three 80 MB columns took a worker to 2 GB
    -- before the check, red team 20). The
    -- expressions are evaluated once (OFFSET 0 keeps the planner from copying them into each use: a content
    -- expression ran three times, and one that fit rag.expression_timeout no longer did).
    SELECT true, x->>'content', (x->>'content_bytes')::bigint, x->>'title', (x->>'title_bytes')::bigint,
           x->'metadata', (x->>'metadata_bytes')::bigint
      INTO v_found, v_content, v_content_bytes, v_title, v_title_bytes, v_metadata, v_metadata_bytes
      FROM rag._query_as(rag._watch_runs_as(w),
             format($q$SELECT jsonb_build_object(
                                  'content', CASE WHEN octet_length(s.content) <= %s THEN s.content END,
                                  'content_bytes', octet_length(s.content),
                                  'title', CASE WHEN octet_length(s.title) <= %s THEN s.title END,
                                  'title_bytes', octet_length(s.title),
                                  'metadata', CASE WHEN octet_length(s.metadata::text) <= %s THEN s.metadata END,
                                  'metadata_bytes', coalesce(octet_length(s.metadata::text), s.columns_bytes))
                         FROM (SELECT %s AS content, %s AS title,
                                      CASE WHEN %s <= %s THEN %s END AS metadata, %s AS columns_bytes
                                 FROM ONLY %s AS r WHERE %s AND CASE WHEN %s THEN %s END OFFSET 0) s$q$,
                    v_raw_limit, rag._limit('document_title_max_bytes'), rag._limit('document_metadata_max_bytes'),
                    e.content, e.title,
                    rag._columns_size(w.metadata_columns), rag._limit('document_metadata_max_bytes'), e.metadata,
                    rag._columns_size(w.metadata_columns), w.source::regclass,
                    rag._key_condition(w), rag._key_condition(w), e.filter),
             q.key) AS x;
    IF v_content_bytes > v_raw_limit THEN
        RAISE EXCEPTION 'the row''s content is % bytes, above % (%)', v_content_bytes,
                        CASE WHEN w.format = 'text' THEN 'rag.max_document_size' ELSE 'rag.max_file_size' END,
                        pg_size_pretty(v_raw_limit)
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Index less of the row (the watch''s content expression), or raise the setting (superuser); the row is tried again when it is next written, or at rag_reindex of its table.';
    END IF;
    -- Plain text is not passed through rag._to_text, which would hand back a copy of it.
    IF w.format <> 'text' THEN
        v_content := rag._to_text(v_content, w.format);
    END IF;
    IF octet_length(v_content) > pg_size_bytes(rag._setting('rag.max_document_size')) THEN
        RAISE EXCEPTION 'the row''s text is % bytes, above rag.max_document_size (%)', octet_length(v_content),
                        pg_size_pretty(pg_size_bytes(rag._setting('rag.max_document_size')))
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Index less of the row (the watch''s content expression), or raise rag.max_document_size (superuser); the row is tried again when it is next written, or at rag_reindex of its table.';
    END IF;

    -- Only what is compared: the old body is not needed here.
    SELECT dd.id, dd.content_sha256, dd.title, dd.metadata INTO d
      FROM rag.documents dd WHERE dd.watch_id = w.id AND dd.source_key = q.key;
    IF NOT coalesce(v_found, false) OR v_content IS NULL OR NOT rag._has_text(v_content) THEN
        -- Gone, unpublished or empty: it leaves the index.
        IF d.id IS NOT NULL THEN
            DELETE FROM rag.documents WHERE id = d.id;
            action := 'deleted';
        ELSE
            action := 'nothing';
        END IF;
        document_id := d.id;
        RETURN;
    END IF;
    -- The bounds rag_ingest puts on what every search result and answer carries: whoever may write to the
    -- watched table would otherwise set them for every reader of the collection.
    IF v_title_bytes > rag._limit('document_title_max_bytes')::integer THEN
        RAISE EXCEPTION 'the row''s title is % bytes, above the % a document''s title may be',
                        v_title_bytes, rag._limit('document_title_max_bytes')
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Shorten the watch''s title expression (left(..., n)).';
    END IF;
    IF v_metadata_bytes > rag._limit('document_metadata_max_bytes')::integer THEN
        RAISE EXCEPTION 'the row''s metadata takes % bytes or more as JSON, above the % a document''s metadata may be',
                        v_metadata_bytes, rag._limit('document_metadata_max_bytes')
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Watch fewer or shorter metadata columns.';
    END IF;
    v_sha := sha256(convert_to(v_content, 'UTF8'));
    v_metadata := v_metadata || jsonb_build_object('source', w.source_name, 'key', q.key);
    -- A new title is a new text to embed (each chunk's header names it: rag.chunks.header), so only new metadata
    -- relabels a document in place.
    IF d.id IS NOT NULL AND d.content_sha256 = v_sha AND d.title = coalesce(v_title, '') THEN
        IF d.metadata IS DISTINCT FROM v_metadata THEN
            UPDATE rag.documents SET metadata = v_metadata, updated_at = now() WHERE id = d.id;
            action := 'relabelled';
        ELSE
            action := 'unchanged';
        END IF;
        document_id := d.id;
        RETURN;
    END IF;
    IF d.id IS NULL THEN
        -- A new row's document takes the way an ingested one does: queued, then chunked and stored a batch at a
        -- time by the worker's next step. Handed back to the worker here, its text was held again for the
        -- reply and its chunks all at once (a 20 MB row took a worker to 176 MB, an ingested 20 MB document
        -- to 38 MB).
        INSERT INTO rag.documents (collection_id, title, source, metadata, body, content_sha256, watch_id, source_key)
        VALUES (c.id, coalesce(v_title, ''), w.source_name, v_metadata, v_content, v_sha, w.id, q.key)
        RETURNING id INTO document_id;
        INSERT INTO rag.queue (document_id, collection_id) VALUES (document_id, c.id);
        action := 'queued';
        RETURN;
    END IF;
    UPDATE rag.documents SET title = coalesce(v_title, ''), metadata = v_metadata, body = v_content,
           content_sha256 = v_sha, status = 'processing', failure_reason = NULL, updated_at = now()
     WHERE id = d.id;
    document_id := d.id;
    action := 'chunk';
END $$;

-- A changed document's chunks are replaced in three steps in one transaction, so that its new chunks are stored
-- a batch at a time as a new document's are (all at once, a 20 MB row took the worker to 176 MB), and a chunk
-- whose text and header did not change keeps what was embedded. First its old chunks are set aside: deleted,
-- with the vectors of each distinct text and header kept in rag.set_aside_chunks, where rag._store_chunks finds
-- them. The document's row is locked first, as every writer of its chunks does: a delete of it waits, and then
-- deletes these chunks with it (rag._documents_deleted). The DELETE is planned for the collection at hand: a
-- generic plan of an UPDATE or DELETE of rag.chunks takes a ROW EXCLUSIVE lock on every partition when it
-- starts, so an index build of another collection (its SHARE lock held for seconds, or until the end of a
-- creating admin's transaction) held the writes of every collection. The other writers of rag.chunks' rows
-- plan per call the same way (rag._documents_deleted, rag_reindex) or run built statements (EXECUTE).
CREATE FUNCTION rag._set_aside_chunks(p_document_id bigint) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_collection integer;
BEGIN
    SELECT collection_id INTO v_collection FROM rag.documents WHERE id = p_document_id FOR UPDATE;
    -- Both vector columns are kept for unchanged text: the searched one, and the other one while a model change
    -- fills it.
    WITH old AS (
        DELETE FROM rag.chunks WHERE collection_id = v_collection AND document_id = p_document_id
        RETURNING content, header, embedding, embedding_alt
    )
    INSERT INTO rag.set_aside_chunks (document_id, content, header, embedding, embedding_alt)
    SELECT DISTINCT ON (content, header) p_document_id, content, header, embedding, embedding_alt FROM old
     WHERE embedding IS NOT NULL OR embedding_alt IS NOT NULL
     ORDER BY content, header, (embedding IS NOT NULL AND embedding_alt IS NOT NULL) DESC;
END $$;

-- The last step of a replacement, once every new chunk is stored: forgets what was set aside, counts what is
-- embedded, and queues the document for the chunks that need a vector. Returns how many do.
CREATE FUNCTION rag._end_replacing_chunks(p_document_id bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_collection integer;
    v_total integer;
    v_embedded integer;
    v_missing integer;
BEGIN
    DELETE FROM rag.set_aside_chunks WHERE document_id = p_document_id;
    SELECT collection_id INTO v_collection FROM rag.documents WHERE id = p_document_id;
    SELECT k.total, k.embedded INTO v_total, v_embedded FROM rag._chunk_counts(p_document_id) k;
    v_missing := v_total - v_embedded;
    UPDATE rag.documents SET
           chunks_total = v_total,
           chunks_embedded = v_embedded,
           status = CASE WHEN v_missing = 0 THEN 'ready' ELSE 'processing' END,
           ready_at = CASE WHEN v_missing = 0 THEN now() ELSE ready_at END
     WHERE id = p_document_id;
    IF v_missing > 0 OR rag._needs_shadow(p_document_id) THEN
        INSERT INTO rag.queue (document_id, collection_id) VALUES (p_document_id, v_collection)
        ON CONFLICT (document_id) DO UPDATE SET not_before = now(), attempts = 0, first_failure_at = NULL;
    END IF;
    RETURN v_missing;
END $$;

-- Done with a queued key, unless it was queued again meanwhile (then its newer version waits its turn).
CREATE FUNCTION rag._row_done(p_row_queue_id bigint, p_version bigint, p_error text) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM rag.row_queue WHERE id = p_row_queue_id AND version = p_version AND p_error IS NULL;
    -- attempts already counts this one (rag._claim_row): the back-off is 30 s after the first failure, doubling.
    UPDATE rag.row_queue SET claimed_by = NULL, last_error = left(p_error, 2000),
           attempts = CASE WHEN p_error IS NULL THEN 0 ELSE greatest(attempts, 1) END,
           not_before = CASE WHEN p_error IS NULL THEN not_before
                             ELSE now() + least(interval '30 seconds' * power(2, least(greatest(attempts, 1) - 1, 7)),
                                                interval '1 hour') END
     WHERE id = p_row_queue_id;
$$;

-- A row refused over a limit (its text or title too large, its markup too deep: the worker's step raised an
-- error of class 54): reading it again gives the same answer until it changes, so it is not tried again until
-- it is written to (the watch's triggers queue it with a new version and a due time) or rag_reindex(table);
-- rag.watch_status counts it as failed, not pending. Unless a write queued a newer version meanwhile.
-- The row's document of an earlier version, if it had one, goes: it would go on answering with text the row no
-- longer holds, and count as ready beside the failure.
CREATE FUNCTION rag._row_refused(p_row_queue_id bigint, p_version bigint, p_error text) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM rag.documents d USING rag.row_queue q
     WHERE q.id = p_row_queue_id AND q.version = p_version AND d.watch_id = q.watch_id AND d.source_key = q.key;
    UPDATE rag.row_queue SET claimed_by = NULL, last_error = left(p_error, 2000), attempts = greatest(attempts, 1),
           not_before = 'infinity'
     WHERE id = p_row_queue_id AND version = p_version;
    UPDATE rag.row_queue SET claimed_by = NULL WHERE id = p_row_queue_id AND version <> p_version;
$$;

-- Per watched table: rows indexed, chunks, pending and failed, last error (Drupal's status page by type).
-- A security barrier, as rag.status is.
CREATE VIEW rag.watch_status WITH (security_barrier) AS
SELECT w.source_name AS source,
       c.name AS collection,
       -- What the watch's rows are (counts, the errors that quote their values) is shown only to roles that
       -- may read the whole table, as a plain SELECT of rag.documents shows its documents.
       CASE WHEN v.whole THEN (SELECT count(*) FROM rag.documents d WHERE d.watch_id = w.id) END AS rows_indexed,
       CASE WHEN v.whole THEN (SELECT count(*) FROM rag.documents d WHERE d.watch_id = w.id AND d.status = 'ready')
       END AS rows_ready,
       CASE WHEN v.whole THEN (SELECT count(*) FROM rag.documents d WHERE d.watch_id = w.id AND d.status = 'failed')
                              + (SELECT count(*) FROM rag.row_queue q WHERE q.watch_id = w.id
                                                                         AND q.not_before = 'infinity')
       END AS rows_failed,
       -- The documents' counts, not a look into rag.chunks, which a view would plan over every partition.
       CASE WHEN v.whole THEN (SELECT coalesce(sum(d.chunks_total), 0) FROM rag.documents d WHERE d.watch_id = w.id)::bigint
       END AS chunks,
       CASE WHEN v.whole THEN
       (SELECT count(*) FROM rag.row_queue q WHERE q.watch_id = w.id AND q.not_before < 'infinity')
         + (SELECT coalesce(sum(coalesce(jsonb_array_length(b.keys), cardinality(b.key_values::text[]))), 0)
              FROM rag.row_batches b WHERE b.watch_id = w.id)
         + (SELECT count(*) FROM rag.documents d WHERE d.watch_id = w.id AND d.status = 'processing') END AS pending,
       -- A watch of a partitioned table (0.1.0 made them; the upgrade kept them) indexes nothing and fails no
       -- row, so without this it would look idle and healthy to anyone who missed the upgrade's warning.
       coalesce(CASE WHEN (SELECT t.relkind FROM pg_catalog.pg_class t WHERE t.oid = w.source) = 'p'
                     THEN format('the watch indexes nothing: %s is a partitioned table, whose rows are in its '
                                 'partitions; rag_unwatch it, then rag_watch each partition', w.source_name) END,
                CASE WHEN NOT rag._key_is_unique(w.source, w.key_columns)
                     THEN format('the key (%s) no longer names one row (no unique index covers it): its documents '
                                 'are shown only to roles that may read the whole table',
                                 array_to_string(w.key_columns, ', ')) END,
                (SELECT format('key column "%s" has a type whose text depends on session settings: its documents '
                               'are shown only to roles that may read the whole table; rag_unwatch the table and '
                               'watch it by another unique key', u.column_name)
                   FROM rag._key_unstable_column(w.source, w.key_columns) AS u(column_name)
                  WHERE u.column_name IS NOT NULL),
                rag._watch_triggers_problem(w.source)
                    || format('; its owner puts them back with SELECT rag_reindex(%L::regclass)', w.source_name),
                CASE WHEN v.whole THEN e.reason
                     WHEN e.reason IS NOT NULL
                     THEN 'rows of this table failed to index; the reasons quote their values, so they are shown '
                          'only to roles that may read the whole table' END) AS last_error
  FROM rag.watches w JOIN rag.collections c ON c.id = w.collection_id
  CROSS JOIN LATERAL (SELECT w.id = ANY ((SELECT rag._watches_readable_whole(current_user))::integer[]) AS whole) v
  LEFT JOIN LATERAL (
        SELECT coalesce((SELECT max(q.last_error) FROM rag.row_queue q WHERE q.watch_id = w.id),
                        (SELECT d.failure_reason FROM rag.documents d
                          WHERE d.watch_id = w.id AND d.failure_reason IS NOT NULL
                          ORDER BY d.updated_at DESC LIMIT 1)) AS reason) e ON true
 WHERE c.id = ANY ((SELECT rag._collections_with(current_user, 'read'))::integer[]);

-- rows_watched needs a count over the user's table, so it is a function, not a column of the view.
CREATE FUNCTION @extschema@.rag_watch_status()
RETURNS TABLE (source text, collection text, rows_watched bigint, rows_indexed bigint, rows_ready bigint,
               rows_failed bigint, chunks bigint, pending bigint, last_error text)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    s record;
    w rag.watches;
    v_caller name := rag._calling_role();
    v_whole integer[] := rag._watches_readable_whole(v_caller);
    v_readable integer[] := rag._collections_with(v_caller, 'read');
BEGIN
    -- This function runs as the extension's owner, for whom the view shows every watch and all of it: keep the
    -- caller's watches, and show what the view would show the caller.
    FOR s IN SELECT * FROM rag.watch_status ws
              WHERE ws.collection = ANY (SELECT c.name FROM rag.collections c WHERE c.id = ANY (v_readable))
              ORDER BY 1 LOOP
        SELECT * INTO w FROM rag.watches WHERE source_name = s.source;
        IF NOT FOUND THEN
            CONTINUE;  -- unwatched (or renamed) since the loop's snapshot
        END IF;
        source := s.source; collection := s.collection; rows_indexed := s.rows_indexed; rows_ready := s.rows_ready;
        rows_failed := s.rows_failed; chunks := s.chunks; pending := s.pending; last_error := s.last_error;
        rows_watched := NULL;
        IF NOT w.id = ANY (v_whole) THEN
            rows_indexed := NULL; rows_ready := NULL; rows_failed := NULL; chunks := NULL; pending := NULL;
            IF s.last_error IS NOT NULL
               AND (SELECT t.relkind FROM pg_catalog.pg_class t WHERE t.oid = w.source) IS DISTINCT FROM 'p' THEN
                last_error := 'rows of this table failed to index; the reasons quote their values, so they are '
                              'shown only to roles that may read the whole table';
            END IF;
        ELSE
            -- Counted with the owner's rights (the filter is the owner's code and never runs with anyone
            -- else's), so past the table's row-level security: shown only to callers who may read it whole.
            -- A filter that fails on a row fails the count: that watch's count is unknown (and says why), the
            -- other watches are still listed (one row of one table had made the whole call fail).
            BEGIN
                SELECT x::text::bigint INTO rows_watched
                  FROM rag._query_as(rag._watch_runs_as(w),
                                     format('SELECT to_jsonb(count(*)) FROM ONLY %s AS r WHERE %s', w.source::regclass,
                                            (SELECT filter FROM rag._watch_exprs(w)))) AS x;
            EXCEPTION WHEN OTHERS THEN
                last_error := coalesce(last_error, left('counting the rows failed: ' || SQLERRM, 2000));
            END;
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- Here rather than beside the tables in schema.sql: it asks rag._watches_readable_whole, defined above.
-- A security barrier: the view runs as its owner, so its WHERE is all that keeps other roles' collections out,
-- and a caller's own function in a WHERE of theirs must not see a row before it.
CREATE VIEW rag.status WITH (security_barrier) AS
SELECT c.name AS collection,
       c.embedding_provider,
       c.embedding_model,
       c.dimensions,
       coalesce(d.processing, 0) AS documents_processing,
       coalesce(d.ready, 0) AS documents_ready,
       coalesce(d.failed, 0) AS documents_failed,
       coalesce(d.chunks_embedded, 0) AS chunks_embedded,
       coalesce(d.chunks_total, 0) AS chunks_total,
       coalesce(q.depth, 0) AS queue_depth,
       q.oldest AS oldest_pending,
       e.last_error,
       m.embedding_model AS migrating_to,
       m.state AS migration_state,
       -- Counted only while a model change runs.
       CASE WHEN m.state = 'embedding' THEN rag._migration_chunks_embedded(c.id) ELSE 0 END
           AS migration_chunks_embedded,
       m.failure_reason AS migration_error,
       -- A failing upkeep step that rests (rag.upkeep_failures): the most recent, when several fail.
       u.upkeep_error,
       u.upkeep_retry_at,
       -- The worker claims and tidies nothing while a restore of the database is half done
       -- (rag._restore_under_way); a restore that never reaches its post-data section leaves it so for good,
       -- which the server log alone said.
       CASE WHEN restore.under_way
            THEN 'a restore of this database is not finished (a partition of rag.chunks has no primary key yet, '
                 'a superuser''s pg_restore is connected, or rows of rag hold ids their sequence has not given '
                 'yet, as a restore sets the sequences after the rows): nothing is embedded until it is'
       END AS worker_waiting_for
  FROM rag.collections c
  CROSS JOIN (SELECT rag._restore_under_way() AS under_way) restore
  LEFT JOIN rag.migrations m ON m.collection_id = c.id
  LEFT JOIN LATERAL (
        SELECT format('%s failed %s time%s in a row: %s', f.step, f.failures,
                      CASE WHEN f.failures = 1 THEN '' ELSE 's' END, f.last_error) AS upkeep_error,
               f.next_try AS upkeep_retry_at
          FROM rag.upkeep_failures f
         WHERE f.collection_id = c.id
         ORDER BY f.next_try DESC LIMIT 1) u ON true
  -- Documents of watched rows count only for roles that may read the whole table (as a plain SELECT of
  -- rag.documents shows them): an error evaluating a watch's expression quotes the row's values, and the
  -- counts would count rows the table's rules keep from the reader.
  CROSS JOIN LATERAL (SELECT (SELECT rag._watches_readable_whole(current_user)) AS ids) whole
  LEFT JOIN LATERAL (
        SELECT count(*) FILTER (WHERE status = 'processing') AS processing,
               count(*) FILTER (WHERE status = 'ready') AS ready,
               count(*) FILTER (WHERE status = 'failed') AS failed,
               sum(chunks_embedded) AS chunks_embedded,
               sum(chunks_total) AS chunks_total
          FROM rag.documents
         WHERE collection_id = c.id AND (watch_id IS NULL OR watch_id = ANY (whole.ids))) d ON true
  LEFT JOIN LATERAL (
        SELECT count(*) AS depth, min(qu.enqueued_at) AS oldest
          FROM rag.queue qu JOIN rag.documents qd ON qd.id = qu.document_id
         WHERE qd.collection_id = c.id AND (qd.watch_id IS NULL OR qd.watch_id = ANY (whole.ids))) q ON true
  LEFT JOIN LATERAL (
        SELECT coalesce(qu.last_error, qd.failure_reason) AS last_error
          FROM rag.documents qd LEFT JOIN rag.queue qu ON qu.document_id = qd.id
         WHERE qd.collection_id = c.id AND (qd.watch_id IS NULL OR qd.watch_id = ANY (whole.ids))
           AND (qu.last_error IS NOT NULL OR qd.failure_reason IS NOT NULL)
         ORDER BY qd.updated_at DESC LIMIT 1) e ON true
 WHERE c.id = ANY ((SELECT rag._collections_with(current_user, 'read'))::integer[]);
COMMENT ON VIEW rag.status IS 'Per collection: documents by status, chunks embedded of total, queue depth, oldest pending item, last error, a model change in progress, a failing upkeep step (index build or rebuild, model change) with its next try, and a half-done restore the worker waits for';

-- The extension's schema again, where pgrx creates the Rust functions declared after this file.
SET LOCAL search_path = @extschema@, pg_temp;
