-- The extension installs with its dependency, and every function it creates pins its search_path.
CREATE EXTENSION rag CASCADE;
SELECT extname, extrelocatable FROM pg_extension WHERE extname IN ('rag', 'vector') ORDER BY 1;

-- No function of the extension may run with the caller's search_path; but the planner support function and
-- the row trigger that gathers a watch's keys, which run no SQL (11_security checks they have no settings at
-- all), and the wrappers of the entry points, which run as their caller and call only their body, named with
-- its schema (below). The wrappers are in the extension's schema for the entry points users call (rag_*), and in
-- rag for the four functions behind the policies that ask who is calling (rag._acting_for).
SELECT p.oid::regprocedure AS function_without_search_path
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag') AND d.deptype = 'e'
   AND d.classid = 'pg_proc'::regclass
   AND NOT EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')
   AND p.oid NOT IN ('rag._load_library(internal)'::regprocedure, 'rag._watch_key()'::regprocedure,
                   'rag._written_by_rag_only()'::regprocedure)
   AND p.prokind <> 'p'
   AND NOT (NOT p.prosecdef
            AND (p.pronamespace = (SELECT extnamespace FROM pg_extension WHERE extname = 'rag') AND p.proname LIKE 'rag\_%'
                 OR p.pronamespace = 'rag'::regnamespace
                    AND p.proname IN ('_collections_with', '_collections_held_whole', '_watches_readable_whole',
                                      '_ledger_keys_visible'))
            AND p.prosrc = format('SELECT %srag_definer.%I(%s)',
                                  CASE WHEN p.proretset OR p.prorettype = 'record'::regtype
                                            OR EXISTS (SELECT 1 FROM pg_type t WHERE t.oid = p.prorettype AND t.typtype = 'c')
                                       THEN '* FROM ' ELSE '' END,
                                  p.proname,
                                  (SELECT string_agg(CASE WHEN i = p.pronargs AND p.provariadic <> 0 THEN 'VARIADIC ' ELSE '' END
                                                     || '$' || i, ', ' ORDER BY i)
                                     FROM generate_series(1, p.pronargs) i)));
-- The one procedure, rag_await, commits between its checks, which a procedure with a SET clause may not do: it
-- runs as its caller and names everything it uses with its schema (11_security plants a type it would take).
SELECT p.oid::regprocedure AS procedure, p.prosecdef AS definer, p.proconfig
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag') AND d.deptype = 'e'
   AND d.classid = 'pg_proc'::regclass AND p.prokind = 'p';
-- Those wrappers still have a SET clause (so PostgreSQL calls them through the handler whose hook records
-- them), and none switches identity.
SELECT count(*) AS wrappers, count(*) FILTER (WHERE p.proconfig IS NOT NULL AND NOT p.prosecdef) AS hooked_invokers,
       count(*) FILTER (WHERE EXISTS (SELECT 1 FROM unnest(p.proconfig) c WHERE c LIKE 'search_path=%')) AS with_path
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag') AND d.deptype = 'e'
   AND d.classid = 'pg_proc'::regclass
   AND p.pronamespace IN ((SELECT extnamespace FROM pg_extension WHERE extname = 'rag'), 'rag'::regnamespace)
   AND EXISTS (SELECT 1 FROM pg_proc b WHERE b.pronamespace = 'rag_definer'::regnamespace
                                         AND b.proname = p.proname AND b.proargtypes = p.proargtypes);

-- Every function of the extension has the extension's owner (rag tells its own frames by that identity).
SELECT count(*) AS functions_of_another_owner
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag') AND d.deptype = 'e'
   AND d.classid = 'pg_proc'::regclass
   AND p.proowner <> (SELECT extowner FROM pg_extension WHERE extname = 'rag');

-- User-facing functions are callable unqualified; internals live in schema rag.
SELECT n.nspname, count(*) FILTER (WHERE p.proname LIKE 'rag\_%') AS user_facing,
       count(*) FILTER (WHERE p.proname LIKE '\_%') AS internal
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag') AND d.deptype = 'e'
   AND d.classid = 'pg_proc'::regclass
 GROUP BY 1 ORDER BY 1;

-- Every function of rag that runs as its owner is in schema rag or, for each one users call (rag_*) and the
-- four behind the policies, in rag_definer behind a wrapper with its name and arguments that does not switch
-- identity (in the extension's schema, and in rag for the four): rag reads who called from the wrapper's
-- frame (src/frames.rs, sql/security.sql).
SELECT p.oid::regprocedure AS definer_elsewhere
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag') AND d.deptype = 'e'
   AND d.classid = 'pg_proc'::regclass AND p.prosecdef
   AND p.pronamespace <> CASE WHEN p.proname LIKE 'rag\_%'
                                   OR p.proname IN ('_collections_with', '_collections_held_whole',
                                                    '_watches_readable_whole', '_ledger_keys_visible')
                              THEN 'rag_definer' ELSE 'rag' END::regnamespace;
SELECT p.proname LIKE 'rag\_%' AS user_facing, count(*) AS entry_points,
       count(*) FILTER (WHERE NOT w.prosecdef AND w.prolang = (SELECT oid FROM pg_language WHERE lanname = 'sql')
                          AND w.prosrc LIKE '%rag\_definer.' || p.proname || '(%') AS wrapped
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
  LEFT JOIN pg_proc w ON w.proname = p.proname AND w.proargtypes = p.proargtypes
                     AND w.pronamespace = CASE WHEN p.proname LIKE 'rag\_%'
                                               THEN (SELECT extnamespace FROM pg_extension WHERE extname = 'rag')
                                               ELSE 'rag'::regnamespace END
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'rag') AND d.deptype = 'e'
   AND d.classid = 'pg_proc'::regclass AND p.prosecdef AND p.pronamespace = 'rag_definer'::regnamespace
 GROUP BY 1 ORDER BY 1;
SELECT has_schema_privilege('public', 'rag_definer', 'USAGE') AS public_uses_rag_definer;
-- Nothing in schema rag is writable, or even readable, by PUBLIC.
SELECT c.relname, has_table_privilege('public', c.oid, 'SELECT') AS public_select,
       has_table_privilege('public', c.oid, 'INSERT,UPDATE,DELETE') AS public_write
  FROM pg_class c WHERE c.relnamespace = 'rag'::regnamespace AND c.relkind IN ('r', 'p', 'v') ORDER BY 1;

-- The worker was preloaded and a launcher runs.
SELECT count(*) > 0 AS launcher_running FROM pg_stat_activity WHERE backend_type = 'rag launcher';
