package ctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
	"github.com/nudgehq/nudge/schema"
)

// ctlResult is what one nudgectl run printed and returned.
type ctlResult struct {
	stdout, stderr string
	err            error
}

type ctlBundle struct {
	db *testenv.DB
	// run runs nudgectl against the test's schema.
	run func(args ...string) ctlResult
	// runIn is run with stdin.
	runIn func(stdin io.Reader, args ...string) ctlResult
}

func setupCtl(t *testing.T) *ctlBundle {
	t.Helper()
	db := testenv.Postgres(t)
	b := &ctlBundle{db: db}
	b.runIn = func(stdin io.Reader, args ...string) ctlResult {
		t.Helper()
		return runCtl(t, db.URL, stdin, args...)
	}
	b.run = func(args ...string) ctlResult {
		t.Helper()
		return b.runIn(nil, args...)
	}
	return b
}

// runCtl runs the real command tree as config.Execute does, without exiting.
func runCtl(t *testing.T, dbURL string, stdin io.Reader, args ...string) ctlResult {
	t.Helper()
	cmd := ctl.Command()
	cmd.SilenceUsage = true
	config.BindEnv(cmd)
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	if stdin != nil {
		cmd.SetIn(stdin)
	}
	cmd.SetArgs(append(args, "--database-url", dbURL))
	err := cmd.Execute()
	return ctlResult{stdout: out.String(), stderr: errOut.String(), err: err}
}

// jl is one JSON Lines line for key, with fields overridden by edits
// (raw JSON values; "-" deletes the field).
func jl(t *testing.T, key string, edits ...string) string {
	t.Helper()
	m := map[string]json.RawMessage{
		"tenant": json.RawMessage(`"acme"`), "key": json.RawMessage(strconv.Quote(key)),
		"channel": json.RawMessage(`"email"`), "recipient": json.RawMessage(`"learner@example.com"`),
		"template": json.RawMessage(`"course-expiry"`), "data": json.RawMessage(`{"course":"Go 101"}`),
		"due_at": json.RawMessage(`"2026-08-12T09:00:00Z"`), "deadline": json.RawMessage(`"2026-08-12T23:59:00Z"`),
	}
	require.Zero(t, len(edits)%2, "edits are field, value pairs")
	for i := 0; i < len(edits); i += 2 {
		if edits[i+1] == "-" {
			delete(m, edits[i])
			continue
		}
		m[edits[i]] = json.RawMessage(edits[i+1])
	}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return string(b)
}

func writeFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "reminders.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

