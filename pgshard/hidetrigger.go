package pgshard

// hideTriggerSQL marks a fence trigger internal (pg_trigger.tgisinternal),
// as PostgreSQL marks the triggers of its own foreign keys. psql's \d,
// pg_dump, pgAdmin and DBeaver list only triggers that are not internal, so
// a template or reference copy shows as the table its tenant made. The
// trigger still fires for every write; ALTER TABLE ... DISABLE TRIGGER USER
// passes over it, and DISABLE TRIGGER ALL or by name is refused to every
// role but a superuser. DROP TRIGGER and DROP TABLE, and Lattice's lookups
// by name, see it as before.
//
// Only a superuser may update pg_trigger: a control role that is not one
// leaves the trigger visible, which changes nothing else.
func hideTriggerSQL(table, trigger string) string {
	return `DO $hide$
BEGIN
    IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        UPDATE pg_catalog.pg_trigger SET tgisinternal = true
        WHERE tgrelid = ` + quoteLiteral(table) + `::regclass AND tgname = ` + quoteLiteral(trigger) + `;
    END IF;
END
$hide$`
}
