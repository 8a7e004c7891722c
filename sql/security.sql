-- Run with pg_catalog first, then rag, and nothing else: schema.sql says why.
SET LOCAL search_path = pg_catalog, rag, pg_temp;

-- Roles, privileges and search_path for everything the extension created. This runs last, so it sees every
-- function: Rust ones, SQL ones, user-facing and internal.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rag_reader') THEN
        CREATE ROLE rag_reader NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rag_writer') THEN
        CREATE ROLE rag_writer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rag_admin') THEN
        CREATE ROLE rag_admin NOLOGIN;
    END IF;
END $$;
GRANT rag_reader TO rag_writer;
GRANT rag_writer TO rag_admin;
-- Roles of these names that existed before (made by a role with CREATEROLE before rag was first installed in the
-- cluster, which since PostgreSQL 16 keeps ADMIN OPTION on the roles it makes) would decide who may do what with
-- rag: such a role could grant itself rag_admin, or have given the roles LOGIN and a password (red team 14). They
-- are taken only as rag makes them: no attribute but NOLOGIN, and nobody but superusers holding ADMIN OPTION.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT a.rolname FROM pg_catalog.pg_roles a
              WHERE a.rolname IN ('rag_reader', 'rag_writer', 'rag_admin')
                AND (a.rolcanlogin OR a.rolsuper OR a.rolcreaterole OR a.rolcreatedb OR a.rolreplication
                     OR a.rolbypassrls)
    LOOP
        RAISE EXCEPTION 'role % exists with attributes rag does not give it (LOGIN, SUPERUSER, CREATEROLE, CREATEDB, '
                        'REPLICATION or BYPASSRLS)', r.rolname
            USING HINT = 'rag''s roles are NOLOGIN groups; a superuser should look into who made the role, then ALTER '
                         'ROLE it NOLOGIN NOCREATEROLE … (or drop it) before installing rag.';
    END LOOP;
    FOR r IN SELECT g.rolname AS granted, h.rolname AS holder
               FROM pg_catalog.pg_auth_members m
               JOIN pg_catalog.pg_roles g ON g.oid = m.roleid
               JOIN pg_catalog.pg_roles h ON h.oid = m.member
              WHERE g.rolname IN ('rag_reader', 'rag_writer', 'rag_admin') AND m.admin_option AND NOT h.rolsuper
    LOOP
        RAISE EXCEPTION 'role % may grant % to anyone (ADMIN OPTION) and is not a superuser', r.holder, r.granted
            USING HINT = format('REVOKE ADMIN OPTION FOR %I FROM %I, after checking whom it granted the role to '
                                '(pg_auth_members), then run the command again.', r.granted, r.holder);
    END LOOP;
END $$;

-- Everything users create is dumped with their database: every table's rows (the seeded 'ollama' and 'local'
-- providers are re-created by CREATE EXTENSION, so they are left out) and every identity sequence's position.
-- rag.chunks itself holds no rows: each collection's partition is a table of the database, not an extension
-- member (rag._ensure_partition), and pg_dump writes it with its rows and indexes and attaches it again.
SELECT pg_catalog.pg_extension_config_dump('rag.providers', $$WHERE name NOT IN ('ollama', 'local')$$);
DO $$
DECLARE
    v_object text;
BEGIN
    -- One call per statement: each call rewrites the extension's catalog row.
    FOREACH v_object IN ARRAY ARRAY['key_grants', 'collections', 'collection_grants', 'migrations', 'watches', 'row_queue',
                                    'row_batches', 'documents', 'queue', 'prices', 'conversations',
                                    'queries', 'messages', 'collections_id_seq', 'watches_id_seq',
                                    'row_queue_id_seq', 'row_batches_id_seq', 'documents_id_seq', 'chunks_id_seq',
                                    'queue_id_seq', 'conversations_id_seq', 'queries_id_seq', 'messages_id_seq'] LOOP
        PERFORM pg_catalog.pg_extension_config_dump(format('rag.%I', v_object), '');
    END LOOP;
END $$;

