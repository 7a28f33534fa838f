package ctl_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ctl"
)

func audienceFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	return p
}

func TestCampaignStageCommand(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	ctx := context.Background()
	sheet := audienceFile(t, "renewals.csv", "key,recipient,date,zone,name\n"+
		"s1,ada@example.org,2030-03-08,Asia/Tokyo,Ada\n"+
		"s2,bob@example.org,2030-03-08,,Bob\n"+
		"s3,,2030-03-08,,Cy\n"+
		"s4,dee@example.org,2030-03-08,Europe/Stockholm,Dee\n"+
		"s5,eve@example.org,2030-02-30,,Eve\n"+
		"s6,fay@example.org,2030-03-08,,Fay\n"+
		"s7,gus@example.org,2030-03-08,,Gus\n")
	stage := []string{"campaign", "stage", "--source", "sheet", "--tenant", "acme", "-f", sheet}
	r := b.run(stage...)
	require.Error(t, r.err)
	require.Equal(t, ctl.ExitUsage, ctl.ExitCode(r.err), "bad lines: exit 2, as schedule -f")
	require.Equal(t, "staged 5 rows into source sheet of tenant acme; 2 bad lines\n", r.stdout)
	require.True(t, strings.HasPrefix(r.stderr, `line 4 (key "s3"): field "recipient" is required`+"\n"+
		`line 6 (key "s5"): field "date" must be a date like 2027-01-31, not "2030-02-30"`+"\n"), r.stderr)
	var at1 time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT staged_at FROM campaign_stages WHERE source = 'sheet'`).Scan(&at1))
	var errs []string
	rows, err := b.db.Pool.Query(ctx, `SELECT line || ' ' || key || ' ' || field FROM campaign_stage_errors WHERE source = 'sheet' ORDER BY line`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		errs = append(errs, s)
	}
	require.Equal(t, []string{"4 s3 recipient", "6 s5 date"}, errs, "the table campaign status counts")

	r = b.run(stage...)
	require.Equal(t, "source sheet of tenant acme already holds this file: 5 rows, 2 bad lines; nothing changed\n", r.stdout)
	var at2 time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT staged_at FROM campaign_stages WHERE source = 'sheet'`).Scan(&at2))
	require.True(t, at1.Equal(at2), "staging the same file again changes nothing")

	r = b.run("campaign", "create", "--tenant", "acme", "--name", "from-sheet", "--template", "renewal",
		"--source", "sheet", "--days-before", "7", "--at-local", "09:00", "--default-zone", "Europe/London",
		"--deadline", "2030-06-01T00:00:00Z")
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "campaign 1 created\n", r.stdout)
	require.Contains(t, r.stderr, "5 audience rows (counted in the source)")
	r = b.run("campaign", "status", "1")
	require.NoError(t, r.err, r.stderr)
	require.Contains(t, r.stdout, "remaining: 5\n")

	other := audienceFile(t, "v2.jsonl", `{"key": "s1", "recipient": "ada@example.org"}`+"\n")
	r = b.run("campaign", "stage", "--source", "sheet", "--tenant", "acme", "-f", other)
	require.ErrorContains(t, r.err, "campaign 1 is still planning from source 'sheet'")
	r = b.run("campaign", "stage", "--source", "sheet-2", "--tenant", "acme", "-f", other)
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "staged 1 rows into source sheet-2 of tenant acme; 0 bad lines\n", r.stdout)
	r = b.run("campaign", "stage", "--source", "x", "--tenant", "acme", "-f", audienceFile(t, "a.txt", "k\n"))
	require.ErrorContains(t, r.err, "give --format csv or jsonl")
}

