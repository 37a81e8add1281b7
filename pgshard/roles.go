package pgshard

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"sync"

	"github.com/jackc/pgpassfile"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/sqlstate"
)

// Tenants share the nodes, so each reaches them as a role of its own: not
// a superuser, without CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS,
// granted only its own database's objects. The node DSN's user is the
// control role: it makes the tenant roles and databases, and runs the
// migrator, the recoverer and presence. Client sessions never run as it.

// TenantRole is the PostgreSQL role of tenant on every node: "lattice_"
// and the tenant's name, or, for a name that would pass PostgreSQL's 63
// bytes, a prefix of it and a hash of the whole.
func TenantRole(tenant string) string {
	const prefix, maxName = "lattice_", 63
	if len(prefix)+len(tenant) <= maxName {
		return prefix + tenant
	}
	sum := sha256.Sum256([]byte(tenant))
	h := hex.EncodeToString(sum[:4])
	cut := tenant[:maxName-len(prefix)-1-len(h)]
	for len(cut) > 0 && cut[len(cut)-1]&0xC0 == 0x80 { // not inside a UTF-8 sequence
		cut = cut[:len(cut)-1]
	}
	return prefix + cut + "_" + h
}

// ClientDSN is the DSN client sessions of tenant use on node: the node's
// DSN with the tenant's role as user and the tenant's database, without
// the control role's password. The role's password, if the nodes ask for
// one, is looked up in the --pgpass file (host:port:tenant:role:password).
func (c *Cluster) ClientDSN(node, tenant string) (string, error) {
	n, ok := c.Node(node)
	if !ok {
		return "", fmt.Errorf("pgshard: unknown node %q", node)
	}
	if tenant == "" {
		return "", fmt.Errorf("pgshard: empty tenant")
	}
	clean, _, _, err := SplitPassword(n.DSN)
	if err != nil {
		return "", err
	}
	dsn, err := withDatabase(clean, tenant)
	if err != nil {
		return "", err
	}
	role := TenantRole(tenant)
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("pgshard: parse DSN: %w", err)
		}
		u.User = url.User(role)
		dsn = u.String()
	} else if dsn, err = withParam(dsn, "user", role); err != nil {
		return "", err
	}
	if c.passfile != "" {
		return withParam(dsn, "passfile", c.passfile)
	}
	return dsn, nil
}

// SetVerifier gives the function that turns a tenant role's password (from
// the --pgpass file) into the SCRAM verifier its CREATE ROLE stores, so
// that the password itself never travels in a statement the node may log.
func (c *Cluster) SetVerifier(v func(password string) (string, error)) { c.verifier = v }

// roleKey is one tenant role on one server.
type roleKey struct{ node, dsn, tenant string }