// countRows counts the reminders, each its wide row with its state row's
// state and reason (a lazy reminder without its state row yet: pending, no
// reason, as intake Get reads it), that where selects.
func countRows(t *testing.T, pool *pgxpool.Pool, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM (
		SELECT r.id, r.tenant, r.key, r.channel, r.recipient, r.template, r.data,
		       coalesce(s.state, 'pending') AS state, s.reason
		  FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id) reminders `+where, args...).Scan(&n))
	return n
}

// rejections returns the "line N: ..." lines of stderr, in order.
func rejections(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "line ") {
			out = append(out, l)
		}
	}
	return out
}

var summaryRE = regexp.MustCompile(`^(\d+) lines: (\d+) scheduled, (\d+) already scheduled, (\d+) rejected in \S+\n$`)

type summary struct{ lines, created, exists, rejected int }

func parseSummary(t *testing.T, stdout string) summary {
	t.Helper()
	m := summaryRE.FindStringSubmatch(stdout)
	require.NotNil(t, m, "summary line, got %q", stdout)
	n := func(s string) int {
		v, err := strconv.Atoi(s)
		require.NoError(t, err)
		return v
	}
	return summary{n(m[1]), n(m[2]), n(m[3]), n(m[4])}
}

func requireExitCode(t *testing.T, err error, code int) {
	t.Helper()
	var exit *config.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, code, exit.Code)
}

func TestScheduleFileMixed(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	ctx := context.Background()

	path := writeFile(t,
		jl(t, "a"),                          // 1: created
		"",                                  // 2: blank
		jl(t, "x3", "due_at", `"tomorrow"`), // 3: parse error
		jl(t, "b", "channel", `"sms"`, "recipient", `"+14155550100"`), // 4: created
		jl(t, "c", "channel", `"sms"`, "recipient", `"555-1234"`),     // 5: validation error
		jl(t, "a"), // 6: same content: already scheduled
		jl(t, "a", "recipient", `"other@example.com"`),     // 7: same key, other content
		jl(t, "x8", "colour", `"red"`),                     // 8: unknown field
		"   ",                                              // 9: blank
		jl(t, "d", "data", `{"n":4}`),                      // 10: created
		jl(t, "x11", "deadline", `"2026-08-12T08:00:00Z"`), // 11: deadline before due_at
		jl(t, "x12", "tenant", `5`),                        // 12: type error
		jl(t, "x13", "template", "-"),                      // 13: missing template
		jl(t, "e", "due_at", `"2026-08-12T11:00:00+02:00"`, "deadline", `null`), // 14: deadline required
		jl(t, "f"), // 15: created
	)

	res := b.run("schedule", "-f", path)
	requireExitCode(t, res.err, 2)
	require.ErrorContains(t, res.err, "8 of 15 lines rejected")
	require.Equal(t, summary{lines: 15, created: 4, exists: 1, rejected: 8}, parseSummary(t, res.stdout))

	var aID int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT id FROM reminders WHERE tenant = 'acme' AND key = 'a'`).Scan(&aID))
	wantRejected := []string{
		`line 3: field "due_at" must be an RFC 3339 time like 2026-08-12T09:00:00Z, got "tomorrow"`,
		`line 5: field "recipient" must be an E.164 phone number like +14155550100`,
		fmt.Sprintf(`line 7: key "a" of tenant "acme" is already scheduled (reminder %d) with different content`, aID),
		`line 8: field "colour" is not a known field (want tenant, key, channel, recipient, template, data, due_at, deadline, tz, due_local, deadline_local, window)`,
		`line 11: field "deadline" must be after due_at`,
		`line 12: field "tenant" must be a JSON string`,
		`line 13: field "template" must be a template name of lowercase letters, digits, ".", "_" or "-"`,
		`line 14: field "deadline" is required (RFC 3339 time)`,
	}
	require.Equal(t, wantRejected, rejections(res.stderr), "stderr:\n%s", res.stderr)

	// The good lines are stored, each once, the first occurrence of "a" winning.
	require.Equal(t, 4, countRows(t, b.db.Pool, ""))
	var keys []string
	rows, err := b.db.Pool.Query(ctx, `SELECT key FROM reminders ORDER BY key`)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"a", "b", "d", "f"}, keys)
	require.Equal(t, 1, countRows(t, b.db.Pool, `WHERE key = 'a' AND recipient = 'learner@example.com'`))
	require.Equal(t, 1, countRows(t, b.db.Pool, `WHERE key = 'd' AND data = '{"n":4}'::jsonb`))
	var actor string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT actor FROM reminder_events WHERE reminder_id = $1`, aID).Scan(&actor))
	require.Equal(t, "nudgectl", actor)

	// The same file again schedules nothing new and rejects the same lines.
	again := b.run("schedule", "-f", path)
	requireExitCode(t, again.err, 2)
	require.Equal(t, summary{lines: 15, created: 0, exists: 5, rejected: 8}, parseSummary(t, again.stdout))
	require.Equal(t, wantRejected, rejections(again.stderr))
	require.Equal(t, 4, countRows(t, b.db.Pool, ""))
}

// Regression (issue 13, findings 1 and 6): a NUL in key or data passed
// validation and failed the set-based insert for the whole batch ("lines
// 1-3 ... 22P05", exit 1, the rest of the file not read); invalid UTF-8 was
// replaced with U+FFFD in silence; a line of any size was read and accepted.
// Each bad line is now rejected naming its line, field and what was
// expected, and every good line beside it is scheduled.
func TestScheduleFileHostileLines(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	path := writeFile(t,
		jl(t, "a"),                           // 1
		jl(t, "x2", "key", `"a\u0000b"`),     // 2: NUL in key
		jl(t, "b"),                           // 3
		jl(t, "c", "data", `{"x":"\u0000"}`), // 4: NUL in data
		jl(t, "x5", "key", "\"caf\xe9\""),    // 5: invalid UTF-8 in key
		jl(t, "d", "data", `{"x":"`+strings.Repeat("y", intake.MaxDataBytes)+`"}`), // 6: data too large
		`{"key":"`+strings.Repeat("z", ctl.MaxLineBytes)+`"}`,                      // 7: line too long
		jl(t, "e", "recipient", `"`+strings.Repeat("r", 300)+`@example.com"`),      // 8: recipient too long
		jl(t, "f"), // 9
	)
	res := b.run("schedule", "-f", path)
	requireExitCode(t, res.err, 2)
	require.Equal(t, summary{lines: 9, created: 3, rejected: 6}, parseSummary(t, res.stdout))
	require.Equal(t, []string{
		`line 2: field "key" must not contain a NUL character (U+0000 at byte 1)`,
		`line 4: field "data" must not contain a NUL character (\u0000 at byte 6)`,
		`line 5: field "key" must be valid UTF-8`,
		fmt.Sprintf(`line 6: field "data" must be at most %d bytes as JSON, got %d`, intake.MaxDataBytes, intake.MaxDataBytes+8),
		fmt.Sprintf(`line 7: is longer than %d bytes, the limit for one line; skipped`, ctl.MaxLineBytes),
		`line 8: field "recipient" must be at most 254 characters`,
	}, rejections(res.stderr), "stderr:\n%s", res.stderr)
	require.Equal(t, 3, countRows(t, b.db.Pool, `WHERE key IN ('a', 'b', 'f')`))
	require.Equal(t, 3, countRows(t, b.db.Pool, ""))
}

func TestScheduleFileAllGoodExitsZero(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	res := b.run("schedule", "-f", writeFile(t, jl(t, "a"), jl(t, "b")), "--actor", "import-42")
	require.NoError(t, res.err)
	require.Equal(t, summary{lines: 2, created: 2}, parseSummary(t, res.stdout))
	require.Empty(t, res.stderr)
	var actor string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT DISTINCT actor FROM reminder_events`).Scan(&actor))
	require.Equal(t, "import-42", actor)
}

