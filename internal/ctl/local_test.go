package ctl_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime/localtimetest"
)

// Local due times and deadlines across daylight-saving transitions resolve
// through a JSON Lines file and through nudgectl schedule's flags to the
// instants every other path gives (localtimetest.DST).
func TestScheduleLocalTimesAcrossDST(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	ctx := context.Background()
	var lines []string
	for i, c := range localtimetest.DST {
		lines = append(lines, jl(t, fmt.Sprint("file-", i), "due_at", "-", "deadline", "-",
			"tz", strconv.Quote(c.Zone), "due_local", strconv.Quote(c.DueLocal),
			"deadline_local", strconv.Quote(c.DeadlineLocal), "window", `"08:00-21:00"`))
	}
	path := filepath.Join(t.TempDir(), "local.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	res := b.run("schedule", "-f", path)
	require.NoError(t, res.err, res.stderr)
	require.Equal(t, summary{lines: len(lines), created: len(lines)}, parseSummary(t, res.stdout))

	for i, c := range localtimetest.DST {
		res := b.run("schedule", "--tenant", "acme", "--key", fmt.Sprint("flags-", i), "--channel", "sms",
			"--recipient", "+14155550100", "--template", "course-expiry", "--tz", c.Zone,
			"--due-local", c.DueLocal, "--deadline-local", c.DeadlineLocal, "--window", "mon-fri 08:00-21:00")
		require.NoError(t, res.err, "%s: %s", c.Name, res.stderr)
		for _, key := range []string{fmt.Sprint("file-", i), fmt.Sprint("flags-", i)} {
			r, err := intake.GetByKey(ctx, b.db.Pool, "acme", key)
			require.NoError(t, err)
			require.True(t, r.DueAt.Equal(c.WantDue), "%s %s: due %s, want %s", key, c.Name, r.DueAt, c.WantDue)
			require.True(t, r.Deadline.Equal(c.WantDeadline), "%s %s: deadline %s, want %s", key, c.Name, r.Deadline, c.WantDeadline)
			require.Equal(t, c.Zone, r.TZ)
		}
	}

	// show prints the times in UTC and in the recipient's zone.
	res = b.run("show", "--tenant", "acme", "--key", "flags-0")
	require.NoError(t, res.err)
	require.Regexp(t, `(?m)^time zone\s+Europe/Stockholm$`, res.stdout)
	require.Regexp(t, `(?m)^send window\s+mon-fri 08:00-21:00 \(its own, in Europe/Stockholm\)$`, res.stdout)
	require.Regexp(t, `(?m)^due at\s+2027-03-28T01:30:00Z \(2027-03-28 03:30:00 CEST local\)$`, res.stdout)
	require.Regexp(t, `(?m)^deadline\s+2027-03-28T10:00:00Z \(2027-03-28 12:00:00 CEST local\)$`, res.stdout)
	require.Regexp(t, `(?m)^TIME \(UTC\)\s+LOCAL\s+FROM\s+TO\s+FENCE\s+ACTOR\s+REASON$`, res.stdout)
	require.Regexp(t, `(?m)^\S+\s+\S+ \S+ CES?T\s+-\s+pending\s+0\s+nudgectl\s+scheduled$`, res.stdout)
}

// Bad local-time fields are reported per line, naming the field, and per flag.
func TestScheduleLocalTimeErrors(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	local := []string{"due_at", "-", "deadline", "-", "tz", `"Europe/Stockholm"`,
		"due_local", `"2027-03-28T09:00"`, "deadline_local", `"2027-03-28T21:00"`}
	edit := func(key string, edits ...string) string {
		return jl(t, key, append(append([]string{}, local...), edits...)...)
	}
	lines := []string{
		edit("ok"),
		edit("x2", "tz", `"Europe/Stokholm"`),
		edit("x3", "due_local", `"2027-03-28 9am"`),
		edit("x4", "window", `"9-17"`),
		edit("x5", "due_at", `"2027-03-28T09:00:00Z"`),
		edit("x6", "tz", "-"),
		edit("x7", "due_local", `"2027-03-28T09:00+01:00"`),
	}
	res := b.runIn(strings.NewReader(strings.Join(lines, "\n")), "schedule", "-f", "-")
	requireExitCode(t, res.err, 2)
	got := rejections(res.stderr)
	require.Len(t, got, 6, res.stderr)
	for i, field := range []string{"tz", "due_local", "window", "due_local", "tz", "due_local"} {
		require.Contains(t, got[i], fmt.Sprintf("line %d: field %q", i+2, field), got[i])
	}
	res = b.run("schedule", "--tenant", "acme", "--key", "f", "--channel", "email", "--recipient", "a@example.com",
		"--template", "t", "--tz", "Europe/Stockholm", "--due-local", "2027-03-28T09:00", "--deadline-local", "2027-03-28T21:00",
		"--window", "sometimes")
	require.ErrorContains(t, res.err, "--window must be a send window")
	require.Equal(t, 1, countRows(t, b.db.Pool, ""))
}
