-- What the objects of hostile_overloads.sql did: every call they recorded, and every object of the database
-- bound to one of them that is not the planting role's own (a constraint, policy, view, default or function
-- of rag's would be). One row per finding; no row is the only right answer. :'planter' is the planting role.
-- Written with every operator and function named with its schema: this very query runs beside those objects.
SELECT pg_catalog.concat('called ', called, ' as ', called_by, CASE WHEN as_superuser THEN ' (a superuser)' END)
  FROM public.hostile_calls
UNION ALL
SELECT pg_catalog.concat('bound: ', pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid), ' -> ',
                         pg_catalog.pg_describe_object(d.refclassid, d.refobjid, 0))
  FROM pg_catalog.pg_depend d
 WHERE ((d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid
         AND EXISTS (SELECT FROM pg_catalog.pg_proc p
                      WHERE p.oid OPERATOR(pg_catalog.=) d.refobjid
                        AND p.proowner OPERATOR(pg_catalog.=) :'planter'::pg_catalog.regrole::pg_catalog.oid))
        OR (d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_operator'::pg_catalog.regclass::pg_catalog.oid
            AND EXISTS (SELECT FROM pg_catalog.pg_operator o
                         WHERE o.oid OPERATOR(pg_catalog.=) d.refobjid
                           AND o.oprowner OPERATOR(pg_catalog.=) :'planter'::pg_catalog.regrole::pg_catalog.oid)))
   -- The planted objects' own ties (an operator to its function, an aggregate to its step function).
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_proc p
                    WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass::pg_catalog.oid
                      AND p.oid OPERATOR(pg_catalog.=) d.objid
                      AND p.proowner OPERATOR(pg_catalog.=) :'planter'::pg_catalog.regrole::pg_catalog.oid)
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_operator o
                    WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_operator'::pg_catalog.regclass::pg_catalog.oid
                      AND o.oid OPERATOR(pg_catalog.=) d.objid
                      AND o.oprowner OPERATOR(pg_catalog.=) :'planter'::pg_catalog.regrole::pg_catalog.oid)
 ORDER BY 1;
