package ctl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// opsBundle is a database and a broker of the test's own, with nudgectl
// pointed at both.
type opsBundle struct {
	*ctlBundle
	mq *testenv.Broker
}

func setupOps(t *testing.T) *opsBundle {
	t.Helper()
	return &opsBundle{ctlBundle: setupCtl(t), mq: testenv.RabbitMQ(t)}
}

// dlq runs `nudgectl dlq ARGS` against the test's broker.
func (b *opsBundle) dlq(args ...string) ctlResult {
	return b.run(append(append([]string{"dlq"}, args...), "--amqp-url", b.mq.URL, "--queue-prefix", b.mq.Topology.Prefix,
		"--read-wait", "5s", "--signing-keys", opstest.KeysSpec)...)
}

func (b *opsBundle) insert(t *testing.T, r opstest.Row) int64 {
	t.Helper()
	return opstest.Insert(t, b.db.Pool, r)
}

func (b *opsBundle) publish(t *testing.T, msgs ...opstest.DeadLetter) []string {
	t.Helper()
	return opstest.Publish(t, b.mq.URL, b.mq.Topology, opstest.Keys(t), msgs...)
}

func (b *opsBundle) queue(t *testing.T, ch reminder.Channel) []string {
	t.Helper()
	return opstest.QueueIDs(t, b.mq.URL, b.mq.Topology, ch)
}

