package pgshard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lattice-db/lattice/sqlstate"
)

// NodeRequirements are what a server must offer before it joins.
type NodeRequirements struct {
	// FreeSlots is how many replication slots and WAL senders must be free:
	// each migration in flight to or from the node takes one of each.
	FreeSlots int
	// PreparedTransactions is the least max_prepared_transactions: a commit
	// across nodes prepares one on each node it wrote.
	PreparedTransactions int
}

// nodeCheckTimeout bounds the connection and the reads of CheckNode.
const nodeCheckTimeout = 10 * time.Second

// minServerVersion is PostgreSQL 15: row filters in publications.
const minServerVersion = 150000

// CheckNode checks that n, which is not in the cluster yet, can join it:
// it answers, runs PostgreSQL 15 or later with wal_level=logical, its user
// may replicate, it has the free replication slots, WAL senders and
// prepared transactions of req, and it holds (or now has, created in its
// own database) the database of every tenant. Each failure is its own
// sqlstate.Error with a hint that names the fix.
func (c *Cluster) CheckNode(ctx context.Context, n Node, tenants []string, req NodeRequirements) error {
	ctx, cancel := context.WithTimeout(ctx, nodeCheckTimeout)
	defer cancel()
	dsn, err := c.connString(n, "")
	if err != nil {
		return sqlstate.New(sqlstate.InvalidParameterValue, "node %s: %v", n.Name, err).
			WithHint("give a DSN as postgres://user@host:port/database or host=... port=... user=... dbname=...")
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return sqlstate.New(sqlstate.InvalidParameterValue, "node %s: %v", n.Name, err).
			WithHint("give a DSN as postgres://user@host:port/database or host=... port=... user=... dbname=...")
	}
	controlSession(cfg)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return connectError(n, cfg, err)
	}
	defer closeConn(conn)

	var (
		version                            int
		walLevel, slots, senders, prepared string
		usedSlots, usedSenders             int
		canReplicate                       bool
	)
	err = conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int, current_setting('wal_level'),
	       current_setting('max_replication_slots'), current_setting('max_wal_senders'),
	       current_setting('max_prepared_transactions'),
	       (SELECT count(*) FROM pg_catalog.pg_replication_slots)::int,
	       (SELECT count(*) FROM pg_catalog.pg_stat_replication)::int,
	       (SELECT rolsuper OR rolreplication FROM pg_catalog.pg_roles WHERE rolname = current_user)`).
		Scan(&version, &walLevel, &slots, &senders, &prepared, &usedSlots, &usedSenders, &canReplicate)
	if err != nil {
		return fmt.Errorf("pgshard: node %s: read its settings: %w", n.Name, err)
	}
	if version < minServerVersion {
		return sqlstate.New(sqlstate.FeatureNotSupported, "node %s runs PostgreSQL %d.%d; Lattice needs 15 or later", n.Name, version/10000, version%10000).
			WithHint("upgrade the server to PostgreSQL 15 or later (publication row filters move slots between nodes)")
	}
	if walLevel != "logical" {
		return sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s has wal_level=%s; Lattice needs wal_level=logical", n.Name, walLevel).
			WithHint("set wal_level = logical in the node's postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart the server")
	}
	if !canReplicate {
		return sqlstate.New(sqlstate.InsufficientPrivilege, "node %s: user %s may not replicate", n.Name, cfg.User).
			WithHint("ALTER ROLE %s REPLICATION on the node: migrations stream from it over logical replication", quoteIdent(cfg.User))
	}
	if free := atoi(slots) - usedSlots; free < req.FreeSlots {
		return sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s has %d free replication slots (max_replication_slots=%s); Lattice needs %d", n.Name, free, slots, req.FreeSlots).
			WithHint("raise max_replication_slots to at least %d and restart the server: each migration in flight takes one", usedSlots+req.FreeSlots)
	}
	if free := atoi(senders) - usedSenders; free < req.FreeSlots {
		return sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s has %d free WAL senders (max_wal_senders=%s); Lattice needs %d", n.Name, free, senders, req.FreeSlots).
			WithHint("raise max_wal_senders to at least %d and restart the server: each migration in flight takes one", usedSenders+req.FreeSlots)
	}
	if atoi(prepared) < req.PreparedTransactions {
		return sqlstate.New(sqlstate.ObjectNotInPrerequisiteState, "node %s has max_prepared_transactions=%s; Lattice needs at least %d", n.Name, prepared, req.PreparedTransactions).
			WithHint("set max_prepared_transactions to at least %d and restart the server: a commit across nodes prepares a transaction on each", req.PreparedTransactions)
	}
	own := cfg.Database
	for _, t := range tenants {
		if t == own {
			continue
		}
		if _, err := createDatabase(ctx, conn, t); err != nil {
			if sqlstate.Is(err, sqlstate.InsufficientPrivilege) {
				return sqlstate.New(sqlstate.InsufficientPrivilege, "node %s: user %s may not create the database of tenant %s", n.Name, cfg.User, t).
					WithHint("create database %s on the node, or ALTER ROLE %s CREATEDB", quoteIdent(t), quoteIdent(cfg.User))
			}
			return fmt.Errorf("pgshard: node %s: database of tenant %s: %w", n.Name, t, err)
		}
	}
	return nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s) // PostgreSQL prints integer settings as integers
	return n
}

// connectError says why n did not answer: the node's own error when it
// refused the session (its code kept), else that it could not be reached.
func connectError(n Node, cfg *pgx.ConnConfig, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		e := sqlstate.New(pgErr.Code, "node %s refused the connection: %s", n.Name, pgErr.Message)
		switch pgErr.Code {
		case sqlstate.InvalidPassword, sqlstate.InvalidAuthorizationSpecification:
			e.Hint = "give the password in the --pgpass file of every proxy (host:port:database:user:password) or in PGPASSWORD, and check the node's pg_hba.conf"
		case sqlstate.InvalidCatalogName:
			e.Hint = "create the DSN's database on the node, or name one that exists"
		default:
			e.Hint = "check the DSN and the node's pg_hba.conf"
		}
		return e
	}
	return sqlstate.New(sqlstate.SQLClientUnableToEstablishSQLConnection, "cannot connect to node %s at %s:%d: %v", n.Name, cfg.Host, cfg.Port, errors.Unwrap(err)).
		WithHint("check that the server runs, that host and port are right, and that every proxy can reach it")
}

// dbCreator is a connection to a node's own database, or a pool of them.
type dbCreator interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// createDatabase creates database db over q unless it exists, with the
// server's defaults, and reports whether it did. A concurrent creation of
// the same name counts as done.
func createDatabase(ctx context.Context, q dbCreator, db string) (bool, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1)`, db).Scan(&exists); err != nil {
		return false, fmt.Errorf("look up database %q: %w", db, err)
	}
	if exists {
		return false, nil
	}
	_, err := q.Exec(ctx, "CREATE DATABASE "+quoteIdent(db))
	if sqlstate.Is(err, sqlstate.DuplicateDatabase) || sqlstate.Is(err, sqlstate.UniqueViolation) {
		// Another proxy created it first: CREATE DATABASE looks for the
		// name before it inserts it, so a concurrent one can also fail on
		// pg_database's unique index.
		return false, nil
	}
	return err == nil, err
}