REVOKE ALL ON SCHEMA rag FROM PUBLIC;
GRANT USAGE ON SCHEMA rag TO rag_reader;
REVOKE ALL ON ALL TABLES IN SCHEMA rag FROM PUBLIC;
-- Readers see what is indexed; nobody but the owner writes the tables directly: writes go through the
-- SECURITY DEFINER functions, which validate them.
-- Row-level security (schema.sql, answer.sql) narrows every one of these to the collections the role may read.
GRANT SELECT ON rag.collections, rag.collection_grants, rag.documents, rag.chunks, rag.status, rag.providers,
                rag.prices, rag.lexeme_shares, rag.lexeme_measures TO rag_reader;
-- The ledger and conversations hold people's questions: each role sees its own rows, and the admins of a
-- collection see all of its rows (policies in answer.sql).
GRANT SELECT ON rag.queries, rag.conversations, rag.messages TO rag_reader;
GRANT SELECT ON rag.ledger_daily TO rag_admin;
GRANT SELECT ON rag.watches, rag.watch_status TO rag_reader;
GRANT SELECT ON rag.migrations TO rag_reader;

-- Every table of rag's is written by rag's functions (as the tables' owner) or by a superuser only, whatever
-- privileges and policies the writer passes: pg_write_all_data with BYPASSRLS passes all of them, and such a
-- role had the worker send keys to its own server, run its expression as a superuser, or show every reader
-- rows a watched table's own policies hid (src/api/written_by_rag.rs). Every table the extension owns, so that
-- one added later is guarded too; once per statement, but per row on rag.chunks, whose partitions (tables of
-- the database, written directly past the parent's statement triggers) take its row triggers, those made
-- later and those a restore attaches included. The one write other roles make, a watch trigger's insert into
-- rag.row_batches, has its policy (watch.sql, rag._may_queue_batch). An update from 0.1.0 runs this block too.
-- A restore with --disable-triggers leaves these triggers ORIGIN; rag._on_alter_table makes them ALWAYS again.
DO $$
DECLARE
    v_table name;
    v_unread boolean;
    v_hint text;
BEGIN
    FOR v_table, v_unread IN
        SELECT c.relname, NOT c.relrowsecurity AND NOT pg_catalog.has_table_privilege('rag_reader', c.oid, 'SELECT')
          FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_class c ON c.oid = d.objid
         WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.deptype = 'e'
           AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.refobjid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'rag')
           AND c.relnamespace = 'rag'::pg_catalog.regnamespace AND c.relkind IN ('r', 'p')
         ORDER BY c.relname
    LOOP
        -- A table no rag role reads (the queues, the chunks set aside while a document is replaced, upkeep's
        -- failures, where keys may go) is read by rag's owner and superusers only, whatever privileges the
        -- reader holds: pg_read_all_data, which does not pass row-level security, read the keys and quoted
        -- values of hidden rows in rag.row_queue and the text of chunks set aside (helper-101). Row-level
        -- security without a policy shows it nobody else, its statistics included (pg_stats hides a table
        -- whose security would apply). rag.chunks' partitions get the same in rag._ensure_partition.
        IF v_unread THEN
            EXECUTE format('ALTER TABLE rag.%I ENABLE ROW LEVEL SECURITY', v_table);
        END IF;
        -- A later update finds it made, and makes it ALWAYS again whatever a command of its own left it (its
        -- ALTER TABLEs are the extension's, which rag._on_alter_table leaves alone).
        IF EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                    WHERE t.tgrelid = format('rag.%I', v_table)::pg_catalog.regclass AND t.tgname = 'written_by_rag') THEN
            EXECUTE format('ALTER TABLE rag.%I ENABLE ALWAYS TRIGGER written_by_rag', v_table);
            CONTINUE;
        END IF;
        v_hint := CASE v_table
            WHEN 'providers' THEN 'Use rag_create_provider and rag_drop_provider.'
            WHEN 'key_grants' THEN 'Use rag_allow_key and rag_disallow_key.'
            WHEN 'watches' THEN 'Use rag_watch, rag_reindex and rag_unwatch.'
            WHEN 'collections' THEN 'Use rag_create_collection, rag_set_search, rag_set_reranker, '
                                    'rag_set_embedding_model and rag_drop_collection.'
            WHEN 'collection_grants' THEN 'Use rag_grant and rag_revoke.'
            WHEN 'migrations' THEN 'Use rag_set_embedding_model and rag_cancel_embedding_model.'
            WHEN 'prices' THEN 'Use rag_set_price.'
            WHEN 'documents' THEN 'Use rag_ingest, rag_ingest_file and rag_delete_document; rag''s worker writes '
                                  'what they queue.'
            WHEN 'conversations' THEN 'Use rag_conversation_start and rag_conversation_delete.'
            ELSE 'rag''s functions and its worker write this table.' END;
        EXECUTE format('CREATE TRIGGER written_by_rag BEFORE %s ON rag.%I FOR EACH %s '
                       'EXECUTE FUNCTION rag._written_by_rag_only(%L)',
                       CASE v_table WHEN 'chunks' THEN 'INSERT OR UPDATE OR DELETE'
                                    WHEN 'row_batches' THEN 'UPDATE OR DELETE OR TRUNCATE'
                                    ELSE 'INSERT OR UPDATE OR DELETE OR TRUNCATE' END,
                       v_table, CASE v_table WHEN 'chunks' THEN 'ROW' ELSE 'STATEMENT' END, v_hint);
        EXECUTE format('ALTER TABLE rag.%I ENABLE ALWAYS TRIGGER written_by_rag', v_table);
    END LOOP;
    -- The queue's policy, for a role that BYPASSRLS lets past it (src/api/written_by_rag.rs); named to fire
    -- after row_batches_free_id, as the policy is checked after every BEFORE trigger.
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                    WHERE t.tgrelid = 'rag.row_batches'::pg_catalog.regclass AND t.tgname = 'row_batches_policy_kept') THEN
        CREATE TRIGGER row_batches_policy_kept BEFORE INSERT ON rag.row_batches
            FOR EACH ROW EXECUTE FUNCTION rag._row_batches_policy_kept();
    END IF;
    ALTER TABLE rag.row_batches ENABLE ALWAYS TRIGGER row_batches_policy_kept;