// EnsureRole makes tenant's role on node, or checks the one an operator
// made, once per node and tenant: it must not be a superuser, nor have
// CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS. The control role becomes
// a member of it, so that it may act on the tenant's objects (tree DDL on a
// template the tenant created) without being a superuser. On the catalog
// node, which holds the tenant's ordinary tables, the role may create
// schemas in the tenant's database and tables in its public schema.
func (c *Cluster) EnsureRole(ctx context.Context, node, tenant string) error {
	n, ok := c.Node(node)
	if !ok {
		return fmt.Errorf("pgshard: unknown node %q", node)
	}
	k := roleKey{node, n.DSN, tenant}
	if _, ok := c.roles.Load(k); ok {
		return nil
	}
	mu, _ := c.roleLocks.LoadOrStore(k, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	// The lock serves only while this runs: kept, one per name a client
	// tried, the map would grow with every database name guessed.
	defer c.roleLocks.CompareAndDelete(k, mu)
	if _, ok := c.roles.Load(k); ok {
		return nil
	}
	if err := c.ensureRole(ctx, n, tenant); err != nil {
		return fmt.Errorf("pgshard: node %s: role of tenant %q: %w", node, tenant, err)
	}
	c.roles.Store(k, struct{}{})
	return nil
}

func (c *Cluster) ensureRole(ctx context.Context, n Node, tenant string) error {
	role := TenantRole(tenant)
	own, err := c.Admin(ctx, n.Name, c.ownDatabase(n.Name))
	if err != nil {
		return err
	}
	// No role, and so no pool, for a database that is not there: a client
	// naming databases at random must leave nothing behind on the node.
	var connectable bool
	err = own.QueryRow(ctx, `SELECT datallowconn AND NOT datistemplate FROM pg_catalog.pg_database WHERE datname = $1`, tenant).Scan(&connectable)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && !connectable {
		return sqlstate.Fatal(sqlstate.InvalidCatalogName, "database %q does not exist", tenant).
			WithHint("Connect with your tenant's database name; an operator creates a new tenant's database on the catalog node.")
	}
	if err != nil {
		return err
	}
	var super, createdb, createrole, repl, bypass, found bool
	check := func() error {
		err := own.QueryRow(ctx, `SELECT rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls
			FROM pg_catalog.pg_roles WHERE rolname = $1`, role).Scan(&super, &createdb, &createrole, &repl, &bypass)
		found = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	}
	if err := check(); err != nil {
		return err
	}
	if !found {
		stmt := "CREATE ROLE " + quoteIdent(role) + " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
		pw, err := c.rolePassword(n, tenant, role)
		if err != nil {
			return err
		}
		if pw != "" {
			if c.verifier == nil {
				return fmt.Errorf("no SCRAM verifier function to store the password of role %q", role)
			}
			v, err := c.verifier(pw)
			if err != nil {
				return err
			}
			stmt += " PASSWORD " + quoteLiteral(v)
		}
		if _, err := own.Exec(ctx, stmt); err != nil && !sqlstate.Is(err, sqlstate.DuplicateObject) && !sqlstate.Is(err, sqlstate.UniqueViolation) {
			return sqlstate.New(sqlstate.InsufficientPrivilege, "the node's control role could not create role %q: %v", role, err).
				WithHint("Give the control role CREATEROLE, or create the role yourself (README, \"Security\").")
		}
		c.log.Info("created tenant role", "node", n.Name, "tenant", tenant, "role", role)
		if err := check(); err != nil {
			return err
		}
	}
	if super || createdb || createrole || repl || bypass {
		return sqlstate.New(sqlstate.InsufficientPrivilege, "role %q may do more than a tenant may (superuser, CREATEDB, CREATEROLE, REPLICATION or BYPASSRLS)", role).
			WithHint("Run ALTER ROLE %s NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS on the node.", quoteIdent(role))
	}
	if _, err := own.Exec(ctx, `DO $grant$ BEGIN
		IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user)
			AND NOT pg_catalog.pg_has_role(current_user, `+quoteLiteral(role)+`, 'MEMBER') THEN
			EXECUTE 'GRANT ' || quote_ident(`+quoteLiteral(role)+`) || ' TO ' || quote_ident(current_user);
		END IF;
	END $grant$`); err != nil {
		return fmt.Errorf("grant role %q to the control role: %w", role, err)
	}
	if n.Name != c.Catalog().Name {
		// Other nodes hold shard schemas only; CreateShard grants those.
		return nil
	}
	db, err := c.Admin(ctx, n.Name, tenant)
	if err != nil {
		return err
	}
	for _, g := range []string{
		"GRANT CREATE, TEMPORARY ON DATABASE " + quoteIdent(tenant) + " TO " + quoteIdent(role),
		"GRANT USAGE, CREATE ON SCHEMA public TO " + quoteIdent(role),
	} {
		if _, err := db.Exec(ctx, g); err != nil && !sqlstate.Is(err, sqlstate.InvalidSchemaName) {
			return fmt.Errorf("%s: %w", g, err)
		}
	}
	return nil
}

// ownDatabase is node's own database.
func (c *Cluster) ownDatabase(node string) string {
	s := c.set()
	return s.ownDB[s.byName[node]]
}

// rolePassword is the role's password in the --pgpass file, "" without one.
func (c *Cluster) rolePassword(n Node, tenant, role string) (string, error) {
	if c.passfile == "" {
		return "", nil
	}
	cfg, err := pgconn.ParseConfig(n.DSN)
	if err != nil {
		return "", err
	}
	pf, err := pgpassfile.ReadPassfile(c.passfile)
	if err != nil {
		return "", fmt.Errorf("read the pgpass file: %w", err)
	}
	return pf.FindPassword(cfg.Host, strconv.Itoa(int(cfg.Port)), tenant, role), nil
}

// grantShard lets tenant's role read and write shard table table in schema,
// and nothing else there: the ownership and fence records of the schema
// stay the control role's.
func grantShard(ctx context.Context, q interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, tenant, schema, table string) error {
	role := quoteIdent(TenantRole(tenant))
	for _, g := range []string{
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON " + table + " TO " + role,
	} {
		if _, err := q.Exec(ctx, g); err != nil {
			return fmt.Errorf("%s: %w", g, err)
		}
	}
	return nil
}
