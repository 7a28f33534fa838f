package schema_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// scheduleManyRow is one row of nudge_schedule_many's answer.
type scheduleManyRow struct {
	Ord           int
	ID            *int64
	Status        string
	Field, Reason *string
}

// scheduleManyAs calls nudge_schedule_many as a web tier in any language
// would, with one array per column.
func scheduleManyAs(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, tenants, keys, channels, recipients []string, due time.Time) ([]scheduleManyRow, error) {
	n := len(keys)
	templates, data, dues, deadlines := make([]string, n), make([]string, n), make([]time.Time, n), make([]time.Time, n)
	for i := range n {
		templates[i], data[i], dues[i], deadlines[i] = "course-expiry", `{"course": "Go 101"}`, due, due.Add(time.Hour)
	}
	rows, err := q.Query(ctx, `SELECT ord, id, status, field, reason
		  FROM nudge_schedule_many($1, $2, $3, $4, $5, $6::jsonb[], $7, $8) ORDER BY ord`,
		tenants, keys, channels, recipients, templates, data, dues, deadlines)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[scheduleManyRow])
}

// intakeLoginFor is a test schema and a pool of a nudge_intake login granted
// tenant, as a web tier connects.
func intakeLoginFor(t *testing.T, tenant string) (*testenv.DB, *pgxpool.Pool) {
	t.Helper()
	db := testenv.Postgres(t)
	pool, name, _ := db.Login(t, "nudge_intake")
	_, err := db.Pool.Exec(context.Background(), `INSERT INTO nudge_intake_tenants (grantee, tenant) VALUES ($1, $2)`,
		name, tenant)
	require.NoError(t, err)
	return db, pool
}

// A login of nudge_intake schedules many reminders in one call from SQL, each
// answered in order, for the tenants it is granted: the set-based statement
// behind pkg/intake's ScheduleMany, without table privileges.
func TestScheduleManyFromSQLAsIntake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, pool := intakeLoginFor(t, "acme")
	due := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)

	got, err := scheduleManyAs(ctx, pool,
		[]string{"acme", "acme", "acme", "acme", ""},
		[]string{"k1", "k1", "k1", "k2", "k3"},
		[]string{"email", "email", "email", "sms", "email"},
		[]string{"a@example.com", "a@example.com", "b@example.com", "not-a-number", "c@example.com"}, due)
	require.NoError(t, err)
	require.Len(t, got, 5)
	statuses := make([]string, len(got))
	for i, r := range got {
		require.Equal(t, i+1, r.Ord)
		statuses[i] = r.Status
	}
	require.Equal(t, []string{"created", "exists", "conflict", "invalid", "invalid"}, statuses)
	require.Equal(t, *got[0].ID, *got[1].ID, "the repeated key answers the created reminder")
	require.Equal(t, "recipient", *got[3].Field)
	require.Contains(t, *got[3].Reason, "E.164")
	require.Equal(t, "tenant", *got[4].Field)

	var state, actor string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT s.state, e.actor FROM reminder_state s
		JOIN reminder_events e ON e.reminder_id = s.id WHERE s.id = $1`, *got[0].ID).Scan(&state, &actor))
	require.Equal(t, "pending", state)
	require.Equal(t, "intake", actor)

	// Again: the same batch is idempotent.
	again, err := scheduleManyAs(ctx, pool, []string{"acme"}, []string{"k1"}, []string{"email"},
		[]string{"a@example.com"}, due)
	require.NoError(t, err)
	require.Equal(t, "exists", again[0].Status)
	require.Equal(t, *got[0].ID, *again[0].ID)
}

// A batch naming a tenant the login is not granted is refused whole, as
// nudge_schedule refuses one (42501), and writes nothing; arrays of the
// wrong length and too many reminders are refused with 22023, naming the
// parameter.
func TestScheduleManyRefusesWholeCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, pool := intakeLoginFor(t, "acme")
	due := time.Now().Add(time.Hour)
	count := func() (n int) {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminders`).Scan(&n))
		return n
	}

	_, err := scheduleManyAs(ctx, pool, []string{"acme", "globex"}, []string{"k1", "k2"},
		[]string{"email", "email"}, []string{"a@example.com", "b@example.com"}, due)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "42501", pgErr.Code)
	require.Contains(t, pgErr.Message, "globex")
	require.Zero(t, count(), "a refused batch wrote reminders")

	_, err = scheduleManyAs(ctx, pool, []string{"acme"}, []string{"k1", "k2"},
		[]string{"email", "email"}, []string{"a@example.com", "b@example.com"}, due)
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "22023", pgErr.Code)
	require.Equal(t, "p_tenants", pgErr.ColumnName)
	require.Contains(t, pgErr.Message, "p_tenants has 1 elements, p_keys has 2")

	big := make([]string, 10001)
	for i := range big {
		big[i] = fmt.Sprint(i)
	}
	_, err = scheduleManyAs(ctx, pool, big, big, big, big, due)
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "22023", pgErr.Code)
	require.Contains(t, pgErr.Message, "at most 10000 reminders a call")
	require.Zero(t, count())
}