END $$;

-- rag's event triggers fire whatever session_replication_role says: in replica mode (a role a superuser let set
-- it) a DROP TABLE of a watched table left its watch naming the table's oid, which a dump writes as a bare
-- number that may name another table after a restore (red team 15).
-- (An update from 0.1.0 makes three of them after this, and enables them the same way.)
DO $$
DECLARE
    v_trigger name;
BEGIN
    FOR v_trigger IN SELECT t.evtname FROM pg_catalog.pg_event_trigger t
                      WHERE t.evtname IN ('rag_watch_drop', 'rag_watch_alter', 'rag_publication',
                                          'rag_watch_functions') LOOP
        EXECUTE format('ALTER EVENT TRIGGER %I ENABLE ALWAYS', v_trigger);
    END LOOP;
END $$;

-- The tables readers see in part: no statistics on their columns but keys and flags (rag._hide_statistics), and
-- none kept from before (an update: autovacuum had analyzed them). rag.chunks' partitions follow their parent.
DO $$
DECLARE
    v_table regclass;
BEGIN
    FOR v_table IN SELECT c.oid FROM pg_catalog.pg_class c
                    WHERE c.relnamespace = 'rag'::pg_catalog.regnamespace AND c.relrowsecurity
                      AND c.relkind IN ('r', 'p')
                      -- Not those no policy lets anyone but rag's owner read (above): the worker's plans
                      -- over its queues keep their statistics, which nobody else is shown.
                      AND (c.relispartition OR EXISTS (SELECT 1 FROM pg_catalog.pg_policy p WHERE p.polrelid = c.oid))
                  LOOP
        PERFORM rag._hide_statistics(v_table);
    END LOOP;
    DELETE FROM pg_catalog.pg_statistic s
     USING pg_catalog.pg_class c, pg_catalog.pg_attribute a
     WHERE c.oid = s.starelid AND a.attrelid = s.starelid AND a.attnum = s.staattnum
       AND c.relnamespace = 'rag'::pg_catalog.regnamespace AND a.attstattarget = 0;
END $$;