func (b *opsBundle) audit(t *testing.T) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT action || ' ' || coalesce(reminder_id::text, '-') || ' ' ||
		coalesce(message_id, '-') || ' ' || actor || ' ' || reason FROM operator_audit ORDER BY id`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// quarantinedWithMessage is a reminder the worker quarantined: its row is
// quarantined at fence+1 and its message is in the dead-letter queue.
func (b *opsBundle) quarantinedWithMessage(t *testing.T, key string, deadline time.Time, reason string) (int64, string) {
	t.Helper()
	id := b.insert(t, opstest.Row{Key: key, State: reminder.Quarantined, Fence: 3, Attempts: 2, Deadline: deadline,
		DueAt: deadline.Add(-48 * time.Hour), Reason: reason})
	ids := b.publish(t, opstest.DeadLetter{ReminderID: id, Fence: 2, Tenant: "acme", Deadline: deadline,
		Reason: reason, ReceiveCount: 6})
	return id, ids[0]
}

var listRowRE = regexp.MustCompile(`(?m)^(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+`)

func TestDLQListAndShow(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	now := time.Now()
	q1, m1 := b.quarantinedWithMessage(t, "q1", now.Add(3*time.Hour), "delivered 6 times without an outcome")
	unverifiable := b.publish(t, opstest.DeadLetter{Reason: "unverifiable: message is not signed"})[0]
	q2, m2 := b.quarantinedWithMessage(t, "q2", now.Add(30*time.Minute), "quarantined: the send panicked: boom")
	want := []string{m1, unverifiable, m2}

	res := b.dlq("list", "--channel", "email")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, b.mq.Topology.DeadQueue("email")+": 3 messages")
	rows := listRowRE.FindAllStringSubmatch(res.stdout, -1)
	require.Len(t, rows, 3, res.stdout)
	require.Equal(t, []string{"1", fmt.Sprint(q1), "acme", "quarantined"}, rows[0][1:])
	require.Equal(t, []string{"2", "-", "-", "-"}, rows[1][1:])
	require.Equal(t, []string{"3", fmt.Sprint(q2), "acme", "quarantined"}, rows[2][1:])
	require.Contains(t, res.stdout, "delivered 6 times without an outcome")
	require.Contains(t, res.stdout, "unverifiable: message is not signed")
	require.Regexp(t, `\s(2h59m\d+s|3h0m0s)\s`, res.stdout, "time left before q1's deadline")

	// JSON, twice: same order, same receive counts; nothing was consumed.
	for range 2 {
		js := b.dlq("list", "--channel", "email", "--json")
		require.NoError(t, js.err, js.stderr)
		var out struct {
			Depth    int              `json:"depth"`
			Messages []ops.DeadLetter `json:"messages"`
		}
		require.NoError(t, json.Unmarshal([]byte(js.stdout), &out), js.stdout)
		require.Equal(t, 3, out.Depth)
		require.Equal(t, int64(6), out.Messages[0].ReceiveCount)
		require.Equal(t, q1, out.Messages[0].Row.ID)
		require.Equal(t, reminder.Quarantined, out.Messages[0].Row.State)
	}
	require.Equal(t, want, b.queue(t, reminder.Email), "list keeps the queue as it was")

	show := b.dlq("show", "--channel", "email", "--id", fmt.Sprint(q2))
	require.NoError(t, show.err, show.stderr)
	require.Contains(t, show.stdout, "quarantined: the send panicked: boom")
	require.Contains(t, show.stdout, "header x-nudge-receive-count")
	require.Contains(t, show.stdout, fmt.Sprintf(`"id":%d`, q2), "the body")
	show = b.dlq("show", "--channel", "email", "--position", "2")
	require.NoError(t, show.err)
	require.Contains(t, show.stdout, "reminder\tnone named"[:8])
	require.Contains(t, show.stdout, "none named")
	require.ErrorContains(t, b.dlq("show", "--channel", "email", "--message", "nope").err, "no such message")
	require.ErrorContains(t, b.dlq("list").err, "--channel is required")
	require.Equal(t, want, b.queue(t, reminder.Email))
}

// Regression (issue 13, finding 1): nudgectl dlq refused a queue deeper
// than one consumer's prefetch (65,534), blocking list, replay and expire.
// With pages of 2 standing for pages of 65,535: list shows every message in
// order, expire acts on messages of every page, and the rest stays in order.
func TestDLQCommandsReadInPages(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	now := time.Now()
	var want []string
	var ids []int64
	for i := range 5 {
		id, m := b.quarantinedWithMessage(t, fmt.Sprintf("q%d", i), now.Add(3*time.Hour), "quarantined: the send panicked: boom")
		want, ids = append(want, m), append(ids, id)
	}
	res := b.dlq("list", "--channel", "email", "--page-size", "2")
	require.NoError(t, res.err, res.stderr)
	rows := listRowRE.FindAllStringSubmatch(res.stdout, -1)
	require.Len(t, rows, 5, res.stdout)
	for i, r := range rows {
		require.Equal(t, []string{fmt.Sprint(i + 1), fmt.Sprint(ids[i])}, r[1:3])
	}
	require.Equal(t, want, b.queue(t, reminder.Email))

	res = b.dlq("expire", "--channel", "email", "--page-size", "2", "--id", fmt.Sprint(ids[1]), "--id", fmt.Sprint(ids[4]),
		"--reason", "poison", "--actor", "bob")
	require.NoError(t, res.err, res.stderr)
	require.Equal(t, []string{want[0], want[2], want[3]}, b.queue(t, reminder.Email))
	st, _, _ := opstest.State(t, b.db.Pool, ids[4])
	require.Equal(t, reminder.Expired, st)
}

func TestDLQReplay(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	now := time.Now()
	ok1, m1 := b.quarantinedWithMessage(t, "ok1", now.Add(3*time.Hour), "delivered 6 times without an outcome")
	late, m2 := b.quarantinedWithMessage(t, "late", now.Add(2*time.Minute), "delivered 6 times without an outcome")
	ok2, m3 := b.quarantinedWithMessage(t, "ok2", now.Add(3*time.Hour), "quarantined: the send panicked: boom")
	noRow := b.publish(t, opstest.DeadLetter{Reason: "unverifiable: message signature does not verify"})[0]
	// A reminder already replayed (pending now): its message is stale.
	stale := b.insert(t, opstest.Row{Key: "stale", State: reminder.Pending, Fence: 4})
	m5 := b.publish(t, opstest.DeadLetter{ReminderID: stale, Fence: 2, Reason: "delivered 6 times without an outcome"})[0]
	all := []string{m1, m2, m3, noRow, m5}

	// --reason, --attempts and a selection are required.
	require.ErrorContains(t, b.dlq("replay", "--channel", "email", "--all", "--attempts", "reset").err, "--reason is required")
	require.ErrorContains(t, b.dlq("replay", "--channel", "email", "--all", "--reason", "r").err, "--attempts is required")
	require.ErrorContains(t, b.dlq("replay", "--channel", "email", "--attempts", "reset", "--reason", "r").err, "select dead letters")

	dry := b.dlq("replay", "--channel", "email", "--all", "--attempts", "reset", "--reason", "fixed the template", "--dry-run", "--actor", "alice")
	require.NoError(t, dry.err, dry.stderr)
	require.Contains(t, dry.stdout, "dry run: nothing was changed or acknowledged")
	require.Contains(t, dry.stdout, "dlq replay: replay 2, drop 1, refused: deadline 1, refused: no reminder 1; 3 messages would be acknowledged, 2 left")
	require.Equal(t, all, b.queue(t, reminder.Email), "a dry run acknowledges nothing")
	st, _, _ := opstest.State(t, b.db.Pool, ok1)
	require.Equal(t, reminder.Quarantined, st)

	// By reason substring: only the panicked one.
	res := b.dlq("replay", "--channel", "email", "--dead-reason", "PANICKED", "--attempts", "keep", "--reason", "fixed the template", "--actor", "alice")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "replay 1; 1 messages acknowledged, 4 left")
	st, fence, attempts := opstest.State(t, b.db.Pool, ok2)
	require.Equal(t, reminder.Pending, st)
	require.EqualValues(t, 4, fence)
	require.Equal(t, 2, attempts, "attempts kept")
	require.Equal(t, opstest.Event{From: reminder.Quarantined, To: reminder.Pending, Fence: 4, Actor: "alice",
		Reason: "dlq replay: fixed the template [attempts kept]"}, opstest.LastEvent(t, b.db.Pool, ok2))
	require.Equal(t, []string{m1, m2, noRow, m5}, b.queue(t, reminder.Email), "the rest stays, in order")

	// All: the one with time left is replayed, the stale message dropped; the
	// late one and the unverifiable one stay.
	res = b.dlq("replay", "--channel", "email", "--all", "--attempts", "reset", "--reason", "fixed the template", "--actor", "alice")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "replay 1, drop 1, refused: deadline 1, refused: no reminder 1; 2 messages acknowledged, 2 left")
	st, _, attempts = opstest.State(t, b.db.Pool, ok1)
	require.Equal(t, reminder.Pending, st)
	require.Zero(t, attempts, "attempts reset")
	st, _, _ = opstest.State(t, b.db.Pool, late)
	require.Equal(t, reminder.Quarantined, st, "refused: too close to its deadline")
	st, fence, _ = opstest.State(t, b.db.Pool, stale)
	require.Equal(t, [2]any{reminder.Pending, int64(4)}, [2]any{st, fence}, "a stale message's reminder is not moved")
	require.Equal(t, opstest.Event{From: reminder.Pending, To: reminder.Pending, Fence: 4, Actor: "alice",
		Reason: fmt.Sprintf("dlq replay: fixed the template [attempts reset] (stale: reminder %d is already pending)", stale)},
		opstest.LastEvent(t, b.db.Pool, stale), "but its timeline notes the drop")
	shown := b.run("show", fmt.Sprint(stale))
	require.NoError(t, shown.err)
	require.Regexp(t, `(?m)^\S+\s+pending\s+\(no change\)\s+4\s+alice\s+dlq-dropped: dlq replay: fixed the template`, shown.stdout)
	require.Equal(t, []string{m2, noRow}, b.queue(t, reminder.Email))
	require.Equal(t, []string{
		fmt.Sprintf("dlq.replay %d %s alice dlq replay: fixed the template [attempts kept]", ok2, m3),
		fmt.Sprintf("dlq.replay %d %s alice dlq replay: fixed the template [attempts reset]", ok1, m1),
		fmt.Sprintf("dlq.drop %d %s alice dlq replay: fixed the template [attempts reset]", stale, m5),
	}, b.audit(t))

	// Running it again changes nothing.
	res = b.dlq("replay", "--channel", "email", "--all", "--attempts", "reset", "--reason", "again", "--actor", "alice")
	require.NoError(t, res.err)
	require.Contains(t, res.stdout, "0 messages acknowledged, 2 left")
}

func TestDLQExpire(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	now := time.Now()
	q1, m1 := b.quarantinedWithMessage(t, "q1", now.Add(3*time.Hour), "delivered 6 times without an outcome")
	q2, m2 := b.quarantinedWithMessage(t, "q2", now.Add(3*time.Hour), "delivered 6 times without an outcome")
	noRow := b.publish(t, opstest.DeadLetter{Reason: "unverifiable: message is not signed", Body: "garbage"})[0]
	gone := b.publish(t, opstest.DeadLetter{ReminderID: 987654, Fence: 1, Reason: "unknown reminder"})[0]
	smsID := b.publish(t, opstest.DeadLetter{Channel: reminder.SMS, ReminderID: 5, Fence: 1, Reason: "x"})[0]

	res := b.dlq("expire", "--channel", "email", "--id", fmt.Sprint(q1), "--message", noRow, "--reason", "poison", "--actor", "bob")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "expire 1, drop 1; 2 messages acknowledged, 2 left")
	st, fence, _ := opstest.State(t, b.db.Pool, q1)
	require.Equal(t, reminder.Expired, st)
	require.Equal(t, opstest.Event{From: reminder.Quarantined, To: reminder.Expired, Fence: fence, Actor: "bob",
		Reason: "dlq expire: poison"}, opstest.LastEvent(t, b.db.Pool, q1))
	require.Equal(t, []string{m2, gone}, b.queue(t, reminder.Email))

	res = b.dlq("expire", "--channel", "email", "--all", "--reason", "poison", "--actor", "bob")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "expire 1, drop 1; 2 messages acknowledged, 0 left")
	st, _, _ = opstest.State(t, b.db.Pool, q2)
	require.Equal(t, reminder.Expired, st)
	require.Empty(t, b.queue(t, reminder.Email))
	require.Equal(t, []string{smsID}, b.queue(t, reminder.SMS), "the other channel's queue is untouched")
	require.Equal(t, []string{
		fmt.Sprintf("dlq.expire %d %s bob dlq expire: poison", q1, m1),
		fmt.Sprintf("dlq.drop - %s bob dlq expire: poison", noRow),
		fmt.Sprintf("dlq.expire %d %s bob dlq expire: poison", q2, m2),
		fmt.Sprintf("dlq.drop 987654 %s bob dlq expire: poison", gone),
	}, b.audit(t))
	var body string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT detail->>'body' FROM operator_audit WHERE message_id = $1`, noRow).Scan(&body))
	require.Equal(t, "garbage", body, "what was dropped is on record")
}

