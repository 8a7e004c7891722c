-- Objects a role with CREATE on the extension's schema (public: since PostgreSQL 15 its database's owner) plants
-- before a superuser installs or updates rag: functions, aggregates and operators of the names of built-ins
-- that match a call more closely than the built-in does (`format(text, text)` against `format(text, VARIADIC
-- "any")`, `>=(real, integer)` where pg_catalog would convert the integer). Run as that role (SET ROLE). Every
-- one of them records its call in public.hostile_calls and answers NULL; rag's scripts must neither call nor
-- bind any of them (hostile_bindings.sql). Only overloads pg_catalog does not define are made: one of the
-- same signature would lose to pg_catalog's anyway.
CREATE TABLE public.hostile_calls (called_by name, as_superuser boolean, called text);
GRANT INSERT, SELECT ON public.hostile_calls TO PUBLIC;

DO $plant$
DECLARE
    v_types text[] := ARRAY['integer', 'bigint', 'smallint', 'real', 'double precision', 'numeric', 'text', 'name',
                            'oid', 'regrole', 'regclass', 'regnamespace', 'jsonb', 'boolean', 'timestamptz',
                            'interval', 'bytea', '"char"', 'text[]', 'name[]', 'integer[]', 'bigint[]'];
    v_operators text[] := ARRAY['=', '<>', '<', '<=', '>', '>=', '||', '~', '~~', '@>', '<@', '&&', '?', '->>'];
    v_functions text[] := ARRAY['format', 'concat', 'concat_ws', 'jsonb_build_object', 'json_build_object',
                                'jsonb_build_array', 'to_jsonb', 'to_json', 'array_length', 'cardinality',
                                'array_position', 'array_append', 'array_cat', 'array_to_string', 'unnest',
                                'num_nonnulls', 'num_nulls', 'pg_typeof', 'quote_nullable', 'quote_literal',
                                'array_remove', 'array_prepend', 'jsonb_agg_strict', 'row_to_json',
                                'jsonb_strip_nulls', 'string_to_array', 'regexp_replace', 'hashtext', 'md5',
                                'left', 'length', 'lower', 'upper', 'substr', 'position', 'split_part'];
    v_signatures text[] := ARRAY['text', 'text, text', 'text, text, text', 'text, text, text, text',
                                 'text, text, text, text, text', 'text, integer', 'text, bigint', 'text, name',
                                 'text, regclass', 'text, oid', 'text, jsonb', 'name', 'name, name', 'integer',
                                 'bigint', 'text[]', 'integer[]', 'bigint[]', 'text[], integer', 'text[], text',
                                 'bigint[], bigint', 'integer[], integer', 'regclass', 'jsonb', 'text, text[]',
                                 'name, text', 'regrole', 'oid'];
    v_aggregates text[] := ARRAY['array_agg', 'count', 'jsonb_agg', 'json_agg', 'string_agg', 'max', 'min',
                                 'bool_and', 'bool_or', 'sum', 'jsonb_object_agg'];
    v_left text;
    v_right text;
    v_name text;
    v_signature text;
    v_body text := $body$BEGIN
        INSERT INTO public.hostile_calls VALUES (current_user,
            (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user), %L);
        RETURN NULL;
    END$body$;
