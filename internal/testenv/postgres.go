package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	neturl "net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/schema"
)

// DefaultDatabaseURL is the PostgreSQL the tests use unless NUDGE_TEST_DATABASE_URL says otherwise.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DB is a migrated schema of its own for one test.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
	// URL connects to the same schema (search_path is set), for subprocesses.
	URL string
}

// Postgres creates a fresh schema, migrates it as it is once every
// component runs this release (schema.MigrateAfterRollout: the
// after-rollout migrations applied, no state mirror, no state columns on
// reminders), and returns a pool whose connections use it. The schema is
// dropped when the test ends.
func Postgres(tb testing.TB) *DB {
	tb.Helper()
	return migrated(tb, schema.MigrateAfterRollout)
}

// PostgresBeforeRollout is Postgres migrated by schema.Migrate alone: it
// stops before the first after-rollout migration, as the schema is while the
// previous release's binaries still run (the state mirror in place). For the
// tests of the mirror, the backfill and the after-rollout step; every other
// test uses Postgres.
//
// Schema 38 is applied too, out of order: this tree's intake (pkg/intake
// ScheduleMany, which these tests schedule with) writes reminders.lazy and
// reads the lazy-intake setting that 38 creates, and 38 needs nothing of
// 35-37. It is not recorded: Migrate still lists it as waiting, and
// applies it again after 37 (every statement of 38 is idempotent).
func PostgresBeforeRollout(tb testing.TB) *DB {
	tb.Helper()
	db := migrated(tb, schema.Migrate)
	migs, err := schema.Migrations()
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range migs {
		if m.Version != 38 {
			continue
		}
		if _, err := db.Pool.Exec(context.Background(), m.SQL); err != nil {
			tb.Fatalf("applying migration 38 to test schema %s: %v", db.Schema, err)
		}
	}
	return db
}

func migrated(tb testing.TB, migrate func(context.Context, pg.Beginner) ([]int, error)) *DB {
	tb.Helper()
	return migrateSchema(tb, EmptyPostgres(tb), migrate)
}

func migrateSchema(tb testing.TB, db *DB, migrate func(context.Context, pg.Beginner) ([]int, error)) *DB {
	tb.Helper()
	// Migrate serialises on one advisory lock per database: every test
	// schema being migrated on the machine (other packages, other
	// checkouts) queues on it, so the wait is the machine's, not this one's.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := migrate(ctx, db.Pool); err != nil {
		tb.Fatalf("migrating test schema %s: %v", db.Schema, err)
	}
	return db
}

// EmptyPostgres is Postgres without the migrations: the schema is empty, for
// a test that migrates it itself (with an earlier release's nudgectl, say).
func EmptyPostgres(tb testing.TB) *DB {
	tb.Helper()
	return emptyPostgresAt(tb, baseURL(tb))
}

// PostgresOwnDatabase is Postgres in a database of its own, created for the
// test and dropped when it ends: for a test of what PostgreSQL reports per
// database (pg_stat_activity), which the sessions of every other test on the
// shared test database, in this package or another checkout's, would change
// under it. It costs a CREATE DATABASE and a full migration: use Postgres
// wherever a schema of its own isolates the test.
func PostgresOwnDatabase(tb testing.TB) *DB {
	tb.Helper()
	base := baseURL(tb)
	name := "t_" + RandomID()
	// template0: nobody connects to it, while a session on template1 (the
	// default) would make CREATE DATABASE fail. The drop is registered
	// first, so it runs last: after the pools below are closed (DROP
	// DATABASE waits up to 5 s for their backends to exit).
	createDropped(tb, base, "test database "+name, `CREATE DATABASE `+name+` TEMPLATE template0`, `DROP DATABASE `+name)
	u, err := neturl.Parse(base)
	if err != nil {
		tb.Fatalf("parsing %s: %v", base, err)
	}
	u.Path = "/" + name
	return migrateSchema(tb, emptyPostgresAt(tb, u.String()), schema.MigrateAfterRollout)
}

// baseURL is the test database's URL (NUDGE_TEST_DATABASE_URL or the
// default).
func baseURL(tb testing.TB) string {
	tb.Helper()
	needs(tb, "PostgreSQL")
	if base := os.Getenv("NUDGE_TEST_DATABASE_URL"); base != "" {
		return base
	}
	return DefaultDatabaseURL
}

func emptyPostgresAt(tb testing.TB, base string) *DB {
	tb.Helper()
	name := "t_" + RandomID()
	createDropped(tb, base, "test schema "+name, `CREATE SCHEMA `+name, `DROP SCHEMA `+name+` CASCADE`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	u, err := neturl.Parse(base)
	if err != nil {
		tb.Fatalf("parsing %s: %v", base, err)
	}
	q := u.Query()
	q.Set("search_path", name)
	q.Set("jit", "off") // as the binaries' pools (config.Common.Pool)
	u.RawQuery = q.Encode()

	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		tb.Fatalf("connecting to test schema: %v", err)
	}
	tb.Cleanup(pool.Close)
	return &DB{Pool: pool, Schema: name, URL: u.String()}
}