// A reminder that moved on between the read and the decision is left alone
// and its message kept.
func TestDLQDecisionIsFenced(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	q, m := b.quarantinedWithMessage(t, "q", time.Now().Add(3*time.Hour), "poison")
	r, err := ops.DLQ{URL: b.mq.URL, Topology: b.mq.Topology, Wait: 5 * time.Second, Keys: opstest.Keys(t)}.Read(context.Background(), reminder.Email)
	require.NoError(t, err)
	require.NoError(t, r.LoadRows(context.Background(), b.db.Pool))
	// Meanwhile another operator replays it with `nudgectl replay`.
	_, err = b.db.Pool.Exec(context.Background(), `UPDATE reminder_state SET state = 'pending', fence = fence + 1 WHERE id = $1`, q)
	require.NoError(t, err)
	res, err := ops.DecideDLQ(context.Background(), b.db.Pool, r, time.Now(), ops.DLQExpire, ops.DLQSelector{All: true},
		ops.Decision{Actor: "bob", Reason: "poison"})
	require.NoError(t, err)
	require.NoError(t, r.Close())
	require.Equal(t, map[ops.Verdict]int{ops.VerdictMovedOn: 1}, res.Counts)
	st, _, _ := opstest.State(t, b.db.Pool, q)
	require.Equal(t, reminder.Pending, st, "not expired: it had moved on")
	require.Equal(t, []string{m}, b.queue(t, reminder.Email))
	require.Empty(t, b.audit(t))
}

