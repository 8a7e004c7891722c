"""Prints the part of an upgrade script that brings every function, view, comment and policy of the extension up
to the new version, taken from the new version's install script (what `cargo pgrx schema` writes):

    python3 scripts/lib/upgrade_functions.py rag--NEW.sql [--new-policies] > part.sql
    python3 scripts/lib/upgrade_functions.py rag--NEW.sql [--new-policies] --update sql/rag--OLD--NEW.sql

--update replaces what lies between the script's "-- BEGIN GENERATED" and "-- END GENERATED" lines, so a
change to the SQL of an unreleased version is carried into its upgrade script by running this again. It keeps
the order the script already has (each statement known by what it defines: a function's name and arguments, a
view's name, a comment's object) and puts a new statement after the one it follows in the install script:
pgrx writes the Rust functions in a different order from one build to the next, and the script should change
only where the SQL did.

Functions and procedures become CREATE OR REPLACE (a dropped or re-typed one must be dropped by hand before
this part, and the catalog comparison in tests/upgrade fails until it is). Tables, indexes, sequences, seeded rows, schemas and
event triggers are left out: their changes are data migrations, written by hand at the top of the script.
Policies and `ENABLE ROW LEVEL SECURITY` are kept only with --new-policies (they are not idempotent; a later
release that changes one writes DROP POLICY / CREATE POLICY by hand). A release tool, not run by the tests."""
import re
import sys


def statements(sql):
    """Splits SQL into statements, keeping each one's leading comments; aware of quotes, dollar quotes and
    comments, which is all PostgreSQL's own scripts and ours use."""
    out, start, i, n = [], 0, 0, len(sql)
    while i < n:
        c = sql[i]
        if sql.startswith("--", i):
            i = sql.find("\n", i)
            i = n if i < 0 else i + 1
        elif sql.startswith("/*", i):
            i = sql.find("*/", i) + 2
        elif c == "'":
            escaped = i > 0 and sql[i - 1] in "eE" and not (sql[i - 2].isalnum() if i > 1 else False)
            i += 1
            while i < n:
                if escaped and sql[i] == "\\":
                    i += 2
                    continue
                if sql[i] == "'":
                    if i + 1 < n and sql[i + 1] == "'":
                        i += 2
                        continue
                    break
                i += 1
            i += 1
        elif c == '"':
            i = sql.find('"', i + 1) + 1
        elif c == "$" and re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", sql[i:]) and not (i > 0 and (sql[i - 1].isalnum() or sql[i - 1] == "_")):
            tag = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", sql[i:]).group(0)
            i = sql.find(tag, i + len(tag)) + len(tag)
        elif c == ";":
            out.append(sql[start:i + 1])
            start = i = i + 1
        else:
            i += 1
    if sql[start:].strip():
        out.append(sql[start:])
    return out


def code_of(statement):
    """The statement without its leading comments and blank lines."""
    code = statement
    while True:
        code = code.lstrip()
        if code.startswith("--"):
            code = code[code.find("\n") + 1:] if "\n" in code else ""
        elif code.startswith("/*"):
            code = code[code.find("*/") + 2:]
        else:
            return code.strip()


KEEP = (r"CREATE\s+FUNCTION", r"CREATE\s+OR\s+REPLACE\s+FUNCTION", r"CREATE\s+(OR\s+REPLACE\s+)?PROCEDURE", r"CREATE\s+(OR\s+REPLACE\s+)?VIEW",
        r"COMMENT\s+ON", r"GRANT", r"REVOKE", r"SELECT\s+pg_catalog\.pg_extension_config_dump", r"DO\b")
POLICY = (r"CREATE\s+POLICY", r"ALTER\s+TABLE\s+\S+\s+ENABLE\s+ROW\s+LEVEL\s+SECURITY")
SKIP = (r"CREATE\s+(UNLOGGED\s+)?TABLE", r"CREATE\s+(UNIQUE\s+)?INDEX", r"CREATE\s+SCHEMA", r"CREATE\s+(EVENT\s+)?TRIGGER",
        r"INSERT\s+INTO", r"CREATE\s+SEQUENCE", r"CREATE\s+TYPE", r"ALTER\s+TABLE")