-- Every entry point that runs as rag's owner is entered through a wrapper of the same name and signature that
-- does not switch identity: `rag_query(...)` is a SQL function calling `rag_definer.rag_query(...)`, the
-- SECURITY DEFINER function written in the files before this one, re-created in the schema rag_definer under its
-- own name (PL/pgSQL bodies name their arguments after their function). The wrapper has SET clauses (the grant
-- loop below gives every function one), so PostgreSQL calls it through its definer call handler, where rag's
-- fmgr_hook records the identity it was called with (and the caller's search_path, which the wrapper leaves
-- as it is): PostgreSQL's own current user at the call, whatever
-- switched identity on the way (a definer function, a foreign key's action, a trigger PostgreSQL runs as
-- another role, CREATE SCHEMA … AUTHORIZATION). `rag._calling_role()` answers with that recorded identity
-- (src/frames.rs). The SECURITY DEFINER halves stay executable by the same roles (the wrapper calls them as its
-- caller), and refuse to act when called without their wrapper. rag_definer is a schema of its own so that a
-- search_path naming rag (for rag.status, say) never finds a definer half in place of its wrapper.
--
-- Generated here rather than written out twice: the wrapper must match its function's arguments, defaults and
-- result exactly. The wrapper keeps the function's oid, which views, rules and SQL-standard function bodies
-- of users are bound to, so an update that brings this scheme to an existing database keeps them calling the
-- wrapper. An update script that redefines an entry point (CREATE OR REPLACE over the wrapper) makes it
-- SECURITY DEFINER again, and this block moves the new body in place of the old one.
-- Plain CREATE: a schema of that name made beforehand (by a database owner, say) stops the install with
-- PostgreSQL's own "already exists" instead of a puzzling "not a member of extension rag".
CREATE SCHEMA rag_definer;
COMMENT ON SCHEMA rag_definer IS 'The SECURITY DEFINER bodies of the rag extension''s public functions, called by them';
DO $$
DECLARE
    f record;
    v_previous regprocedure;
    v_definition text;
    v_header text;
    v_inputs text;
    v_grantee oid;
BEGIN
    FOR f IN
        SELECT p.oid, p.proname, p.proacl, p.proowner, n.nspname, p.pronargs, p.provariadic, p.proretset, p.proisstrict, p.provolatile,
               p.proparallel, p.procost, p.prorows,
               pg_catalog.pg_get_function_arguments(p.oid) AS arguments,
               pg_catalog.oidvectortypes(p.proargtypes) AS argument_types,
               pg_catalog.pg_get_function_result(p.oid) AS result,
               (p.proretset OR p.prorettype = 'record'::regtype
                OR EXISTS (SELECT 1 FROM pg_catalog.pg_type t WHERE t.oid = p.prorettype AND t.typtype = 'c'))
                   AS returns_rows
          FROM pg_depend dep
          JOIN pg_proc p ON p.oid = dep.objid AND dep.classid = 'pg_proc'::regclass
          JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE dep.refclassid = 'pg_extension'::regclass
           AND dep.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag')
           AND dep.deptype = 'e'
           AND p.prosecdef AND p.prokind = 'f'
           AND (pg_catalog.left(p.proname, 4) = 'rag_'
                -- What a role may see, asked by rag's policies and views with current_user: executable by
                -- every reader, so they ask who is calling (rag._acting_for), which needs the wrapper's frame.
                OR p.proname IN ('_collections_with', '_collections_held_whole', '_watches_readable_whole',
                                 '_ledger_keys_visible'))
           AND n.nspname <> 'rag_definer'
    LOOP
        v_previous := pg_catalog.to_regprocedure(format('rag_definer.%I(%s)', f.proname, f.argument_types));
        IF v_previous IS NOT NULL THEN
            EXECUTE format('DROP FUNCTION %s', v_previous);
        END IF;
        -- pg_get_functiondef always names the function with its schema.
        v_definition := pg_catalog.pg_get_functiondef(f.oid);
        v_header := format('CREATE OR REPLACE FUNCTION %I.%I(', f.nspname, f.proname);
        IF pg_catalog.left(v_definition, pg_catalog.length(v_header)) <> v_header THEN
            RAISE EXCEPTION 'unexpected definition of %: %', f.oid::regprocedure, pg_catalog.left(v_definition, 200);
        END IF;
        EXECUTE format('CREATE FUNCTION rag_definer.%I(', f.proname)
                || pg_catalog.substr(v_definition, pg_catalog.length(v_header) + 1);
        -- A role granted EXECUTE on the entry point by hand (not one of rag's, whose grants the loop below
        -- makes) keeps it on the wrapper's oid through an update, and gets the body it calls.
        FOR v_grantee IN
            SELECT DISTINCT a.grantee FROM pg_catalog.aclexplode(f.proacl) a
             WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> f.proowner
               AND a.grantee NOT IN (SELECT r.oid FROM pg_catalog.pg_roles r
                                      WHERE r.rolname IN ('rag_reader', 'rag_writer', 'rag_admin'))
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION rag_definer.%I(%s) TO %I', f.proname, f.argument_types,
                           pg_catalog.pg_get_userbyid(v_grantee));
            EXECUTE format('GRANT USAGE ON SCHEMA rag_definer TO %I', pg_catalog.pg_get_userbyid(v_grantee));
        END LOOP;
        SELECT string_agg(CASE WHEN i = f.pronargs AND f.provariadic <> 0 THEN 'VARIADIC ' ELSE '' END || '$' || i,
                          ', ' ORDER BY i)
          INTO v_inputs FROM generate_series(1, f.pronargs) AS i;
        EXECUTE format('CREATE OR REPLACE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE sql SECURITY INVOKER %s %s '
                       'PARALLEL %s COST %s %s AS %L',
                       f.nspname, f.proname, f.arguments, f.result,
                       CASE f.provolatile WHEN 'i' THEN 'IMMUTABLE' WHEN 's' THEN 'STABLE' ELSE 'VOLATILE' END,
                       CASE WHEN f.proisstrict THEN 'STRICT' ELSE 'CALLED ON NULL INPUT' END,
                       CASE f.proparallel WHEN 's' THEN 'SAFE' WHEN 'r' THEN 'RESTRICTED' ELSE 'UNSAFE' END,
                       f.procost, CASE WHEN f.proretset THEN format('ROWS %s', f.prorows) ELSE '' END,
                       CASE WHEN f.returns_rows THEN 'SELECT * FROM ' ELSE 'SELECT ' END
                       || format('rag_definer.%I(%s)', f.proname, coalesce(v_inputs, '')));
    END LOOP;