func TestReplayCommand(t *testing.T) {
	t.Parallel()
	b := &opsBundle{ctlBundle: setupCtl(t)} // no broker: a replay only writes the table
	now := time.Now().UTC()
	var failed []int64
	for i := range 5 {
		failed = append(failed, b.insert(t, opstest.Row{Key: fmt.Sprint("f", i), State: reminder.Failed, Fence: 4, Attempts: 5,
			DueAt: now.Add(-time.Hour), Deadline: now.Add(time.Hour)}))
	}
	late := b.insert(t, opstest.Row{Key: "late", State: reminder.Failed, Fence: 4, DueAt: now.Add(-time.Hour), Deadline: now.Add(time.Minute)})
	delivered := b.insert(t, opstest.Row{Key: "d", State: reminder.Delivered, Fence: 4, DueAt: now.Add(-time.Hour)})
	from := now.Add(-2 * time.Hour).Format(time.RFC3339)

	args := []string{"replay", "--from", from, "--to", "now", "--attempts", "reset", "--reason", "SMTP relay was down", "--actor", "carol"}
	dry := b.run(append(args, "--dry-run")...)
	require.NoError(t, dry.err, dry.stderr)
	require.Equal(t, fmt.Sprintf(`dry run (nothing changed): 6 reminders match (failed 6)
would replay 5 to pending (attempts reset)
refused 1: 1 past their deadline or less than 5m0s before it, 0 with their payload purged (%d)
`, late), dry.stdout)
	require.Equal(t, 6, countRows(t, b.db.Pool, `WHERE state = 'failed'`))

	res := b.run(args...)
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "replayed 5 to pending (attempts reset); the dispatcher publishes them on its next run")
	require.Contains(t, res.stdout, "refused 1: 1 past their deadline")
	for _, id := range failed {
		require.Equal(t, opstest.Event{From: reminder.Failed, To: reminder.Pending, Fence: 5, Actor: "carol",
			Reason: "replay: SMTP relay was down [attempts reset]"}, opstest.LastEvent(t, b.db.Pool, id))
	}

	again := b.run(args...)
	require.NoError(t, again.err)
	require.Contains(t, again.stdout, "replayed 0 to pending", "nothing twice")

	byID := b.run("replay", "--id", fmt.Sprintf("%d,%d,424242", delivered, failed[0]), "--attempts", "keep",
		"--reason", "r", "--actor", "carol", "--json")
	require.NoError(t, byID.err, byID.stderr)
	var out ops.ReplayResult
	require.NoError(t, json.Unmarshal([]byte(byID.stdout), &out))
	require.Zero(t, out.Replayed)
	require.Equal(t, map[int64]reminder.State{delivered: reminder.Delivered, failed[0]: reminder.Pending, 424242: ""}, out.NotSelected)

	require.ErrorContains(t, b.run("replay", "--attempts", "reset", "--reason", "r").err, "name what to replay")
	require.ErrorContains(t, b.run("replay", "--id", "1", "--reason", "r", "--attempts", "maybe").err, `--attempts "maybe"`)
	require.ErrorContains(t, b.run("replay", "--from", "yesterday", "--attempts", "reset", "--reason", "r").err, "--from")
	require.ErrorContains(t, b.run("replay", "--id", "1", "--state", "delivered", "--attempts", "reset", "--reason", "r").err,
		"a replay selects only")
}

