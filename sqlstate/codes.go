// Package sqlstate is Lattice's one error catalogue: the SQLSTATE codes it
// sends or looks for, named after PostgreSQL's condition names (Appendix A of
// the PostgreSQL manual), and the one error type that carries a code to a
// client. It imports nothing of Lattice's, so that every package can use it.
//
// A literal five-character SQLSTATE anywhere else in the repository's
// non-test code fails TestNoLiteralCodes: add the code here instead.
package sqlstate

// Class 01, warning.
const (
	// WarningCode: a warning of no narrower class (a maintenance
	// statement's notices that were not all kept).
	WarningCode = "01000"
)

// Class 08, connection exception.
const (
	// SQLClientUnableToEstablishSQLConnection: lattice_add_node could not
	// connect to the node it was given.
	SQLClientUnableToEstablishSQLConnection = "08001"
	// ConnectionFailure: a node's connection could not be made or was lost
	// mid-statement.
	ConnectionFailure = "08006"
	// TransactionResolutionUnknown: recording a cross-node commit decision
	// failed, so the transaction may or may not have committed.
	TransactionResolutionUnknown = "08007"
	// ProtocolViolation: a malformed or unexpected frontend message, or a Bind
	// that does not match its statement.
	ProtocolViolation = "08P01"
)

// Class 0A, feature not supported.
const (
	// FeatureNotSupported: a statement the proxy cannot route or run
	// correctly (joins across shards, key updates, ...); the hint says what
	// to do instead.
	FeatureNotSupported = "0A000"
)

// Class 21, cardinality violation.
const (
	// CardinalityViolation: a lattice_* function used as a value in a
	// composed statement returned other than one row.
	CardinalityViolation = "21000"
)

// Class 22, data exception.
const (
	// NumericValueOutOfRange: a COPY row's integer shard key overflows its
	// type.
	NumericValueOutOfRange = "22003"
	// NullValueNotAllowed: a lattice_* function argument that must be given
	// is null or empty.
	NullValueNotAllowed = "22004"
	// InvalidRowCountInLimitClause: a fan-out's LIMIT is negative.
	InvalidRowCountInLimitClause = "2201W"
	// InvalidRowCountInResultOffsetClause: a fan-out's OFFSET is negative.
	InvalidRowCountInResultOffsetClause = "2201X"
	// InvalidParameterValue: an argument out of range (a shard count, a
	// table name, a startup option, a COPY option, an admin API request).
	InvalidParameterValue = "22023"
	// InvalidTextRepresentation: a shard key, LIMIT or OFFSET value that does
	// not parse as its type.
	InvalidTextRepresentation = "22P02"
	// InvalidBinaryRepresentation: a binary Bind parameter of the wrong size
	// or type for a lattice_* function.
	InvalidBinaryRepresentation = "22P03"
	// BadCopyFileFormat: COPY FROM STDIN data the proxy cannot split by shard
	// key.
	BadCopyFileFormat = "22P04"
)

// Class 23, integrity constraint violation.
const (
	// NotNullViolation: a COPY row whose shard key is null.
	NotNullViolation = "23502"
	// UniqueViolation: another coordinator claimed a commit decision's gid
	// first, or two CREATE DATABASE of one tenant's database raced on a node
	// (looked for in the nodes' errors, never sent).
	UniqueViolation = "23505"
)

// Classes 25, 26 and 3B: invalid transaction state, statement name and
// savepoint.
const (
	// ActiveSQLTransaction: a statement that cannot run inside a transaction
	// block (tree DDL, DISCARD ALL), or a BEGIN inside one (a warning).
	ActiveSQLTransaction = "25001"
	// NoActiveSQLTransaction: a transaction-block statement outside one.
	NoActiveSQLTransaction = "25P01"
	// InFailedSQLTransaction: a statement in a transaction already aborted.
	InFailedSQLTransaction = "25P02"
	// InvalidSavepointSpecification: RELEASE or ROLLBACK TO a savepoint
	// the transaction does not hold.
	InvalidSavepointSpecification = "3B001"
	// IdleInTransactionTimeout: a session idle in a transaction past the
	// proxy's --idle-in-transaction-timeout.
	IdleInTransactionTimeout = "25P03"
	// InvalidSQLStatementName: a Bind, Describe or DEALLOCATE of a prepared
	// statement the session does not have.
	InvalidSQLStatementName = "26000"
)

// Class 28, invalid authorization specification.
const (
	// InvalidAuthorizationSpecification: no user name, a tenant the user may
	// not use, or TLS required and not offered.
	InvalidAuthorizationSpecification = "28000"
	// InvalidPassword: SCRAM authentication failed.
	InvalidPassword = "28P01"
)

// Classes 34 and 3D, invalid cursor and catalog name.
const (
	// InvalidCursorName: an Execute or Describe of a portal the session does
	// not have.
	InvalidCursorName = "34000"
	// InvalidCatalogName: a node has no database of a tenant's name yet
	// (looked for in the node's errors, never sent).
	InvalidCatalogName = "3D000"
)

// Class 3F, invalid schema name.
const (
	// InvalidSchemaName: no lattice_meta schema yet, so no commit decisions
	// to recover (looked for in the catalog node's errors, never sent).
	InvalidSchemaName = "3F000"
)

// Class 40, transaction rollback.
const (
	// TransactionRollback: a cross-node transaction rolled back because its
	// prepare phase outlasted the recovery bound.
	TransactionRollback = "40000"
	// SerializationFailure: a tree changed under a DDL statement; the client
	// may retry.
	SerializationFailure = "40001"
	// DeadlockDetected: a node broke a deadlock (looked for in its errors:
	// a merge sends the batch round again).
	DeadlockDetected = "40P01"
)