func TestCampaignAdmissionCommand(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
		CREATE TABLE renewals (learner_id bigint PRIMARY KEY, email text);
		INSERT INTO renewals SELECT i, 'l' || i || '@example.org' FROM generate_series(1, 1000) i;
		GRANT SELECT ON renewals TO nudge_planner;
		SELECT nudge_campaign_source('renewals', 'acme', 'renewals', 'learner_id', 'email', NULL, NULL)`)
	require.NoError(t, err)
	limits := audienceFile(t, "limits.json", `{"version": "t1", "channels": {"email": {"account": "ses", "rate": 1, "burst": 1}}}`)
	now := time.Now().UTC().Truncate(time.Second)
	create := []string{"campaign", "create", "--tenant", "acme", "--name", "too-soon", "--template", "renewal",
		"--source", "renewals", "--due", now.Add(time.Minute).Format(time.RFC3339),
		"--deadline", now.Add(10 * time.Minute).Format(time.RFC3339), "--limits", limits}
	r := b.run(create...)
	require.Error(t, r.err)
	require.Equal(t, ctl.ExitUsage, ctl.ExitCode(r.err))
	msg := r.err.Error()
	for _, want := range []string{
		`campaign not admitted: campaign "too-soon" of tenant "acme" cannot be planned and delivered before its deadline`,
		"planning 11.25s: 1000 audience rows (counted in the source) / slice size 200 = 5 slices × 2.25s " +
			"(10ms per row, the default: 0 measured slices, 10 needed; + 250ms per slice for the next command)",
		`delivery 16m40s: 1000 reminders / 1 sends per second (account "ses" of channel email in ` + limits + ")",
		"retries 15s: 5 attempts, backoff 1s doubling to at most 1h0m0s",
		", starting at the due time " + now.Add(time.Minute).Format(time.RFC3339) + " at the earliest",
	} {
		require.Contains(t, msg, want)
	}
	// The deadline was given to the second, and the command reads the clock later.
	require.Regexp(t, `needs 17m5\ds, done at \S+; the window is (9m5\ds|10m0s)`, msg)
	var n int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM campaigns`).Scan(&n))
	require.Zero(t, n, "refused: nothing created")

	r = b.run(append(create, "--admit-anyway", "approved by the renewals team")...)
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "campaign 1 created\n", r.stdout)
	require.Contains(t, r.stderr, "admitted by override: approved by the renewals team")
	var override string
	var admitted bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT admission->>'override', (admission->>'admitted')::boolean FROM campaigns WHERE id = 1`).
		Scan(&override, &admitted))
	require.Equal(t, "approved by the renewals team", override, "the override is recorded with the numbers")
	require.True(t, admitted)

	// Ten measured slices of 200 rows in 600 ms: 3 ms per row from now on.
	_, err = b.db.Pool.Exec(ctx, `
		INSERT INTO campaign_slices (campaign_id, slice, rows_read, intents, bad_rows, planner, at, took_ms)
		SELECT 1, i, 200, 200, 0, 'p', now(), 600 FROM generate_series(1, 10) i`)
	require.NoError(t, err)
	r = b.run("campaign", "create", "--tenant", "acme", "--name", "measured", "--template", "renewal",
		"--source", "renewals", "--due", now.Add(time.Minute).Format(time.RFC3339),
		"--deadline", now.Add(time.Hour).Format(time.RFC3339), "--slice-size", "100")
	require.NoError(t, r.err, r.stderr)
	require.Contains(t, r.stderr, "10 slices × 550ms (3ms per row, p95 of the last 10 slices of this installation")
	require.Contains(t, r.stderr, "delivery 0s: no rate limit (no limit for channel \"email\")")

	r = b.run("campaign", "cohort", "set", "globex")
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "campaign cohort: globex\n", r.stdout)
	r = b.run("campaign", "create", "--tenant", "acme", "--name", "outside", "--template", "renewal",
		"--source", "renewals", "--due", now.Add(time.Minute).Format(time.RFC3339),
		"--deadline", now.Add(time.Hour).Format(time.RFC3339))
	require.ErrorContains(t, r.err, "tenant 'acme' is not in the campaign cohort")
	r = b.run("campaign", "cohort", "add", "acme")
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "campaign cohort: acme globex\n", r.stdout)
	r = b.run("campaign", "compare", "1", "2")
	require.NoError(t, r.err, r.stderr)
	require.True(t, strings.HasSuffix(r.stdout, "10 slices, 10 differ\n"), r.stdout)
}