func TestScheduleFileMissing(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	res := b.run("schedule", "-f", filepath.Join(t.TempDir(), "nope.jsonl"))
	require.ErrorContains(t, res.err, "opening ")
	require.ErrorContains(t, res.err, "nope.jsonl")
}

func TestScheduleStdin(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	in := strings.NewReader(jl(t, "a") + "\n\n" + jl(t, "b", "channel", `"fax"`) + "\n" + jl(t, "c"))
	res := b.runIn(in, "schedule", "-f", "-")
	requireExitCode(t, res.err, 2)
	require.Equal(t, summary{lines: 4, created: 2, rejected: 1}, parseSummary(t, res.stdout))
	require.Equal(t, []string{`line 3: field "channel" must be "email", "sms" or "webhook"`}, rejections(res.stderr))
	require.Equal(t, 2, countRows(t, b.db.Pool, ""))
}

// Rejections are printed batch by batch; across batch boundaries, and with
// parse errors (found while reading) mixed with validation errors (found at
// the batch's flush), they must still come out in line order.
func TestScheduleFileRejectionsInLineOrderAcrossBatches(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	const total = 5000
	lines := make([]string, total)
	var want []int
	for i := range lines {
		n := i + 1
		key := fmt.Sprintf("k%05d", n)
		switch {
		case n%700 == 0 || n == 2001 || n == 4001: // parse error
			lines[i] = jl(t, key, "due_at", `"soon"`)
			want = append(want, n)
		case n%500 == 0 || n == 1999 || n == 4000: // validation error
			lines[i] = jl(t, key, "recipient", `"nobody"`)
			want = append(want, n)
		default:
			lines[i] = jl(t, key)
		}
	}
	res := b.run("schedule", "-f", writeFile(t, lines...))
	requireExitCode(t, res.err, 2)
	require.Equal(t, summary{lines: total, created: total - len(want), rejected: len(want)}, parseSummary(t, res.stdout))
	var got []int
	for _, l := range rejections(res.stderr) {
		var n int
		_, err := fmt.Sscanf(l, "line %d:", &n)
		require.NoError(t, err, l)
		got = append(got, n)
	}
	require.Equal(t, want, got)
	require.Equal(t, total-len(want), countRows(t, b.db.Pool, ""))
}