func TestStatsCommand(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	now := time.Now().UTC()
	b.insert(t, opstest.Row{Key: "due", DueAt: now.Add(-3 * time.Minute)})
	b.insert(t, opstest.Row{Key: "g", Tenant: "globex", State: reminder.Delivered, Channel: reminder.SMS})
	b.insert(t, opstest.Row{Key: "x", State: reminder.Expired, Since: now.Add(-time.Minute)})
	b.publish(t, opstest.DeadLetter{Reason: "unverifiable"}, opstest.DeadLetter{Reason: "unverifiable"})

	res := b.run("stats", "--amqp-url", b.mq.URL, "--queue-prefix", b.mq.Topology.Prefix)
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(res.err), res.stderr)
	table := parseTable(t, res.stdout)
	require.Equal(t, int64(3), table["all"]["total"])
	require.Regexp(t, `oldest due, pending \(dispatcher\)\s+3m\d+s`, res.stdout)
	require.Regexp(t, `deadline misses \(expired\)\s+email 1 last hour, 1 last day; sms 0 last hour, 0 last day`, res.stdout)
	require.Regexp(t, `dead-letter queues\s+email 2, sms 0, webhook 0 messages`, res.stdout)
	require.Regexp(t, `(?m)^\s*globex\s+0\s+0\s+0\s+0\s+0\s+0\s+1\s+0\s+0\s+0\s+1$`, res.stdout)
	require.Regexp(t, `(?m)^\s*acme\s+1\s+0\s+0\s+0\s+0\s+0\s+0\s+0\s+1\s+0\s+2$`, res.stdout)
	require.Equal(t, 2, len(b.queue(t, reminder.Email)), "stats only counts")

	js := b.run("stats", "--json")
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(js.err))
	var st ops.Report
	require.NoError(t, json.Unmarshal([]byte(js.stdout), &st))
	require.Equal(t, map[string]int64{"pending": 1, "expired": 1}, st.ByChannel["email"])
	require.Nil(t, st.DeadLetters, "no broker asked")
	require.Equal(t, map[string]int64{"expired": 1}, st.Recent["email"], "expired a minute ago: in the window")
	require.True(t, strings.Contains(res.stdout, "dispatcher cutoff"))
}