// nudge_schedule_many runs pkg/intake's own bulk statement (schema 50 holds
// a copy until pkg/intake moves onto the function): the two texts, comments
// and layout aside, are the same, the function's with named parameters.
func TestScheduleManyIsPkgIntakesStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	raw, err := os.ReadFile(filepath.Join("..", "pkg", "intake", "queries.sql"))
	require.NoError(t, err)
	_, goStmt, ok := strings.Cut(string(raw), "-- name: ScheduleMany\n")
	require.True(t, ok, "pkg/intake/queries.sql has no ScheduleMany")
	goStmt, _, _ = strings.Cut(goStmt, "-- name: ")
	names := []string{"p_tenants", "p_keys", "p_channels", "p_recipients", "p_templates", "p_data", "p_due_at",
		"p_deadlines", "p_actor", "p_tz", "p_due_local", "p_deadline_local", "p_window_open", "p_window_close",
		"p_window_days"}
	for n := len(names); n >= 1; n-- { // $15 before $1
		goStmt = strings.ReplaceAll(goStmt, fmt.Sprintf("$%d", n), names[n-1])
	}

	var src string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT prosrc FROM pg_proc
		WHERE oid = 'nudge_schedule_many_unchecked'::regproc`).Scan(&src))
	_, fnStmt, ok := strings.Cut(src, "RETURN QUERY")
	require.True(t, ok, "the function's body has no RETURN QUERY")
	end := strings.LastIndex(fnStmt, "END")
	require.Positive(t, end, "the function's body has no END")
	fnStmt = fnStmt[:end]
	require.Equal(t, sqlWords(goStmt), sqlWords(fnStmt),
		"nudge_schedule_many_unchecked and pkg/intake's ScheduleMany differ: change both (a new migration for the function)")
}

// sqlWords is a statement without its comments and layout.
func sqlWords(s string) string {
	var words []string
	for _, line := range strings.Split(s, "\n") {
		line, _, _ = strings.Cut(line, "--")
		words = append(words, strings.Fields(line)...)
	}
	return strings.TrimSuffix(strings.Join(words, " "), ";")
}

// The function's statement keeps the bulk path's plan (pkg/intake's
// TestBulkIntakeInlinesValidation checks the Go copy's under custom and
// generic plans): the validation inlined, not run through the SQL function
// executor per row. And since schema 51 it is the generic plan whatever the
// caller's plan_cache_mode, made once per session: a custom plan, made for
// the call's arrays, was made again at every call of fewer than 10
// reminders. The plan is read as auto_explain logs the nested statement (a
// NOTICE to this session, JSON: its "Plan" without the text).
func TestScheduleManyInlinesValidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	due := time.Now().Add(time.Hour)
	for _, mode := range []string{"auto", "force_custom_plan"} {
		t.Run(mode, func(t *testing.T) {
			cfg, err := pgx.ParseConfig(db.URL)
			require.NoError(t, err)
			var notices []string
			cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; "+
				"SET auto_explain.log_nested_statements = on; SET auto_explain.log_verbose = on; "+
				"SET auto_explain.log_format = json; SET auto_explain.log_level = notice; SET plan_cache_mode = "+mode)
			require.NoError(t, err)
			got, err := scheduleManyAs(ctx, conn, []string{"acme", "acme"}, []string{mode + "1", mode + "2"},
				[]string{"sms", "email"}, []string{"+14155550100", "a@example.com"}, due)
			require.NoError(t, err)
			require.Equal(t, "created", got[0].Status)
			var plan string
			for _, n := range notices {
				_, doc, _ := strings.Cut(n, "\n")
				var logged struct {
					Plan json.RawMessage `json:"Plan"`
				}
				if json.Unmarshal([]byte(doc), &logged) == nil &&
					strings.Contains(string(logged.Plan), `"Relation Name": "reminders"`) &&
					strings.Contains(string(logged.Plan), `"Operation": "Insert"`) {
					plan = string(logged.Plan)
				}
			}
			require.NotEmpty(t, plan, "no plan of the bulk statement among the %d notices", len(notices))
			require.Contains(t, plan, "must be an E.164 phone number", "the check's body is not in the plan")
			require.NotContains(t, plan, "nudge_invalid(", "the plan calls nudge_invalid per row instead of inlining it")
			rows, ok := planRowsOf(t, plan, "CTE raw")
			require.True(t, ok, "no CTE raw in the plan")
			require.NotEqual(t, 2.0, rows, "the rows of the arrays are estimated at the call's 2: a custom plan, made for this call")
		})
	}
}

// planRowsOf is the "Plan Rows" estimate of the node of an EXPLAIN (FORMAT
// JSON) plan whose "Subplan Name" is name.
func planRowsOf(t *testing.T, plan, name string) (float64, bool) {
	t.Helper()
	type node struct {
		Subplan string  `json:"Subplan Name"`
		Rows    float64 `json:"Plan Rows"`
		Plans   []node  `json:"Plans"`
	}
	var root node
	require.NoError(t, json.Unmarshal([]byte(plan), &root))
	var find func(n node) (float64, bool)
	find = func(n node) (float64, bool) {
		if n.Subplan == name {
			return n.Rows, true
		}
		for _, c := range n.Plans {
			if r, ok := find(c); ok {
				return r, true
			}
		}
		return 0, false
	}
	return find(root)
}