func TestScheduleBulk(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	const total = 20000
	var sb strings.Builder
	for i := range total {
		ch, rcpt := "email", fmt.Sprintf(`"learner%d@example.com"`, i)
		if i%3 == 0 {
			ch, rcpt = "sms", fmt.Sprintf(`"+1415%07d"`, i)
		}
		sb.WriteString(jl(t, fmt.Sprintf("bulk-%d", i), "channel", strconv.Quote(ch), "recipient", rcpt,
			"data", fmt.Sprintf(`{"i":%d}`, i)))
		sb.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), "bulk.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(sb.String()), 0o600))

	start := time.Now()
	res := b.run("schedule", "-f", path)
	elapsed := time.Since(start)
	require.NoError(t, res.err, "stderr:\n%s", res.stderr)
	require.Equal(t, summary{lines: total, created: total}, parseSummary(t, res.stdout))
	require.Empty(t, rejections(res.stderr))
	require.Equal(t, total, countRows(t, b.db.Pool, ""))
	require.Equal(t, (total+2)/3, countRows(t, b.db.Pool, `WHERE channel = 'sms'`))
	var events int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM reminder_events`).Scan(&events))
	require.Equal(t, total, events)
	t.Logf("scheduled %d reminders in %s (%.0f/s): %s", total, elapsed,
		float64(total)/elapsed.Seconds(), strings.TrimSpace(res.stdout))
}

// scheduleFlags are flags for one valid reminder; edits override them.
func scheduleFlags(key string, edits ...string) []string {
	flags := map[string]string{
		"--tenant": "acme", "--key": key, "--channel": "email", "--recipient": "learner@example.com",
		"--template": "course-expiry", "--data": `{"course":"Go 101"}`,
		"--due-at": "2026-08-12T09:00:00Z", "--deadline": "2026-08-12T23:59:00Z",
	}
	for i := 0; i+1 < len(edits); i += 2 {
		flags[edits[i]] = edits[i+1]
	}
	args := []string{"schedule"}
	for _, f := range []string{"--tenant", "--key", "--channel", "--recipient", "--template", "--data", "--due-at", "--deadline"} {
		if v, ok := flags[f]; ok && v != "-" {
			args = append(args, f+"="+v)
		}
	}
	return args
}

var createdRE = regexp.MustCompile(`^created reminder (\d+)\n$`)

// scheduleOne schedules one reminder with flags and returns its ID.
func scheduleOne(t *testing.T, b *ctlBundle, key string, edits ...string) int64 {
	t.Helper()
	res := b.run(scheduleFlags(key, edits...)...)
	require.NoError(t, res.err)
	m := createdRE.FindStringSubmatch(res.stdout)
	require.NotNil(t, m, "got %q", res.stdout)
	id, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return id
}

func TestScheduleFlags(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	id := scheduleOne(t, b, "one")
	var recipient string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT recipient FROM reminders WHERE id = $1`, id).Scan(&recipient))
	require.Equal(t, "learner@example.com", recipient)

	res := b.run(scheduleFlags("one")...)
	require.NoError(t, res.err)
	require.Equal(t, fmt.Sprintf("exists reminder %d\n", id), res.stdout)

	res = b.run(scheduleFlags("one", "--recipient", "other@example.com")...)
	require.ErrorContains(t, res.err, "with different content")

	// No --data is an empty object.
	noData := scheduleOne(t, b, "no-data", "--data", "-")
	require.Equal(t, 1, countRows(t, b.db.Pool, `WHERE id = $1 AND data = '{}'::jsonb`, noData))

	cases := []struct {
		name  string
		edits []string
		want  string
	}{
		{"deadline before due", []string{"--deadline", "2026-08-12T08:00:00Z"}, "--deadline must be after due_at"},
		{"bad due-at", []string{"--due-at", "tomorrow 9am"}, `--due-at must be an RFC 3339 time like 2026-08-12T09:00:00Z, got "tomorrow 9am"`},
		{"bad deadline", []string{"--deadline", "2026-08-12"}, `--deadline must be an RFC 3339 time`},
		{"no due-at", []string{"--due-at", "-"}, "--due-at is required"},
		{"bad phone", []string{"--channel", "sms", "--recipient", "555-1234"}, "--recipient must be an E.164 phone number"},
		{"bad channel", []string{"--channel", "fax"}, `--channel must be "email", "sms" or "webhook"`},
		{"no tenant", []string{"--tenant", "-"}, "--tenant is required"},
		{"bad template", []string{"--template", "Course Expiry"}, "--template must be a template name"},
		{"data array", []string{"--data", "[1,2]"}, "--data must be a JSON object"},
		{"data not JSON", []string{"--data", "{course:"}, "--data: must be a JSON object"},
	}
	for _, tc := range cases {
		res := b.run(scheduleFlags("bad-"+tc.name, tc.edits...)...)
		require.Error(t, res.err, tc.name)
		require.Contains(t, res.err.Error(), tc.want, tc.name)
		require.Empty(t, res.stdout, tc.name)
	}
	require.Equal(t, 2, countRows(t, b.db.Pool, ""), "nothing invalid is stored")
}