// An operator's session after an incident, command by command: stats shows
// the problem, dlq list explains the dead letters, a window replay (dry run,
// then for real), a dead-letter replay of what can be saved and an expiry of
// the rest. Then every reminder is where the operator put it, every decision
// is on record with the operator's name and reason, the dead-letter queue is
// empty, and running the session again changes nothing.
func TestOperatorSession(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	now := time.Now().UTC()
	// A provider outage failed four SMS reminders; a template bug poisoned
	// three email messages; one tampered message was dead-lettered.
	var failed []int64
	for i := range 4 {
		failed = append(failed, b.insert(t, opstest.Row{Key: fmt.Sprint("sms-", i), Channel: reminder.SMS, State: reminder.Failed,
			Fence: 4, Attempts: 5, DueAt: now.Add(-40 * time.Minute), Deadline: now.Add(6 * time.Hour),
			Reason: "attempts exhausted (5): http_503"}))
	}
	poison := map[string]int64{}
	for _, k := range []string{"p1", "p2"} {
		poison[k], _ = b.quarantinedWithMessage(t, k, now.Add(5*time.Hour), "quarantined: the send panicked: template: missing key")
	}
	poison["late"], _ = b.quarantinedWithMessage(t, "late", now.Add(time.Minute), "quarantined: the send panicked: template: missing key")
	b.publish(t, opstest.DeadLetter{Reason: "unverifiable: message signature does not verify"})

	stats := b.run("stats", "--amqp-url", b.mq.URL, "--queue-prefix", b.mq.Topology.Prefix)
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(stats.err), "no dispatcher runs")
	require.Equal(t, int64(4), parseTable(t, stats.stdout)["sms"]["failed"])
	require.Equal(t, int64(3), parseTable(t, stats.stdout)["email"]["quarantined"])
	require.Regexp(t, `dead-letter queues\s+email 4, sms 0, webhook 0 messages`, stats.stdout)

	list := b.dlq("list", "--channel", "email")
	require.NoError(t, list.err)
	require.Equal(t, 3, strings.Count(list.stdout, "template: missing key"))
	require.Contains(t, list.stdout, "unverifiable: message signature does not verify")

	session := func() (window, dlqReplay, dlqExpire string) {
		window = b.run("replay", "--from", "now-1h", "--to", "now", "--channel", "sms", "--state", "failed",
			"--attempts", "reset", "--reason", "provider 5xx, INC-7", "--actor", "dana").stdout
		dlqReplay = b.dlq("replay", "--channel", "email", "--dead-reason", "missing key", "--attempts", "reset",
			"--reason", "template fixed, INC-8", "--actor", "dana").stdout
		dlqExpire = b.dlq("expire", "--channel", "email", "--all", "--reason", "unrecoverable, INC-8", "--actor", "dana").stdout
		return window, dlqReplay, dlqExpire
	}
	dry := b.run("replay", "--from", "now-1h", "--to", "now", "--channel", "sms", "--state", "failed",
		"--attempts", "reset", "--reason", "provider 5xx, INC-7", "--actor", "dana", "--dry-run")
	require.NoError(t, dry.err)
	require.Contains(t, dry.stdout, "would replay 4 to pending")
	window, dlqReplay, dlqExpire := session()
	require.Contains(t, window, "replayed 4 to pending")
	require.Contains(t, dlqReplay, "replay 2, refused: deadline 1; 2 messages acknowledged, 2 left")
	require.Contains(t, dlqExpire, "expire 1, drop 1; 2 messages acknowledged, 0 left")

	for _, id := range failed {
		st, _, attempts := opstest.State(t, b.db.Pool, id)
		require.Equal(t, reminder.Pending, st)
		require.Zero(t, attempts)
		require.Equal(t, "dana", opstest.LastEvent(t, b.db.Pool, id).Actor)
	}
	for k, want := range map[string]reminder.State{"p1": reminder.Pending, "p2": reminder.Pending, "late": reminder.Expired} {
		st, _, _ := opstest.State(t, b.db.Pool, poison[k])
		require.Equal(t, want, st, k)
	}
	require.Equal(t, "dlq expire: unrecoverable, INC-8", opstest.LastEvent(t, b.db.Pool, poison["late"]).Reason)
	require.Empty(t, b.queue(t, reminder.Email))
	require.Len(t, b.audit(t), 4, "one audit row per acknowledged message")

	// The same session again: nothing to do.
	window, dlqReplay, dlqExpire = session()
	require.Contains(t, window, "replayed 0 to pending")
	require.Contains(t, dlqReplay, "no dead letter")
	require.Contains(t, dlqExpire, "no dead letter")
	require.Len(t, b.audit(t), 4)
}