BEGIN
    FOREACH v_left IN ARRAY v_types LOOP
        FOREACH v_right IN ARRAY v_types LOOP
            EXECUTE pg_catalog.format('CREATE FUNCTION public.hostile_test(%s, %s) RETURNS boolean LANGUAGE plpgsql AS %L',
                                      v_left, v_right, pg_catalog.format(v_body, 'operator (' || v_left || ', ' || v_right || ')'));
            EXECUTE pg_catalog.format('CREATE FUNCTION public.hostile_join(%s, %s) RETURNS text LANGUAGE plpgsql AS %L',
                                      v_left, v_right, pg_catalog.format(v_body, 'operator || (' || v_left || ', ' || v_right || ')'));
            FOREACH v_name IN ARRAY v_operators LOOP
                CONTINUE WHEN EXISTS (
                    SELECT 1 FROM pg_catalog.pg_operator o
                     WHERE o.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::regnamespace
                       AND o.oprname OPERATOR(pg_catalog.=) v_name
                       AND o.oprleft OPERATOR(pg_catalog.=) v_left::regtype
                       AND o.oprright OPERATOR(pg_catalog.=) v_right::regtype);
                EXECUTE pg_catalog.format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.%s)',
                                          v_name, v_left, v_right,
                                          CASE v_name WHEN '||' THEN 'hostile_join' WHEN '->>' THEN 'hostile_join'
                                                      ELSE 'hostile_test' END);
            END LOOP;
        END LOOP;
    END LOOP;
    FOREACH v_name IN ARRAY v_functions LOOP
        FOREACH v_signature IN ARRAY v_signatures LOOP
            CONTINUE WHEN pg_catalog.to_regprocedure(pg_catalog.format('pg_catalog.%I(%s)', v_name, v_signature)) IS NOT NULL;
            EXECUTE pg_catalog.format('CREATE FUNCTION public.%I(%s) RETURNS text LANGUAGE plpgsql AS %L', v_name,
                                      v_signature, pg_catalog.format(v_body, v_name || '(' || v_signature || ')'));
        END LOOP;
    END LOOP;
    FOREACH v_left IN ARRAY ARRAY['text', 'integer', 'bigint', 'name', 'oid', 'regclass', 'jsonb', 'real',
                                  'boolean', 'text[]'] LOOP
        EXECUTE pg_catalog.format('CREATE FUNCTION public.hostile_step(text, %s) RETURNS text LANGUAGE plpgsql AS %L',
                                  v_left, pg_catalog.format(v_body, 'aggregate over ' || v_left));
        FOREACH v_name IN ARRAY v_aggregates LOOP
            CONTINUE WHEN pg_catalog.to_regprocedure(pg_catalog.format('pg_catalog.%I(%s)', v_name, v_left)) IS NOT NULL;
            EXECUTE pg_catalog.format('CREATE AGGREGATE public.%I(%s) (SFUNC = public.hostile_step, STYPE = text)',
                                      v_name, v_left);
        END LOOP;
    END LOOP;
    -- Shadows of the same signature as a built-in: they lose wherever pg_catalog is searched first (rag 0.2.0's
    -- scripts and functions), and won in 0.1.0's functions, whose search_path put the extension's schema ahead
    -- of pg_catalog: its sql_drop event trigger, which the update's DROPs fire before it is replaced.
    FOR v_name, v_signature IN
        SELECT p.proname, pg_catalog.pg_get_function_arguments(p.oid)
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::regnamespace
           AND p.prokind OPERATOR(pg_catalog.=) 'f'
           AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['pg_event_trigger_dropped_objects', 'now', 'format',
                                                           'current_setting', 'set_config', 'lower', 'length',
                                                           'btrim', 'array_length', 'cardinality', 'quote_ident',
                                                           'pg_get_userbyid', 'to_regclass', 'jsonb_build_object',
                                                           'concat_ws', 'string_agg_transfn', 'has_table_privilege',
                                                           'pg_has_role', 'current_database', 'clock_timestamp'])
           AND NOT p.proname OPERATOR(pg_catalog.=) 'string_agg_transfn'
    LOOP
        BEGIN
            EXECUTE pg_catalog.format(
                'CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L', v_name, v_signature,
                (SELECT pg_catalog.pg_get_function_result(p.oid) FROM pg_catalog.pg_proc p
                  WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::regnamespace
                    AND p.proname OPERATOR(pg_catalog.=) v_name
                    AND pg_catalog.pg_get_function_arguments(p.oid) OPERATOR(pg_catalog.=) v_signature LIMIT 1),
                pg_catalog.replace(pg_catalog.format(v_body, 'same signature: ' || v_name || '(' || v_signature || ')'),
                                   'RETURN NULL;', CASE WHEN EXISTS (
                                       SELECT FROM pg_catalog.pg_proc p
                                        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::regnamespace
                                          AND p.proname OPERATOR(pg_catalog.=) v_name AND p.proretset)
                                   THEN 'RETURN;' ELSE 'RETURN NULL;' END));
        EXCEPTION WHEN OTHERS THEN
            NULL;  -- a signature plpgsql cannot take (internal, any): not one rag's SQL calls
        END;
    END LOOP;
    FOREACH v_left IN ARRAY ARRAY['text', 'integer', 'bigint', 'oid', 'name', 'regclass', 'boolean'] LOOP
        FOREACH v_name IN ARRAY ARRAY['=', '<>'] LOOP
            CONTINUE WHEN EXISTS (SELECT FROM pg_catalog.pg_operator o
                                   WHERE o.oprnamespace OPERATOR(pg_catalog.=) 'public'::regnamespace
                                     AND o.oprname OPERATOR(pg_catalog.=) v_name
                                     AND o.oprleft OPERATOR(pg_catalog.=) v_left::regtype
                                     AND o.oprright OPERATOR(pg_catalog.=) v_left::regtype);
            EXECUTE pg_catalog.format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.hostile_test)',
                                      v_name, v_left, v_left);
        END LOOP;
    END LOOP;
END $plant$;