func TestShow(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	id := scheduleOne(t, b, "shown", "--channel", "sms", "--recipient", "+14155550100")

	res := b.run("show", strconv.FormatInt(id, 10))
	require.NoError(t, res.err)
	require.Regexp(t, fmt.Sprintf(`(?m)^reminder\s+%d$`, id), res.stdout)
	require.Regexp(t, `(?m)^tenant / key\s+acme / shown$`, res.stdout)
	require.Regexp(t, `(?m)^channel\s+sms to \+14155550100, template course-expiry$`, res.stdout)
	require.Regexp(t, `(?m)^state\s+pending$`, res.stdout)
	require.Regexp(t, `(?m)^due at\s+2026-08-12T09:00:00Z$`, res.stdout)
	require.Regexp(t, `(?m)^deadline\s+2026-08-12T23:59:00Z$`, res.stdout)
	require.Regexp(t, `(?m)^time zone\s+UTC \(none given\)$`, res.stdout)
	require.Regexp(t, `(?m)^send window\s+any \(the policy for tenant acme on sms, in UTC\)$`, res.stdout)
	require.Regexp(t, `(?m)^idempotency key\s+nudge-[0-9a-f]{64}$`, res.stdout)
	require.Regexp(t, `(?m)^TIME\s+FROM\s+TO\s+FENCE\s+ACTOR\s+REASON$`, res.stdout)
	require.Regexp(t, `(?m)^\S+\s+-\s+pending\s+0\s+nudgectl\s+scheduled$`, res.stdout)

	byKey := b.run("show", "--tenant", "acme", "--key", "shown")
	require.NoError(t, byKey.err)
	require.Equal(t, res.stdout, byKey.stdout)

	js := b.run("show", "--json", strconv.FormatInt(id, 10))
	require.NoError(t, js.err)
	var got struct {
		Reminder reminder.Reminder `json:"reminder"`
		Events   []reminder.Event  `json:"events"`
		Publish  struct {
			Batch *int64 `json:"batch"`
		} `json:"publish"`
	}
	dec := json.NewDecoder(strings.NewReader(js.stdout))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&got), js.stdout)
	require.Equal(t, id, got.Reminder.ID)
	require.Equal(t, reminder.Pending, got.Reminder.State)
	require.Equal(t, reminder.SMS, got.Reminder.Channel)
	require.JSONEq(t, `{"course":"Go 101"}`, string(got.Reminder.Data))
	require.Len(t, got.Events, 1)
	require.Equal(t, reminder.Pending, got.Events[0].To)
	require.Equal(t, "scheduled", got.Events[0].Reason)
	require.Nil(t, got.Publish.Batch, "never dispatched")
	require.NotContains(t, res.stdout, "dispatch batch")

	// Dispatched: the claim's batch, then the broker's confirmation of it.
	st := store.New(b.db.Pool)
	at := time.Date(2026, 8, 12, 9, 0, 1, 0, time.UTC)
	claimed, err := st.ClaimDue(context.Background(), at, at, 10, time.Minute, "dispatcher-7")
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	res = b.run("show", strconv.FormatInt(id, 10))
	require.NoError(t, res.err)
	require.Regexp(t, fmt.Sprintf(`(?m)^dispatch batch\s+%d, publish confirmation not recorded$`, claimed[0].Batch), res.stdout)
	require.NoError(t, st.ConfirmPublished(context.Background(), at, map[int64]int{claimed[0].Batch: 1}, "dispatcher-7"))
	res = b.run("show", strconv.FormatInt(id, 10))
	require.NoError(t, res.err)
	require.Regexp(t, fmt.Sprintf(`(?m)^dispatch batch\s+%d, publish confirmed 2026-08-12T09:00:01Z by dispatcher-7$`, claimed[0].Batch), res.stdout)
	require.Regexp(t, `(?m)^\S+\s+pending\s+enqueued\s+1\s+dispatcher-7\s+claimed for dispatch$`, res.stdout)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"show", "999999"}, "not found"},
		{[]string{"show", "--tenant", "acme", "--key", "nope"}, "not found"},
		{[]string{"show", "abc"}, `reminder ID "abc": must be a number`},
		{[]string{"show"}, "name a reminder"},
		{[]string{"show", "--tenant", "acme"}, "name a reminder"},
		{[]string{"show", "1", "2"}, "accepts at most 1 arg"},
	} {
		res := b.run(tc.args...)
		require.ErrorContains(t, res.err, tc.want, "%v", tc.args)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	id := scheduleOne(t, b, "to-cancel")
	other := scheduleOne(t, b, "by-id")

	res := b.run("cancel", "--tenant", "acme", "--key", "to-cancel", "--reason", "learner unsubscribed", "--actor", "ops:alice")
	require.NoError(t, res.err)
	require.Equal(t, fmt.Sprintf("reminder %d canceled\n", id), res.stdout)

	show := b.run("show", strconv.FormatInt(id, 10))
	require.NoError(t, show.err)
	require.Regexp(t, `(?m)^state\s+canceled$`, show.stdout)
	require.Regexp(t, `(?m)^reason\s+learner unsubscribed$`, show.stdout)
	require.Regexp(t, `(?m)^\S+\s+pending\s+canceled\s+1\s+ops:alice\s+learner unsubscribed$`, show.stdout)

	again := b.run("cancel", "--tenant", "acme", "--key", "to-cancel")
	require.ErrorContains(t, again.err, fmt.Sprintf("reminder %d already ended as canceled", id))
	require.Empty(t, again.stdout)
	var events int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM reminder_events WHERE reminder_id = $1`, id).Scan(&events))
	require.Equal(t, 2, events, "a second cancel records nothing")

	res = b.run("cancel", strconv.FormatInt(other, 10))
	require.NoError(t, res.err)
	require.Equal(t, fmt.Sprintf("reminder %d canceled\n", other), res.stdout)
	require.Equal(t, 1, countRows(t, b.db.Pool, `WHERE id = $1 AND state = 'canceled' AND reason = 'canceled by operator'`, other))

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cancel", "--tenant", "acme", "--key", "nope"}, "not found"},
		{[]string{"cancel", "424242"}, "not found"},
		{[]string{"cancel"}, "name a reminder"},
	} {
		res := b.run(tc.args...)
		require.ErrorContains(t, res.err, tc.want, "%v", tc.args)
	}
}

// parseTable reads PrintOutcomeTable's output (up to the first blank line:
// stats prints more after it) into row → column → count.
func parseTable(t *testing.T, out string) map[string]map[string]int64 {
	t.Helper()
	out, _, _ = strings.Cut(out, "\n\n")
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 2, out)
	header := strings.Fields(lines[0])
	require.Equal(t, "CHANNEL", header[0])
	table := map[string]map[string]int64{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		require.Len(t, f, len(header), "row %q", l)
		table[f[0]] = map[string]int64{}
		for i, v := range f[1:] {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err, "row %q", l)
			table[f[0]][header[i+1]] = n
		}
	}
	return table
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)

	empty := b.run("stats")
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(empty.err), "no dispatcher run recorded")
	require.Equal(t, int64(0), parseTable(t, empty.stdout)["all"]["total"])

	res := b.run("schedule", "-f", writeFile(t,
		jl(t, "e1"), jl(t, "e2"), jl(t, "e3"),
		jl(t, "s1", "channel", `"sms"`, "recipient", `"+14155550100"`),
		jl(t, "s2", "channel", `"sms"`, "recipient", `"+14155550101"`),
	))
	require.NoError(t, res.err)
	require.NoError(t, b.run("cancel", "--tenant", "acme", "--key", "e2").err)

	res = b.run("stats")
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(res.err))
	table := parseTable(t, res.stdout)
	require.Equal(t, []string{"CHANNEL", "pending", "leased", "enqueued", "sending", "retrying", "quarantined", "delivered", "failed", "expired", "canceled", "total"},
		strings.Fields(strings.SplitN(res.stdout, "\n", 2)[0]))
	require.Len(t, table, len(reminder.Channels)+1)
	require.Equal(t, int64(2), table["email"]["pending"])
	require.Equal(t, int64(1), table["email"]["canceled"])
	require.Equal(t, int64(3), table["email"]["total"])
	require.Equal(t, int64(2), table["sms"]["pending"])
	require.Equal(t, int64(2), table["sms"]["total"])
	require.Equal(t, int64(countRows(t, b.db.Pool, `WHERE state = 'pending'`)), table["all"]["pending"])
	require.Equal(t, int64(4), table["all"]["pending"])
	require.Equal(t, int64(5), table["all"]["total"])
	require.Equal(t, int64(0), table["all"]["delivered"])

	js := b.run("stats", "--json")
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(js.err))
	var st struct {
		ByChannel map[string]map[string]int64 `json:"by_channel"`
	}
	require.NoError(t, json.Unmarshal([]byte(js.stdout), &st), js.stdout)
	require.Equal(t, map[string]map[string]int64{
		"email": {"pending": 2, "canceled": 1},
		"sms":   {"pending": 2},
	}, st.ByChannel)
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t) // only to reach the server; the test migrates schemas of its own
	ctx := context.Background()

	// ownSchema is a fresh schema and a database URL whose search_path
	// names it.
	ownSchema := func(suffix string) (name, dbURL string) {
		name = "t_" + testenv.RandomID() + suffix
		_, err := db.Pool.Exec(ctx, `CREATE SCHEMA `+name)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = db.Pool.Exec(context.Background(), `DROP SCHEMA `+name+` CASCADE`)
		})
		u, err := url.Parse(db.URL)
		require.NoError(t, err)
		q := u.Query()
		q.Set("search_path", name)
		u.RawQuery = q.Encode()
		return name, u.String()
	}
	migs, err := schema.Migrations()
	require.NoError(t, err)
	var all []string
	for _, m := range migs {
		all = append(all, strconv.Itoa(m.Version))
	}

	// A fresh database: no earlier release runs on it, so everything
	// applies at once, the after-rollout migrations included.
	name, fresh := ownSchema("_m")
	first := runCtl(t, fresh, nil, "migrate")
	require.NoError(t, first.err)
	require.Equal(t, "applied migrations ["+strings.Join(all, " ")+"] (a fresh database: no binary of an "+
		"earlier release runs on it, so the after-rollout migrations applied too)\n", first.stdout)
	again := runCtl(t, fresh, nil, "migrate")
	require.NoError(t, again.err)
	require.Equal(t, "schema is up to date\n", again.stdout)
	var tables int
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name IN ('reminders', 'reminder_events')`,
		name).Scan(&tables))
	require.Equal(t, 2, tables, "migrate created the tables in the search_path schema")

	// An install at schema 34 (a release before the first after-rollout
	// step, whose fleet may still run): 35 and every migration after it
	// wait for --after-rollout.
	_, older := ownSchema("_o")
	pool, err := pgxpool.New(ctx, older)
	require.NoError(t, err)
	applied, err := schema.Migrate(ctx, pool)
	pool.Close()
	require.NoError(t, err)
	require.Equal(t, 34, applied[len(applied)-1], "schema.Migrate stops before 35")
	var names, versions []string
	for _, m := range migs {
		if m.Version >= 35 {
			names, versions = append(names, m.String()), append(versions, strconv.Itoa(m.Version))
		}
	}
	require.Contains(t, names, "0035_drop_state_mirror.after-rollout")
	waiting := "waiting for the rollout: " + strings.Join(names, ", ") + "; " +
		"once no binary of the previous " +
		"release runs, run nudgectl migrate --after-rollout\n"
	second := runCtl(t, older, nil, "migrate")
	require.NoError(t, second.err)
	require.Equal(t, "no migration to apply before the rollout completes\n"+waiting, second.stdout)

	after := runCtl(t, older, nil, "migrate", "--after-rollout")
	require.NoError(t, after.err)
	require.Equal(t, "applied migrations ["+strings.Join(versions, " ")+"]\n", after.stdout)

	again = runCtl(t, older, nil, "migrate")
	require.NoError(t, again.err)
	require.Equal(t, "schema is up to date\n", again.stdout)

	// The usual test schema is migrated already (as far as testenv goes).
	require.NotContains(t, runCtl(t, db.URL, nil, "migrate").stdout, "applied")
}

func TestBadDatabaseURL(t *testing.T) {
	t.Parallel()

	res := runCtl(t, "postgres://%zz", nil, "stats")
	require.ErrorContains(t, res.err, "--database-url")
}

// migrate's lock bounds are flags with an environment fallback (the
// migration Job's manifest sets them); a negative one is the operator's
// mistake, refused before connecting.
func TestMigrateLockFlags(t *testing.T) {
	t.Parallel()
	help := runCtl(t, "postgres://127.0.0.1:1/none", nil, "migrate", "--help")
	require.NoError(t, help.err)
	require.Contains(t, help.stdout, "--lock-timeout duration")
	require.Contains(t, help.stdout, "[$NUDGE_LOCK_TIMEOUT] (default 2s)")
	require.Contains(t, help.stdout, "[$NUDGE_LOCK_WAIT] (default 5m0s)")

	bad := runCtl(t, "postgres://127.0.0.1:1/none", nil, "migrate", "--lock-timeout=-1s")
	require.ErrorContains(t, bad.err, "lock timeout -1s: must not be negative")
	requireExitCode(t, bad.err, ctl.ExitUsage)
}