func TestListAndBulkCommands(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	for i := range 3 {
		b.insert(t, opstest.Row{Key: fmt.Sprintf("offboard-%d", i), Tenant: "initech", State: reminder.Pending})
	}
	b.insert(t, opstest.Row{Key: "offboard-done", Tenant: "initech", State: reminder.Delivered, Fence: 2})
	b.insert(t, opstest.Row{Key: "keep", Tenant: "acme"})

	res := b.run("list", "--tenant", "initech", "--page-size", "2")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "offboard-done")
	require.Contains(t, res.stdout, "l***r@example.com", "recipients are masked")
	require.Regexp(t, `2 shown of 4 selected; next page: --before \d+`, res.stdout)
	next := regexp.MustCompile(`--before (\d+)`).FindStringSubmatch(res.stdout)[1]
	res = b.run("list", "--tenant", "initech", "--page-size", "2", "--before", next, "--json", "--show-recipients")
	require.NoError(t, res.err, res.stderr)
	var page ops.ListPage
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &page))
	require.Len(t, page.Items, 2)
	require.Equal(t, "learner@example.com", page.Items[0].Recipient)
	require.Equal(t, ops.Count{N: 4, Exact: true}, page.Count)
	require.Zero(t, page.Next)

	res = b.run("bulk", "cancel", "--tenant", "initech", "--actor", "alice")
	require.ErrorIs(t, res.err, ops.ErrNoReason)
	res = b.run("bulk", "cancel", "--tenant", "initech", "--actor", "alice", "--reason", "offboarded", "--dry-run")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "dry run: 4 selected; 3 would be canceled")
	require.Contains(t, res.stdout, "1 skipped: already delivered")
	res = b.run("bulk", "cancel", "--tenant", "initech", "--actor", "alice", "--reason", "offboarded")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "4 selected; 3 canceled")
	require.Len(t, b.audit(t), 3)
	for _, a := range b.audit(t) {
		require.Regexp(t, `^bulk\.cancel \d+ - alice bulk cancel: offboarded$`, a)
	}
	res = b.run("bulk", "expire", "--tenant", "initech", "--actor", "alice", "--reason", "x", "--max", "2")
	require.ErrorIs(t, res.err, ops.ErrBulkTooLarge)
}

