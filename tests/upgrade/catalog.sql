-- Everything the extension defines in a database, one row per fact: (kind, object, definition). An upgraded
-- database and a fresh install of the same version must give the same rows. User data is left out on purpose:
-- each collection's partition of rag.chunks with its indexes (rag._ensure_partition), and grants to roles other than the
-- extension's own (rag_watch grants the owner of each watched table what its trigger needs).
-- Column order is not compared: ALTER TABLE can only append a column, and nothing in the extension reads
-- columns by position (every INSERT and SELECT names them; pg_dump does too).
WITH ext AS (
    SELECT oid, extnamespace FROM pg_catalog.pg_extension WHERE extname = 'rag'
), members AS (
    SELECT d.classid, d.objid, d.objsubid
      FROM pg_catalog.pg_depend d, ext
     WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
), own_roles AS (
    SELECT oid FROM pg_catalog.pg_roles WHERE rolname IN ('rag_reader', 'rag_writer', 'rag_admin')
), data_indexes AS (
    SELECT format('rag.%I', c.relname) AS name
      FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
     WHERE i.inhparent = 'rag.chunks'::regclass
    UNION ALL
    SELECT format('rag.%I', x.relname)
      FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_index ix ON ix.indrelid = i.inhrelid
      JOIN pg_catalog.pg_class x ON x.oid = ix.indexrelid
     WHERE i.inhparent = 'rag.chunks'::regclass
), rels AS (
    SELECT c.oid, c.relname, c.relkind, c.relacl, c.relrowsecurity, c.relforcerowsecurity, c.reloptions,
           c.relpersistence
      FROM pg_catalog.pg_class c
     WHERE c.relnamespace = 'rag'::regnamespace
       AND format('rag.%I', c.relname) NOT IN (SELECT name FROM data_indexes)
       AND c.relkind <> 't'
), funcs AS (
    SELECT p.* FROM pg_catalog.pg_proc p JOIN members m ON m.classid = 'pg_catalog.pg_proc'::regclass AND m.objid = p.oid
)
-- Privileges as (grantee, privileges), only for PUBLIC and the extension's roles.
, acl AS (
    SELECT x.kind, x.object,
           string_agg(format('%s=%s', CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END,
                             a.privilege_type || CASE WHEN a.is_grantable THEN '*' ELSE '' END),
                      ',' ORDER BY a.grantee::regrole::text, a.privilege_type) AS granted
      FROM (SELECT 'table acl' AS kind, format('rag.%I', relname) AS object, relacl AS acl FROM rels
            UNION ALL
            SELECT 'function acl', f.oid::regprocedure::text, f.proacl FROM funcs f
            UNION ALL
            SELECT 'schema acl', nspname, nspacl FROM pg_catalog.pg_namespace WHERE nspname IN ('rag', 'rag_definer')) x,
           LATERAL pg_catalog.aclexplode(x.acl) a
     WHERE a.grantee = 0 OR a.grantee IN (SELECT oid FROM own_roles)
     GROUP BY x.kind, x.object
)
-- One line per fact: newlines in bodies are shown as \n.
SELECT kind, object, replace(definition, E'\n', '\n') FROM (
    SELECT 'member' AS kind, pg_catalog.pg_describe_object(classid, objid, objsubid) AS object, '' AS definition
      FROM members
    UNION ALL
    SELECT 'function', f.oid::regprocedure::text,
           concat_ws(' | ', pg_catalog.pg_get_function_arguments(f.oid), pg_catalog.pg_get_function_result(f.oid),
                     l.lanname, f.prokind, f.provolatile, f.proparallel, f.prosecdef, f.proisstrict,
                     f.proleakproof, f.procost, f.prorows, f.proretset, array_to_string(f.proconfig, ';'),
                     f.probin, f.prosrc, f.proowner::regrole::text)
      FROM funcs f JOIN pg_catalog.pg_language l ON l.oid = f.prolang
    UNION ALL
    SELECT 'relation', format('rag.%I', relname),
           concat_ws(' | ', relkind, relrowsecurity, relforcerowsecurity, array_to_string(reloptions, ';'),
                     relpersistence)
      FROM rels
    UNION ALL
    SELECT 'column', format('rag.%I.%I', r.relname, a.attname),
           concat_ws(' | ', pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
                     a.attgenerated, pg_catalog.pg_get_expr(d.adbin, d.adrelid), a.attcollation)
      FROM rels r JOIN pg_catalog.pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE r.relkind IN ('r', 'v', 'p', 'm', 'f', 'c')
    UNION ALL
    SELECT 'constraint', format('rag.%I: %s', r.relname, c.conname), pg_catalog.pg_get_constraintdef(c.oid)
      FROM pg_catalog.pg_constraint c JOIN rels r ON r.oid = c.conrelid
    UNION ALL
    SELECT 'index', format('rag.%I', r.relname), pg_catalog.pg_get_indexdef(r.oid)
      FROM rels r WHERE r.relkind = 'i'
    UNION ALL
    -- With when it fires (pg_get_triggerdef leaves that out): rag.row_batches' own trigger is ALWAYS.
    SELECT 'trigger', format('rag.%I: %s', r.relname, t.tgname),
           pg_catalog.pg_get_triggerdef(t.oid) || ' (enabled ' || t.tgenabled::text || ')'
      FROM pg_catalog.pg_trigger t JOIN rels r ON r.oid = t.tgrelid WHERE NOT t.tgisinternal
    UNION ALL
    SELECT 'policy', format('%s.%s: %s', schemaname, tablename, policyname),
           concat_ws(' | ', permissive, array_to_string(roles, ','), cmd, qual, with_check)
      FROM pg_catalog.pg_policies WHERE schemaname = 'rag'
    UNION ALL
    SELECT 'view', format('rag.%I', relname), pg_catalog.pg_get_viewdef(oid)
      FROM rels WHERE relkind IN ('v', 'm')
    UNION ALL
    SELECT 'sequence', format('%s.%s', schemaname, sequencename),
           concat_ws(' | ', data_type, start_value, min_value, max_value, increment_by, cycle, cache_size)
      FROM pg_catalog.pg_sequences WHERE schemaname = 'rag'
    UNION ALL
    SELECT 'type', t.oid::regtype::text, concat_ws(' | ', t.typtype, t.typrelid <> 0)
      FROM pg_catalog.pg_type t
     WHERE t.typnamespace = 'rag'::regnamespace AND t.typtype NOT IN ('c', 'b') AND t.typrelid = 0
    UNION ALL
    SELECT kind, object, granted FROM acl
    UNION ALL
    SELECT 'dumped with the database', c::regclass::text, coalesce(e.extcondition[i], '')
      FROM pg_catalog.pg_extension e, unnest(e.extconfig) WITH ORDINALITY AS u(c, i)
     WHERE e.extname = 'rag'
    UNION ALL
    SELECT 'role', r.rolname, concat_ws(' | ', r.rolcanlogin, r.rolsuper,
           (SELECT string_agg(g.rolname, ',' ORDER BY g.rolname) FROM pg_catalog.pg_auth_members m
              JOIN pg_catalog.pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid))
      FROM pg_catalog.pg_roles r WHERE r.oid IN (SELECT oid FROM own_roles)
    UNION ALL
    SELECT 'extension', extname, concat_ws(' | ', extversion, extrelocatable, extnamespace::regnamespace::text)
      FROM pg_catalog.pg_extension WHERE extname = 'rag'
) facts
ORDER BY kind, object, definition;