// Class 42, syntax error or access rule violation.
const (
	// InsufficientPrivilege: an admin API reshard asked from another site
	// (HTTP 403).
	InsufficientPrivilege = "42501"
	// SyntaxError: a statement pg_query cannot parse, or several commands in
	// one prepared statement.
	SyntaxError = "42601"
	// DuplicateColumn: a column named twice in a COPY column list.
	DuplicateColumn = "42701"
	// DuplicateObject: lattice_add_node of a name, or a server, the node
	// registry already has.
	DuplicateObject = "42710"
	// UndefinedColumn: a shard key or COPY column the table does not have.
	UndefinedColumn = "42703"
	// UndefinedObject: lattice_remove_node of a node the registry does not
	// have; also a prepared transaction that no longer exists (looked for
	// in a node's errors during two-phase commit recovery).
	UndefinedObject = "42704"
	// DatatypeMismatch: lattice_create_tree with colocate_with of a tree
	// whose shard key does not hash like the new one's, or whose slot count
	// differs.
	DatatypeMismatch = "42804"
	// WrongObjectType: lattice_create_tree of something that is not a table.
	WrongObjectType = "42809"
	// UndefinedFunction: a lattice_* function that does not exist, or called
	// with arguments it does not take.
	UndefinedFunction = "42883"
	// ReservedName: a table name in Lattice's own lattice_ namespace.
	ReservedName = "42939"
	// UndefinedTable: a tree or table that does not exist.
	UndefinedTable = "42P01"
	// DependentObjectsStillExist: a table a foreign key references, dropped
	// before the table that references it (looked for in the nodes' errors).
	DependentObjectsStillExist = "2BP01"
	// DuplicateDatabase: a tenant's database already exists on a node
	// (looked for in the node's errors, never sent).
	DuplicateDatabase = "42P04"
	// DuplicateCursor: a Bind to a named portal that exists.
	DuplicateCursor = "42P03"
	// DuplicatePreparedStatement: a Parse or SQL PREPARE of a named
	// statement that exists.
	DuplicatePreparedStatement = "42P05"
	// DuplicateTable: lattice_create_tree of a table that already is a tree.
	DuplicateTable = "42P07"
	// InvalidColumnReference: an ORDER BY position or a COPY FORCE column
	// that the statement does not have.
	InvalidColumnReference = "42P10"
	// InvalidFunctionDefinition: a lattice_* function argument given twice.
	InvalidFunctionDefinition = "42P13"
	// InvalidTableDefinition: a table that breaks a tree rule (key not in the
	// primary key or a unique index, a sequence key, a foreign key).
	InvalidTableDefinition = "42P16"
)

// Classes 53 and 54, insufficient resources and program limit exceeded.
const (
	// OutOfMemory: a fan-out merge that would buffer more than its limit.
	OutOfMemory = "53200"
	// TooManyConnections: past --max-clients, --max-listeners or --max-pinned, or a node
	// pool that cannot hand out a backend.
	TooManyConnections = "53300"
	// ProgramLimitExceeded: a COPY row longer than the proxy accepts.
	ProgramLimitExceeded = "54000"
)

// Class 55, object not in prerequisite state.
const (
	// ObjectNotInPrerequisiteState: a reshard already running to another
	// count, slots that stayed frozen past the hold timeout, a node without
	// prepared transactions.
	ObjectNotInPrerequisiteState = "55000"
	// ObjectInUse: a replication slot still active (looked for in a node's
	// errors, never sent).
	ObjectInUse = "55006"
	// LockNotAvailable: a lock_timeout while installing a fence (looked for
	// in a node's errors, never sent).
	LockNotAvailable = "55P03"
	// CantChangeRuntimeParam: a set_config the proxy cannot check (its
	// setting name or value is not a constant).
	CantChangeRuntimeParam = "55P02"
)

// Classes 57 and 58, operator intervention and system error.
const (
	// QueryCanceled: a statement or COPY canceled by the client, or a
	// statement_timeout.
	QueryCanceled = "57014"
	// AdminShutdown: never sent; read from a node that ended the session
	// as it shut down.
	AdminShutdown = "57P01"
	// CrashShutdown: never sent; read from a node that ended the session
	// after another of its backends crashed.
	CrashShutdown = "57P02"
	// CannotConnectNow: the proxy cannot reach Redis and cannot vouch for
	// its cached shard map; a node still starting up.
	CannotConnectNow = "57P03"
	// SystemError: the shard map store is out of reach, or a tree has no map.
	SystemError = "58000"
)

// Class XX, internal error.
const (
	// InternalError: an error with no code of its own, and states the proxy
	// should never reach.
	InternalError = "XX000"
	// DataCorrupted: a move's verification found the target's rows differ
	// from the source's (lattice_repair_migration could not make them agree).
	DataCorrupted = "XX001"
)

// Class LT, Lattice's own.
const (
	// SlotMoved: a fence trigger rejected a write whose slot moved to another
	// shard (DETAIL names the new owner and epoch); the proxy refreshes its
	// map and retries, so clients do not see it.
	SlotMoved = "LT001"
	// MapsMissing: the nodes hold trees of the client's database whose
	// shard maps Redis has lost; the proxy refuses the database until
	// `lattice recover-map` rebuilds them.
	MapsMissing = "LT002"
)
