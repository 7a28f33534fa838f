package intake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Each size limit holds at its bound and refuses one past it, in Go
// (ScheduleMany) and in the SQL function a web tier calls, naming the same
// field: the constants in limits.go and the numbers in nudge_invalid agree.
func TestLimitsAreTheSameInGoAndSQL(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()

	// padData is a JSON object of exactly n bytes as PostgreSQL prints it
	// (and as sent: no spaces to add).
	padData := func(n int) string {
		const head = `{"x": ""}`
		return `{"x": "` + strings.Repeat("a", n-len(head)) + `"}`
	}
	email := func(n int) string { return strings.Repeat("a", n-len("@example.com")) + "@example.com" }
	cases := []struct {
		field     string
		atMost    func(*intake.Request)
		pastLimit func(*intake.Request)
	}{
		{"tenant", func(r *intake.Request) { r.Tenant = strings.Repeat("é", intake.MaxTenantChars) },
			func(r *intake.Request) { r.Tenant = strings.Repeat("é", intake.MaxTenantChars+1) }},
		{"key", func(r *intake.Request) { r.Key = strings.Repeat("k", intake.MaxKeyChars) },
			func(r *intake.Request) { r.Key = strings.Repeat("k", intake.MaxKeyChars+1) }},
		{"recipient", func(r *intake.Request) { r.Recipient = email(intake.MaxRecipientChars) },
			func(r *intake.Request) { r.Recipient = email(intake.MaxRecipientChars + 1) }},
		{"template", func(r *intake.Request) { r.Template = strings.Repeat("t", intake.MaxTemplateChars) },
			func(r *intake.Request) { r.Template = strings.Repeat("t", intake.MaxTemplateChars+1) }},
		{"data", func(r *intake.Request) { r.Data = rawJSON(padData(intake.MaxDataBytes)) },
			func(r *intake.Request) { r.Data = rawJSON(padData(intake.MaxDataBytes + 1)) }},
	}
	for i, tc := range cases {
		ok, bad := valid(), valid()
		ok.Key, bad.Key = fmt.Sprintf("ok-%d", i), fmt.Sprintf("bad-%d", i)
		tc.atMost(&ok)
		tc.pastLimit(&bad)

		out, err := intake.ScheduleMany(ctx, db.Pool, []intake.Request{ok, bad})
		require.NoError(t, err)
		require.NoError(t, out[0].Err, "%s at its limit: Go", tc.field)
		var verr *intake.ValidationError
		require.ErrorAs(t, out[1].Err, &verr, "%s past its limit: Go", tc.field)
		require.Equal(t, tc.field, verr.Field)
		require.Contains(t, verr.Reason, "at most")

		if tc.field == "key" {
			ok.Tenant, bad.Tenant = "acme-sql", "acme-sql"
		} else {
			ok.Key, bad.Key = ok.Key+"-sql", bad.Key+"-sql"
		}
		sql := func(r intake.Request) error {
			data := `{}`
			if raw, isRaw := r.Data.(rawJSON); isRaw {
				data = string(raw)
			}
			_, err := db.Pool.Exec(ctx, `SELECT nudge_schedule($1, $2, $3, $4, $5, $6::jsonb, $7, $8)`,
				r.Tenant, r.Key, string(r.Channel), r.Recipient, r.Template, data, r.DueAt, r.Deadline)
			return err
		}
		require.NoError(t, sql(ok), "%s at its limit: SQL", tc.field)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, sql(bad), &pgErr, "%s past its limit: SQL", tc.field)
		require.Equal(t, "22023", pgErr.Code)
		require.Equal(t, tc.field, pgErr.ColumnName)
		require.Contains(t, pgErr.Message, "at most")
	}
}

// rawJSON is data passed through as written.
type rawJSON = json.RawMessage