// Issue 17: dlq replay answered "drop — stale: reminder is already enqueued"
// for dead letters that were the only copy of their reminder's message
// (dead-lettered by the broker at its delivery limit, the row untouched),
// acknowledged them and left the reminders stranded until the reconciler's
// --overdue. A reminder enqueued or retrying at its dead letter's fence is
// waiting for that very message: replay returns it to pending (the
// dispatcher publishes a fresh message), expire ends it. One enqueued at a
// newer fence has a newer copy: its dead letter is stale and dropped.
func TestDLQReplaysAnOrphanedOnlyCopy(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	deadline := time.Now().Add(3 * time.Hour)
	orphan := b.insert(t, opstest.Row{Key: "orphan", State: reminder.Enqueued, Fence: 2, Deadline: deadline})
	retrying := b.insert(t, opstest.Row{Key: "retrying", State: reminder.Retrying, Fence: 2, Attempts: 1, Deadline: deadline})
	newer := b.insert(t, opstest.Row{Key: "newer", State: reminder.Enqueued, Fence: 5, Deadline: deadline})
	ms := b.publish(t,
		opstest.DeadLetter{ReminderID: orphan, Fence: 2, Deadline: deadline, Reason: "broker: delivery_limit"},
		opstest.DeadLetter{ReminderID: retrying, Fence: 2, Deadline: deadline, Reason: "broker: delivery_limit"},
		opstest.DeadLetter{ReminderID: newer, Fence: 2, Deadline: deadline, Reason: "broker: delivery_limit"})

	dry := b.dlq("replay", "--channel", "email", "--all", "--attempts", "keep", "--reason", "broker gave up",
		"--dry-run", "--actor", "alice")
	require.NoError(t, dry.err, dry.stderr)
	require.Contains(t, dry.stdout, "replay 2, drop 1")
	require.Contains(t, dry.stdout, "enqueued waiting for this message, the only copy of it")
	require.Contains(t, dry.stdout, "a newer copy than this message's")

	res := b.dlq("replay", "--channel", "email", "--id", fmt.Sprint(orphan), "--id", fmt.Sprint(newer),
		"--attempts", "keep", "--reason", "broker gave up", "--actor", "alice")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "replay 1, drop 1; 2 messages acknowledged, 1 left")
	st, fence, _ := opstest.State(t, b.db.Pool, orphan)
	require.Equal(t, reminder.Pending, st, "back to the dispatcher, which publishes a fresh message")
	require.EqualValues(t, 3, fence)
	require.Equal(t, opstest.Event{From: reminder.Enqueued, To: reminder.Pending, Fence: 3, Actor: "alice",
		Reason: "dlq replay: broker gave up [attempts kept]"}, opstest.LastEvent(t, b.db.Pool, orphan))
	st, fence, _ = opstest.State(t, b.db.Pool, newer)
	require.Equal(t, reminder.Enqueued, st, "its newer message is on its way: untouched")
	require.EqualValues(t, 5, fence)

	res = b.dlq("expire", "--channel", "email", "--all", "--reason", "not worth it now", "--actor", "alice")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, "expire 1")
	st, _, _ = opstest.State(t, b.db.Pool, retrying)
	require.Equal(t, reminder.Expired, st)
	require.Empty(t, b.queue(t, reminder.Email))
	require.Len(t, ms, 3)
}