# rag's SQL files run with search_path pinned to pg_catalog, rag, pg_temp (sql/schema.sql says why); an upgrade
# script pins it once at its top, so the files' own switches are left out. A statement naming pgvector's type sits
# between two named set_config calls (`AS path_for_X`, `AS path_after_X`) that put pgvector's schema in the path
# for it alone: they are kept with it, and left out with it when it is a table (a data migration's).
PINNING = r"SET\s+LOCAL\s+search_path"
PATH_SWITCH = r"SELECT\s+pg_catalog\.set_config\('search_path'"
# A function of the extension's schema (pgrx names it without one, rag's SQL with @extschema@): the upgrade
# script's search_path does not lead there, so it is named.
UNQUALIFIED_FUNCTION = r"^(CREATE OR REPLACE (?:FUNCTION|PROCEDURE) )(\"?[A-Za-z_][A-Za-z0-9_]*\"?\()"


def generate(sql, new_policies):
    out = []
    print = out.append  # noqa: A001 (the rules below read as printing the script)
    codes = [code for code in (code_of(s) for s in statements(sql)) if code]
    skip_switch = False
    for index, code in enumerate(codes):
        if re.match(PINNING, code, re.I):
            continue
        if re.match(PATH_SWITCH, code, re.I):
            if " AS path_for_" in code:
                following = codes[index + 1] if index + 1 < len(codes) else ""
                skip_switch = any(re.match(p, following, re.I) for p in SKIP)
            if not skip_switch:
                print(code + "\n")
            if " AS path_after_" in code:
                skip_switch = False
            continue
        if any(re.match(p, code, re.I) for p in POLICY):
            if new_policies:
                print(code + "\n")
            continue
        # The DO block of schema.sql that creates the row-level security policies is a policy statement too.
        if re.match(r"DO\b", code) and "CREATE POLICY" in code:
            if new_policies:
                print(code + "\n")
            continue
        if any(re.match(p, code, re.I) for p in KEEP):
            code = re.sub(r"^CREATE\s+FUNCTION", "CREATE OR REPLACE FUNCTION", code, flags=re.I)
            code = re.sub(r"^CREATE\s+PROCEDURE", "CREATE OR REPLACE PROCEDURE", code, flags=re.I)
            code = re.sub(r"^CREATE\s+VIEW", "CREATE OR REPLACE VIEW", code, flags=re.I)
            code = re.sub(UNQUALIFIED_FUNCTION, r"\1@extschema@.\2", code)
            print(code + "\n")
        elif any(re.match(p, code, re.I) for p in SKIP):
            continue
        else:
            sys.exit(f"upgrade_functions.py: no rule for this statement; add one:\n{code[:300]}")
    return "\n".join(part.rstrip("\n") + "\n" for part in out)


def main():
    args = sys.argv[1:]
    with open(args[0]) as f:
        generated = generate(f.read(), "--new-policies" in args)
    if "--update" not in args:
        sys.stdout.write(generated)
        return
    target = args[args.index("--update") + 1]
    with open(target) as f:
        script = f.read()
    begin = script.index("-- BEGIN GENERATED")
    begin = script.index("\n", begin) + 1
    end = script.index("-- END GENERATED")
    merged = in_existing_order(script[begin:end], generated)
    with open(target, "w") as f:
        f.write(script[:begin] + merged.rstrip("\n") + "\n" + script[end:])


def identity(code):
    """What a generated statement defines, so that a new version of it replaces the old one in place."""
    flat = " ".join(code.split())
    for pattern in (r"CREATE OR REPLACE FUNCTION (.*?\))\s*RETURNS",
                    r"CREATE OR REPLACE PROCEDURE (.*?\))\s*(?:LANGUAGE|AS|SECURITY|SET)\b",
                    r"CREATE OR REPLACE VIEW (\S+)",
                    r"(COMMENT ON .*?) IS "):
        found = re.match(pattern, flat, re.I)
        if found:
            return found.group(1)
    return flat


def in_existing_order(existing, generated):
    """The generated statements, in the order of those already in the script; new ones after their
    predecessor in the generated order; those no longer generated left out."""
    new = [code_of(s) for s in statements(generated) if code_of(s)]
    by_identity = {identity(code): code for code in new}
    merged = [identity(code_of(s)) for s in statements(existing) if code_of(s)]
    merged = [key for key in dict.fromkeys(merged) if key in by_identity]
    placed = set(merged)
    previous = None
    for code in new:
        key = identity(code)
        if key not in placed:
            merged.insert(merged.index(previous) + 1 if previous is not None else 0, key)
            placed.add(key)
        previous = key
    return "\n".join(by_identity[key] + "\n" for key in merged)


if __name__ == "__main__":
    main()