// Regression (issue 13, finding 6): a NUL character or invalid UTF-8 in one
// request failed the whole set-based statement (22021 / 22P05), so no
// request of the batch was scheduled. Each is now refused for its own
// request, naming the field, and the others are scheduled.
func TestNulAndInvalidUTF8AreRefusedPerRequest(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()

	cases := []struct {
		name, field, reason string
		edit                func(*intake.Request)
	}{
		{"NUL in key", "key", "NUL", func(r *intake.Request) { r.Key = "a\x00b" }},
		{"NUL in tenant", "tenant", "NUL", func(r *intake.Request) { r.Tenant = "\x00" }},
		{"NUL in recipient", "recipient", "NUL", func(r *intake.Request) { r.Recipient = "a@example.com\x00" }},
		{"NUL in template", "template", "NUL", func(r *intake.Request) { r.Template = "t\x00" }},
		{"invalid UTF-8 in key", "key", "UTF-8", func(r *intake.Request) { r.Key = "caf\xe9" }},
		{"invalid UTF-8 in channel", "channel", "UTF-8", func(r *intake.Request) { r.Channel = "\xff" }},
		{"NUL in a data value", "data", "NUL", func(r *intake.Request) { r.Data = map[string]any{"course": "Go\x00"} }},
		{"NUL in a data key", "data", "NUL", func(r *intake.Request) { r.Data = rawJSON(`{"\u0000": 1}`) }},
		{"invalid UTF-8 in data", "data", "UTF-8", func(r *intake.Request) { r.Data = rawJSON("{\"a\": \"\xff\"}") }},
		{"lone surrogate in data", "data", "surrogate", func(r *intake.Request) { r.Data = rawJSON(`{"a": "\ud800"}`) }},
		{"number PostgreSQL cannot store", "data", "digits", func(r *intake.Request) { r.Data = rawJSON(`{"a": 1e131072}`) }},
		{"number that prints huge", "data", "digits", func(r *intake.Request) { r.Data = rawJSON(`{"a": 1e5000}`) }},
		{"data nested too deep", "data", "nest", func(r *intake.Request) {
			r.Data = rawJSON(`{"a":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`)
		}},
	}
	reqs := []intake.Request{valid()}
	for i, tc := range cases {
		r := valid()
		r.Key = fmt.Sprintf("bad-%d", i)
		tc.edit(&r)
		good := valid()
		good.Key = fmt.Sprintf("good-%d", i)
		reqs = append(reqs, r, good)
	}
	out, err := intake.ScheduleMany(ctx, db.Pool, reqs)
	require.NoError(t, err, "one bad request must not fail the batch")
	require.Equal(t, intake.Created, out[0].Status)
	for i, tc := range cases {
		bad, good := out[1+2*i], out[2+2*i]
		var verr *intake.ValidationError
		require.ErrorAs(t, bad.Err, &verr, tc.name)
		require.Equal(t, tc.field, verr.Field, tc.name)
		require.Contains(t, verr.Reason, tc.reason, tc.name)
		require.NoError(t, good.Err, "%s: the request beside it", tc.name)
		require.Equal(t, intake.Created, good.Status, tc.name)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminders`).Scan(&n))
	require.Equal(t, 1+len(cases), n, "every good request and nothing else")

	// A web tier calling the SQL function gets PostgreSQL's own refusal.
	_, err = db.Pool.Exec(ctx, `SELECT nudge_schedule('acme', $1, 'email', 'a@example.com', 'course-expiry', '{}', now(), now() + interval '1 hour')`, "a\x00b")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "22021", pgErr.Code, "invalid byte sequence")
	_, err = db.Pool.Exec(ctx, `SELECT nudge_schedule('acme', 'k', 'email', 'a@example.com', 'course-expiry', $1::jsonb, now(), now() + interval '1 hour')`, `{"a": "\u0000"}`)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22P05", pgErr.Code, "unsupported Unicode escape")
}

func TestCheckDataAcceptsWhatPostgreSQLStores(t *testing.T) {
	t.Parallel()
	for _, data := range []string{
		`{}`, ` {"a": 1}`, `{"a": "\ud83d\ude00 \u00e9 \\u0000 \"x"}`, `{"a": -1.5e-300, "b": 1e308, "c": 0}`,
		`{"a": [[[{"b": null}]]], "c": true}`, "{\"é\": \"\u2028\"}",
	} {
		require.Nil(t, intake.CheckData([]byte(data)), data)
	}
	require.Nil(t, intake.CheckData([]byte(`{"a": "\\u0000"}`)), `an escaped backslash, then the text u0000`)
	require.NotNil(t, intake.CheckData([]byte(`{"a": "\\\u0000"}`)), `an escaped backslash, then a NUL escape`)
	require.NotNil(t, intake.CheckData([]byte(`{"a": "\udc00\ud800"}`)), "surrogates in the wrong order")
	require.NotNil(t, intake.CheckData([]byte(`[1]`)))
	require.NotNil(t, intake.CheckData([]byte(`{"a": 1`)))
}

func TestReschedule(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	res, err := intake.Schedule(ctx, db.Pool, valid())
	require.NoError(t, err)
	st, err := intake.Reschedule(ctx, db.Pool, "acme", valid().Key, due.Add(time.Hour), deadline.Add(time.Hour), "test", "course moved")
	require.NoError(t, err)
	require.Equal(t, reminder.Pending, st)
	r, err := intake.Get(ctx, db.Pool, res.ID)
	require.NoError(t, err)
	require.Equal(t, due.Add(time.Hour), r.DueAt.UTC())
	_, err = intake.Reschedule(ctx, db.Pool, "acme", valid().Key, due, due, "test", "")
	var verr *intake.ValidationError
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "deadline", verr.Field)
}