// RandomID returns 12 random hex characters for naming isolated resources.
func RandomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Unpromote deletes the state rows of the reminders ids, leaving their
// wide rows: each is then as a reminder intake left lazy is before the
// promoter inserts its state row (schemas 38 and 39, issue 18's due-ordered
// store), pending with its intent as recorded. It marks them lazy and moves
// the promoter's final watermark back to the earliest of their due times,
// so the schema's invariant holds (below final_until every lazy reminder has
// its state row) and the reads that rely on it see them, and forgets the
// promoter's floors (schema 46), so its next sweep starts at final and
// promotes them again. It fails the test unless every id had a state row.
func (db *DB) Unpromote(tb testing.TB, ids ...int64) {
	tb.Helper()
	ctx := context.Background()
	tag, err := db.Pool.Exec(ctx, `DELETE FROM reminder_state WHERE id = ANY($1)`, ids)
	if err != nil {
		tb.Fatalf("deleting the state rows of %v: %v", ids, err)
	}
	if tag.RowsAffected() != int64(len(ids)) {
		tb.Fatalf("deleting the state rows of %v: %d deleted", ids, tag.RowsAffected())
	}
	if _, err := db.Pool.Exec(ctx, `WITH lazy AS (UPDATE reminders SET lazy = true WHERE id = ANY($1) RETURNING due_at)
		UPDATE nudge_promoter SET final_until = least(final_until, (SELECT min(due_at) FROM lazy)), floor_wait = NULL`, ids); err != nil {
		tb.Fatalf("marking %v lazy: %v", ids, err)
	}
}

// LazyIntakeOnName is the name, without its number, of the after-rollout
// migration that turns lazy intake on and drops reminder_state's foreign key
// (issue 18, the due-ordered store's slice 4). Tests find it by this name
// (LazyIntakeOn), so renumbering the file changes no test.
const LazyIntakeOnName = "lazy_intake_on"

// LazyIntakeOn is the embedded migration named LazyIntakeOnName.
func LazyIntakeOn(tb testing.TB) schema.Migration {
	tb.Helper()
	migs, err := schema.Migrations()
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range migs {
		if m.Name == LazyIntakeOnName {
			return m
		}
	}
	tb.Fatalf("no migration named %s", LazyIntakeOnName)
	return schema.Migration{}
}

// PromoteUntil is, for a test that moves a fake clock ahead of real time,
// what the due-ordered store's promoter would have done had real time
// passed: every lazy reminder due before until gets its state row (as a
// promoter pass inserts it: pending, fence 0, the wide row's intent; one that
// has its row keeps it), and the promoter's watermarks move to until with no
// sweep in progress, so a dispatcher pass at the fake time continues from
// there. A pass cannot do it: it never promotes beyond the database's clock
// plus least(H, horizon), which is what makes its race argument hold. Call it
// with the fake now plus the dispatcher's H (1 h by default) after moving the
// clock, while no transaction writing reminders is open. Test-only: a
// production schema must never have its watermark moved by hand.
func (db *DB) PromoteUntil(tb testing.TB, until time.Time) {
	tb.Helper()
	if _, err := db.Pool.Exec(context.Background(), `
		WITH promoted AS (
		    INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days)
		    SELECT r.id, r.tenant, r.channel, r.due_at, r.deadline, r.tz, r.window_open, r.window_close, r.window_days
		      FROM reminders r
		     WHERE r.lazy AND r.due_at < $1
		     ORDER BY r.due_at, r.id
		        ON CONFLICT (id) DO NOTHING
		)
		UPDATE nudge_promoter
		   SET final_until = greatest(final_until, $1), prov_until = greatest(prov_until, final_until, $1),
		       prov_wait = '{}', sweep_until = NULL, sweep_wait = NULL, sweep_prev_done = NULL,
		       cursor_due = NULL, cursor_id = NULL`, until); err != nil {
		tb.Fatalf("promoting the lazy reminders due before %s: %v", until, err)
	}
}

// createDropped runs create (a CREATE SCHEMA, a CREATE DATABASE) over a
// connection to base, and drop when the test ends. An unreachable base fails
// or skips the test (Unavailable); a failed drop is only logged, as the
// object's name is random and nothing else uses it.
func createDropped(tb testing.TB, base, what, create, drop string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgxpool.New(ctx, base)
	if err == nil {
		err = admin.Ping(ctx)
	}
	if err != nil {
		Unavailable(tb, "PostgreSQL at "+base, "start it, or set NUDGE_TEST_DATABASE_URL", err)
		return
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, create); err != nil {
		tb.Fatalf("creating %s: %v", what, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, err := pgxpool.New(ctx, base)
		if err == nil {
			defer a.Close()
			_, err = a.Exec(ctx, drop)
		}
		if err != nil {
			tb.Logf("dropping %s: %v", what, err)
		}
	})
}

// Login creates a LOGIN role for this test only, a member of group (a
// nudge_* group role; "" for none), and returns a pool connected as it to
// db's schema, its name and its URL. The role is dropped, with whatever it
// owns, when the test ends, after the pool is closed. Roles are the
// cluster's, so the name is random.
func (db *DB) Login(tb testing.TB, group string) (pool *pgxpool.Pool, name, url string) {
	tb.Helper()
	ctx := context.Background()
	name = "nudge_t_" + RandomID()
	ident := pgx.Identifier{name}.Sanitize()
	create := `CREATE ROLE ` + ident + ` LOGIN`
	if group != "" {
		create += ` IN ROLE ` + pgx.Identifier{group}.Sanitize()
	}
	if _, err := db.Pool.Exec(ctx, create); err != nil {
		tb.Fatalf("creating test role %s: %v", name, err)
	}
	// Registered before the pool's Close, so it runs after it.
	tb.Cleanup(func() {
		if _, err := db.Pool.Exec(context.Background(), `DROP OWNED BY `+ident+`; DROP ROLE `+ident); err != nil {
			tb.Errorf("dropping test role %s: %v", name, err)
		}
	})
	u, err := neturl.Parse(db.URL)
	if err != nil {
		tb.Fatalf("parsing %s: %v", db.URL, err)
	}
	u.User = neturl.User(name)
	pool, err = pgxpool.New(ctx, u.String())
	if err != nil {
		tb.Fatalf("connecting as %s: %v", name, err)
	}
	tb.Cleanup(pool.Close)
	return pool, name, u.String()
}