END $$;
REVOKE ALL ON SCHEMA rag_definer FROM PUBLIC;
GRANT USAGE ON SCHEMA rag_definer TO rag_reader;
-- The extension's owner's, like everything of rag, whichever superuser ran the update that made it.
DO $$
BEGIN
    EXECUTE format('ALTER SCHEMA rag_definer OWNER TO %I',
                   (SELECT pg_catalog.pg_get_userbyid(e.extowner) FROM pg_extension e WHERE e.extname = 'rag'));
END $$;

DO $$
DECLARE
    f record;
    v_owner oid := (SELECT e.extowner FROM pg_extension e WHERE e.extname = 'rag');
    v_path text;
    v_grantee text;
BEGIN
    -- Only schemas nobody but superusers can create objects in: pg_catalog first, rag, pg_temp last (a caller's
    -- temporary objects never shadow anything). Not the extension's schema nor pgvector's (public, usually,
    -- where the database's owner, and before PostgreSQL 15 everyone, may create objects): pg_catalog first
    -- keeps out a function or operator of the same signature as a built-in one, but not one whose signature
    -- matches a call more closely than the built-in (`*(numeric, integer)` for `numeric * 1000`), which would
    -- then run as rag's owner. rag names pgvector's objects through rag._vector_schema() and its own public
    -- functions through rag_definer; the watch expressions that rag evaluates as a table's owner see the
    -- same path, so they name functions outside pg_catalog with their schema, as PostgreSQL 17's maintenance
    -- commands require of index expressions.
    v_path := 'pg_catalog, rag, pg_temp';
    FOR f IN
        -- The SECURITY DEFINER half of an entry point has the wrapper's name, so it gets the same grants.
        SELECT p.oid::regprocedure AS signature, p.proname, l.lanname, p.proowner, p.prosecdef, p.prokind, p.proconfig,
               (NOT p.prosecdef AND n.nspname <> 'rag_definer'
                AND EXISTS (SELECT 1 FROM pg_proc b JOIN pg_namespace bn ON bn.oid = b.pronamespace
                             WHERE bn.nspname = 'rag_definer' AND b.proname = p.proname
                               AND b.proargtypes = p.proargtypes)) AS is_wrapper
          FROM pg_depend dep
          JOIN pg_proc p ON p.oid = dep.objid AND dep.classid = 'pg_proc'::regclass
          JOIN pg_namespace n ON n.oid = p.pronamespace
          JOIN pg_language l ON l.oid = p.prolang
         WHERE dep.refclassid = 'pg_extension'::regclass
           AND dep.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag')
           AND dep.deptype = 'e'
    LOOP
        -- One owner for every function: rag tells its own frames from a caller's by their owner
        -- (src/frames.rs), and an upgrade run by another superuser than the one who created the extension
        -- makes the functions it adds that superuser's. Only a superuser's: anything created while this script
        -- runs becomes a member of rag, so a function a table owner's code made then (an update checks watch
        -- expressions as their owners) was handed to rag's owner here, SECURITY DEFINER and granted as one of
        -- rag's (review of red team 13: its owner became a superuser through it).
        IF f.proowner <> v_owner AND NOT (SELECT r.rolsuper FROM pg_roles r WHERE r.oid = f.proowner) THEN
            RAISE EXCEPTION 'function % is a member of extension rag but owned by %, who is not a superuser',
                            f.signature, pg_catalog.pg_get_userbyid(f.proowner)
                USING HINT = 'Code of that role ran while rag''s script ran and created it (rag''s own functions belong to '
                             'the extension''s owner): detach and drop that function (ALTER EXTENSION rag DROP FUNCTION '
                             '…, then DROP FUNCTION …) and run the command again.';
        END IF;
        IF f.proowner <> v_owner THEN
            EXECUTE format('ALTER ROUTINE %s OWNER TO %I', f.signature, pg_catalog.pg_get_userbyid(v_owner));
        END IF;
        IF f.prokind = 'p' THEN
            -- rag_await commits between its checks, which a procedure with a SET clause may not do; it is
            -- SECURITY INVOKER and qualifies every name it uses instead (sql/ingest.sql). No other is allowed.
            IF f.prosecdef OR f.proname <> 'rag_await' OR f.lanname <> 'plpgsql' OR f.proconfig IS NOT NULL THEN
                RAISE EXCEPTION 'procedure % may not be part of rag', f.signature;
            END IF;
            EXECUTE format('REVOKE ALL ON PROCEDURE %s FROM PUBLIC, rag_reader, rag_writer, rag_admin', f.signature);
            EXECUTE format('GRANT EXECUTE ON PROCEDURE %s TO rag_reader', f.signature);
            CONTINUE;
        END IF;
        -- The planner support function runs no SQL; a SET clause would put every planning of a call to rag
        -- through PostgreSQL's definer call handler (a GUC nest level and a search_path change). Nor does the
        -- row trigger that gathers a watch's keys (rag._watch_key), called once per row written, nor the guard
        -- of rag's tables (rag._written_by_rag_only), once per row of rag.chunks: through the handler it
        -- doubled the time a COPY of 200,000 rows into a partition took, 1.4 times without.
        IF f.is_wrapper THEN
            -- A wrapper runs as its caller and calls nothing but its body, named with its schema, so the
            -- caller's search_path cannot change what it runs; keeping that path in force when the hook
            -- records the wrapper's frame is what lets a reader's row checks run the watched table's
            -- policies with it (rag._row_visible), as PostgreSQL runs them for the reader's own SELECT.
            EXECUTE format('ALTER FUNCTION %s RESET search_path', f.signature);
            EXECUTE format('ALTER FUNCTION %s SUPPORT rag._load_library', f.signature);
        ELSIF f.proname NOT IN ('_load_library', '_watch_key', '_written_by_rag_only') THEN
            EXECUTE format('ALTER FUNCTION %s SET search_path = %s', f.signature, v_path);
            -- Planning a call to rag loads the library in the caller's frame (src/frames.rs): without
            -- shared_preload_libraries it would otherwise load inside rag's own definer functions, whose
            -- callers it could then not tell apart.
            EXECUTE format('ALTER FUNCTION %s SUPPORT rag._load_library', f.signature);
        END IF;
        IF f.prosecdef THEN
            -- Code running as rag's owner must not be shown to its caller: debug_print_plan (which any role may
            -- set) printed every query such a function ran, with the values bound to it, to a client that
            -- had set client_min_messages = log: other collections' documents and other owners' rows, in
            -- rag_process_queue (red team 12).
            -- Likewise every other message below NOTICE that PostgreSQL or a loaded module sends: with
            -- auto_explain.log_nested_statements on, a client at client_min_messages = log got the plans of
            -- every statement rag ran for its search, with the keys of rows the table's rules hid from it
            -- (red team 16). NOTICE is the default: rag's own notices still reach the caller.
            EXECUTE format('ALTER FUNCTION %s SET debug_print_parse = off SET debug_print_rewritten = off '
                           'SET debug_print_plan = off SET client_min_messages = notice', f.signature);
            -- rag's own triggers and foreign key cascades must fire for what its functions write: a role a
            -- superuser let set session_replication_role (GRANT SET ON PARAMETER, given to ETL and restore
            -- roles) set it to replica, and rag_unwatch then left a collection's watch count unchanged, which
            -- showed a delegated admin the ledger's answers quoting rows hidden from it; rag_drop_collection
            -- left the collection's watch and documents behind (red team 15). A setting only a superuser or
            -- such a role may set, so pinned only while rag's owner is a superuser (PostgreSQL checks it at
            -- each call, as that owner).
            IF (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = f.proowner) THEN
                EXECUTE format('ALTER FUNCTION %s SET session_replication_role = origin', f.signature);
            END IF;
        END IF;
        IF f.proname = 'rag_process_queue' THEN
            -- The worker's steps in a caller's session: row_security = off made a watched table with FORCE ROW
            -- LEVEL SECURITY fail its rows (read as its owner) for the worker too.
            EXECUTE format('ALTER FUNCTION %s SET row_security = on', f.signature);
        END IF;
        IF f.lanname IN ('sql', 'plpgsql') THEN
            -- Our SQL is written for standard strings ('\m' is two characters); a session that turned them off
            -- must not change what it means, nor how a user's watch expression is read.
            EXECUTE format('ALTER FUNCTION %s SET standard_conforming_strings = on', f.signature);
        END IF;
        -- The list below is the whole truth for rag's own roles: an upgrade takes back what it no longer grants.
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC, rag_reader, rag_writer, rag_admin', f.signature);
        v_grantee := CASE
            WHEN f.proname IN ('rag_query', 'rag_chunk', 'rag_wait', 'rag_explain', 'rag_models', 'rag_known_models',
                               '_collection_id', '_search_sql', '_validate_chunking', '_setting',
                               '_calling_role',
                               'rag_ask', 'rag_prompt', 'rag_conversation_start', 'rag_conversation',
                               'rag_conversation_delete', '_conversation_of_caller', 'rag_embed',
                               '_require_writable', '_require_read_committed',
                               '_local_model_window', '_row_visible', '_vector_schema', '_watch_columns', '_limit', '_or_query', '_keyword_index_name',
                               '_keyword_query', '_lexeme_query', '_any_lexeme', '_close_enough',
                               '_rerank_similarity_weight', '_watched', '_with_header', '_rows_waiting', '_still_processing', '_may_commit',
                               '_collection_id_for_caller', '_restore_under_way', '_watches_readable_whole',
                               '_migration_chunks_embedded', '_key_is_unique', '_key_unstable_column',
                               '_watch_triggers_problem', '_watch_trigger_mode_installed', '_watch_body_mark',
                               '_silent_watch_body')
                THEN 'rag_reader'
            WHEN f.proname IN ('rag_extract_text', 'rag_extract_sections', 'rag_html_to_text', 'rag_markdown_to_text',
                               '_to_text', '_has_text')
                THEN 'rag_reader'
            WHEN f.proname IN ('rag_ingest', 'rag_ingest_file', 'rag_delete_document', '_wake_worker')
                THEN 'rag_writer'
            WHEN f.proname IN ('rag_grant', 'rag_revoke', '_collections_with', '_collections_held_whole', '_ledger_keys_visible', '_privilege_rank',
                               '_has_collection_privilege', '_require_privilege', '_check_privilege', '_require_direct_use')
                THEN 'rag_reader'
            WHEN f.proname IN ('rag_create_collection', 'rag_drop_collection', 'rag_process_queue',
                               'rag_set_price', 'rag_create_provider', 'rag_drop_provider', 'rag_watch',
                               'rag_unwatch', 'rag_reindex', 'rag_watch_status', '_check_expression',
                               'rag_set_embedding_model', 'rag_cancel_embedding_model', 'rag_set_reranker',
                               'rag_set_search', 'rag_retry_upkeep',
                               '_validate_reranker',
                               '_check_reranker', '_reranker_installed')
                THEN 'rag_admin'
            ELSE NULL  -- worker internals: superuser only
        END;
        IF v_grantee IS NOT NULL THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f.signature, v_grantee);
        END IF;
    END LOOP;
END $$;
