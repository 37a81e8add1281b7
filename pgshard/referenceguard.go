package pgshard

import "github.com/lattice-db/lattice/sqlstate"

// The DDL guard of reference tables (docs/DESIGN.md, "Reference tables").
//
// The fence trigger sees writes and TRUNCATE but no DDL, so a proxy that
// does not know yet that a table is a reference table would run ALTER
// TABLE, CREATE INDEX, DROP INDEX ... on the catalog copy alone. Event
// triggers on ddl_command_end and sql_drop in the tenant's database refuse
// DDL on a fenced copy unless the transaction names the copies, as the
// fence does for writes (referencePass). They run after the command took
// its lock on the table: a lattice_create_reference_table that committed
// before it is seen (its fence and meta row), and one that had not locked
// the table yet waits for this transaction and copies what it left.
// The control role's own sessions (making, copying and dropping copies)
// pass, by session_user, which no tenant role can take.

const (
	referencePass  = "lattice_meta.reference_pass"
	referenceGuard = "lattice_meta.reference_ddl_guard()"
)

// referencePassDDL raises LT001 unless the transaction named the copies of
// tbl: lattice.reference_nodes set and, on the catalog node, equal to the
// list lattice_meta.reference_tables holds, read FOR SHARE so that a copy
// being added or released waits for it.
const referencePassDDL = `CREATE OR REPLACE FUNCTION ` + referencePass + `(tbl text) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pass$
DECLARE
    want text := coalesce(current_setting('` + ReferenceSetting + `', true), '');
    have text[];
BEGIN
    IF want = '' THEN
        RAISE EXCEPTION USING ERRCODE = '` + sqlstate.SlotMoved + `',
            MESSAGE = format('lattice: relation "%s" is a reference table: its writes and DDL go to every node', tbl),
            HINT = 'Write through the Lattice proxy, and retry: it reads the reference tables again.';
    END IF;
    SELECT nodes INTO have FROM ` + referenceMeta + ` WHERE name = tbl FOR SHARE;
    IF FOUND AND array_to_string(have, ',') IS DISTINCT FROM want THEN
        RAISE EXCEPTION USING ERRCODE = '` + sqlstate.SlotMoved + `',
            MESSAGE = format('lattice: the copies of reference table "%s" are on nodes %s now', tbl, array_to_string(have, ', ')),
            HINT = 'Retry the statement: the proxy reads the reference tables again.';
    END IF;
END
$pass$`

// referenceGuardDDL makes the guard function, owned by control, and its two
// event triggers (superuser only; there is no CREATE EVENT TRIGGER IF NOT
// EXISTS).
//
// A command's objects lead to their table: an index by pg_index, a
// trigger, rule, policy or constraint by its own catalog. A dropped object
// is gone from those catalogs, so a DROP TABLE is known by its fence
// trigger among the dropped objects, a dropped trigger, rule or policy by
// the table its address names, and a dropped index by the lock the drop
// holds on its table (SHARE UPDATE EXCLUSIVE when CONCURRENTLY). Only the
// objects the command names count there: dropping a table whose foreign
// key references a reference table drops triggers on the latter. The lock
// stands for the index's table, so a transaction that locked a reference
// table (LOCK TABLE, which a proxy sends to the catalog copy) and then
// drops another table's index is refused too. Comments and statistics
// objects, which change no row, column or constraint, pass: the proxy
// sends COMMENT and DROP STATISTICS to the catalog copy alone, as it does
// for a tree's template.
func referenceGuardDDL(control string) []string {
	fenced := `JOIN pg_trigger f ON f.tgrelid = c.oid AND f.tgname = '` + referenceTrigger + `'`
	return []string{
		`CREATE OR REPLACE FUNCTION ` + referenceGuard + ` RETURNS event_trigger
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $guard$
DECLARE
    tbl text;
BEGIN
    IF session_user = ` + quoteLiteral(control) + ` OR TG_TAG = 'COMMENT' THEN
        RETURN;
    END IF;
    IF TG_EVENT = 'ddl_command_end' THEN
        FOR tbl IN
            SELECT DISTINCT c.relname FROM pg_event_trigger_ddl_commands() d
            CROSS JOIN LATERAL (SELECT CASE d.classid
                WHEN 'pg_class'::regclass THEN coalesce((SELECT i.indrelid FROM pg_index i WHERE i.indexrelid = d.objid), d.objid)
                WHEN 'pg_trigger'::regclass THEN (SELECT t.tgrelid FROM pg_trigger t WHERE t.oid = d.objid)
                WHEN 'pg_rewrite'::regclass THEN (SELECT r.ev_class FROM pg_rewrite r WHERE r.oid = d.objid)
                WHEN 'pg_policy'::regclass THEN (SELECT p.polrelid FROM pg_policy p WHERE p.oid = d.objid)
                WHEN 'pg_constraint'::regclass THEN (SELECT k.conrelid FROM pg_constraint k WHERE k.oid = d.objid)
                END AS rel) o
            JOIN pg_class c ON c.oid = o.rel
            ` + fenced + `
        LOOP
            PERFORM ` + referencePass + `(tbl);
        END LOOP;
        RETURN;
    END IF;
    FOR tbl IN
        SELECT d.address_names[2] FROM pg_event_trigger_dropped_objects() d
        WHERE d.object_type = 'trigger' AND d.address_names[3] = '` + referenceTrigger + `'
        UNION
        SELECT c.relname FROM pg_event_trigger_dropped_objects() d
        JOIN pg_class c ON d.original AND d.object_type IN ('trigger', 'rule', 'policy')
            AND c.oid = to_regclass(format('%I.%I', d.address_names[1], d.address_names[2]))
        ` + fenced + `
        UNION
        SELECT c.relname FROM pg_locks l
        JOIN pg_class c ON l.locktype = 'relation' AND l.pid = pg_backend_pid() AND l.granted AND c.oid = l.relation
            AND l.mode IN ('ShareUpdateExclusiveLock', 'AccessExclusiveLock')
        ` + fenced + `
        WHERE EXISTS (SELECT 1 FROM pg_event_trigger_dropped_objects() d WHERE d.original AND d.object_type = 'index')
    LOOP
        PERFORM ` + referencePass + `(tbl);
    END LOOP;
END
$guard$`,
		`DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'lattice_reference_ddl') THEN
        CREATE EVENT TRIGGER lattice_reference_ddl ON ddl_command_end EXECUTE FUNCTION ` + referenceGuard + `;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'lattice_reference_drop') THEN
        CREATE EVENT TRIGGER lattice_reference_drop ON sql_drop EXECUTE FUNCTION ` + referenceGuard + `;
    END IF;
END
$$`,
	}
}
