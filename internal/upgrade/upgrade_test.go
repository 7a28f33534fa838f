package upgrade

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
	"github.com/nudgehq/nudge/schema"
)

// OldRelease is the commit of the last landed release, whose binaries the
// rolling upgrade starts from: main when the release was cut. Move it to the
// new release's commit at each release, once its migrations have landed.
const OldRelease = "e1180f7"

// commands are the binaries the fleet and the operator use, of either release.
var commands = []string{"nudgectl", "dispatcher", "sms-worker", "email-worker", "reconciler"}

const signingKeys = "upgrade:0123456789abcdef0123456789abcdef"

var (
	dispatcherArgs = []string{"--every", "1s", "--lease", "10s"}
	// newArgs are flags only this tree's binaries get, by command: what a
	// release turns on behind a flag (batch envelopes from the dispatcher,
	// say) must run beside the old fleet too. Every flag here must exist.
	// The new dispatcher promotes lazy reminders 5 s ahead (H) instead of an
	// hour: after the after-rollout step the test lowers lazy intake's
	// horizon to 2H = 10 s, so reminders scheduled during the run are lazy
	// and come due within it. The old one runs at the default hour, so its
	// passes (and the new one's until the step) leave the watermarks an hour
	// ahead: the step moves them back, or the reminders made lazy below
	// them would never be promoted.
	newArgs = map[string][]string{"dispatcher": {"--promote-ahead", "5s"}}
	// lazyHorizon is the lazy-intake horizon the test sets after the
	// after-rollout step turned lazy intake on (2 h): 2H of the new
	// dispatcher's --promote-ahead, on the test's time scale.
	lazyHorizon = 10 * time.Second
	// A send timeout well above Mailpit's latency on a loaded machine: a
	// relay that accepted after the worker gave up would be sent twice.
	workerArgs = []string{"--send-timeout", "5s", "--send-lease", "15s", "--batch", "20", "--concurrency", "2",
		"--backoff-base", "500ms", "--grace", "8s"}
	reconcilerArgs = []string{"--every", "1s", "--overdue", "20s", "--lease", "10s"}
	// sendTimeout is workerArgs' --send-timeout: an email received later than
	// this after its deadline was begun after it.
	sendTimeout = 5 * time.Second
)

// intent is one line of nudgectl schedule -f, a format both releases read.
type intent struct {
	Tenant    string         `json:"tenant"`
	Key       string         `json:"key"`
	Channel   string         `json:"channel"`
	Recipient string         `json:"recipient"`
	Template  string         `json:"template"`
	Data      map[string]any `json:"data"`
	DueAt     time.Time      `json:"due_at"`
	Deadline  time.Time      `json:"deadline"`
}

// stream returns n reminders keyed name-0..name-(n-1), due evenly from first
// to last, over three tenants and both channels, each to a recipient of its
// own (what the providers record identifies the reminder). One in ten has a
// deadline 1.5 s after it is due (a retry or a queue wait passes it), one in
// twenty is past its deadline already when scheduled.
func stream(name string, n int, first, last time.Time) []intent {
	out := make([]intent, 0, n)
	for i := range n {
		due := first.Add(time.Duration(i) * last.Sub(first) / time.Duration(n))
		in := intent{Tenant: fmt.Sprintf("tenant-%d", i%3), Key: fmt.Sprintf("%s-%d", name, i), Template: "course-expiry",
			Data: map[string]any{"course": "Upgrades 101"}, DueAt: due, Deadline: due.Add(time.Hour)}
		if (i/10)%2 == 0 {
			in.Channel, in.Recipient = "email", fmt.Sprintf("%s-%d@example.com", name, i)
		} else {
			in.Channel, in.Recipient = "sms", phone(name, i)
		}
		switch i % 20 {
		case 1, 2:
			in.Deadline = due.Add(1500 * time.Millisecond)
		case 3:
			in.DueAt, in.Deadline = due.Add(-2*time.Hour), due.Add(-time.Hour)
		}
		out = append(out, in)
	}
	return out
}

// toCancel returns n reminders of tenant-0 keyed name-i, due from first to
// last, that an operator cancels before they are due.
func toCancel(name string, n int, first, last time.Time) []intent {
	out := stream(name, n, first, last)
	for i := range out {
		out[i].Tenant, out[i].Deadline = "tenant-0", out[i].DueAt.Add(time.Hour)
		if out[i].DueAt.Before(first) {
			out[i].DueAt, out[i].Deadline = first, first.Add(time.Hour)
		}
	}
	return out
}

// phone is a number of its own for reminder i of a stream: +1 415, then
// seven digits from a hash of the stream's name and i (the test checks that
// no two reminders share one).
func phone(name string, i int) string {
	return fmt.Sprintf("+1415%03d%04d", crc32.ChecksumIEEE([]byte(name))%1000, i)
}

// fleet runs binaries of either release against one schema and one set of
// queues, and keeps every process to read its output at the end.
type fleet struct {
	t        *testing.T
	env      []string
	oldBins  string
	newBins  string
	procs    []*proc
	tmp      string
	nintents int
}

type proc struct {
	*testenv.Proc
	release string // "old" or "new"
	stopped bool
}

func (f *fleet) start(release, bin string, args ...string) *proc {
	f.t.Helper()
	if release == "new" {
		args = append(slices.Clone(args), newArgs[bin]...)
	}
	p := &proc{Proc: testenv.Start(f.t, f.bins(release), bin, f.env, args...), release: release}
	f.procs = append(f.procs, p)
	f.t.Logf("%s: started %s %s", time.Now().Format("15:04:05.0"), release, p)
	return p
}

// stop ends p as a rollout does (SIGTERM) and requires a clean exit.
func (f *fleet) stop(p *proc) {
	f.t.Helper()
	require.NoError(f.t, p.Signal(syscall.SIGTERM))
	code, sig := p.Wait(f.t, 30*time.Second)
	p.stopped = true
	f.t.Logf("%s: stopped %s %s", time.Now().Format("15:04:05.0"), p.release, p)
	require.Zero(f.t, code, "%s %s exited with %d (signal %v) on SIGTERM; output:\n%s", p.release, p, code, sig, p.Output())
}

func (f *fleet) bins(release string) string {
	if release == "old" {
		return f.oldBins
	}
	return f.newBins
}

// ctl runs nudgectl of a release to completion and returns its standard
// output; read says it only reads (its output is not logged).
func (f *fleet) ctl(release string, args ...string) string {
	f.t.Helper()
	out := f.read(release, args...)
	f.t.Logf("%s: %s nudgectl %s: %s", time.Now().Format("15:04:05.0"), release, args[0], oneLine(out))
	return out
}

// read is ctl without logging the output.
func (f *fleet) read(release string, args ...string) string {
	f.t.Helper()
	cmd := exec.Command(filepath.Join(f.bins(release), "nudgectl"), args...)
	cmd.Env = append(os.Environ(), f.env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(f.t, err, "%s nudgectl %s:\n%s%s", release, strings.Join(args, " "), out, stderr.String())
	return string(out)
}

// schedule writes intents as a JSON Lines file and schedules them with
// nudgectl of a release (as an application linking that release's
// pkg/intake would).
func (f *fleet) schedule(release string, intents []intent) {
	f.t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for _, in := range intents {
		require.NoError(f.t, enc.Encode(in))
	}
	path := filepath.Join(f.tmp, fmt.Sprintf("intake-%d.jsonl", f.nintents))
	f.nintents++
	require.NoError(f.t, os.WriteFile(path, b.Bytes(), 0o600))
	f.ctl(release, "schedule", "-f", path)
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// TestRollingUpgrade runs OldRelease's fleet, migrates to this tree's schema
// under it, and replaces it one component at a time while reminders keep
// coming due; see the package doc.
func TestRollingUpgrade(t *testing.T) {
	began := time.Now()
	oldBins := testenv.BinariesAt(t, OldRelease, commands...)
	newBins := testenv.BinariesOf(t, commands...)
	db := testenv.EmptyPostgres(t)
	mq := testenv.UndeclaredRabbitMQ(t)
	t.Cleanup(func() { deletePlanning(mq) })
	mail := testenv.Mailpit(t)
	ctx := context.Background()

	// The SMS provider: some sends answered 429 (with Retry-After) or 503 and
	// retried, a few refused for good (400); every accepted one recorded.
	sms := fakesms.New(fakesms.WithConfig(fakesms.Config{Rate429: 0.05, Rate5xx: 0.08, Rate4xx: 0.02,
		RetryAfterSeconds: 1, Seed: 42}))
	provider := httptest.NewServer(sms)
	t.Cleanup(provider.Close)
	t.Cleanup(sms.Close)

	f := &fleet{t: t, oldBins: oldBins, newBins: newBins, tmp: t.TempDir(), env: []string{
		"NUDGE_DATABASE_URL=" + db.URL, "NUDGE_AMQP_URL=" + mq.URL, "NUDGE_SIGNING_KEYS=" + signingKeys,
		"NUDGE_QUEUE_PREFIX=" + mq.Topology.Prefix, "NUDGE_SMTP_URL=" + mail.SMTPURL(), "NUDGE_SMS_URL=" + provider.URL,
		"NUDGE_LOG_FORMAT=json", "NUDGE_LOG_LEVEL=warn", "NUDGE_LISTEN=",
	}}

	// 1. The old release's schema and topology, and its intake: the release
	// of the due-ordered store's slices 1-3 after its own rollout (its
	// after-rollout step, 41, applied; lazy intake off, so every reminder
	// has its state row).
	f.ctl("old", "migrate", "--declare-topology", "--after-rollout")
	t0 := time.Now().Add(2 * time.Second) // the fleet starts at t0
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	sleepUntil := func(d time.Duration) { time.Sleep(time.Until(at(d))) }
	var intents []intent
	add := func(release string, batch []intent) {
		f.schedule(release, batch)
		intents = append(intents, batch...)
	}
	add("old", stream("old", 900, at(-5*time.Second), at(45*time.Second)))
	add("old", toCancel("cancel-old", 30, at(20*time.Second), at(45*time.Second)))
	add("old", toCancel("cancel-old2", 30, at(36*time.Second), at(46*time.Second)))
	add("old", toCancel("cancel-new", 30, at(40*time.Second), at(48*time.Second)))

	// The old fleet delivering.
	sleepUntil(0)
	oldDispatcher := f.start("old", "dispatcher", dispatcherArgs...)
	oldSMS := f.start("old", "sms-worker", workerArgs...)
	oldEmail := f.start("old", "email-worker", workerArgs...)
	oldReconciler := f.start("old", "reconciler", reconcilerArgs...)
	sleepUntil(4 * time.Second)
	f.ctl("old", "cancel", "--tenant", "tenant-0", "--key-prefix", "cancel-old-", "--reason", "upgrade test: old nudgectl")

	// 2. This tree's migrations under the running old fleet; intake from
	// both releases' tools onto the new schema.
	sleepUntil(8 * time.Second)
	// The regular migrations after 41 (42, 43) apply; lazy intake
	// on waits for the rollout: the old binaries JOIN reminder_state where a
	// lazy reminder has no row, and its retention relies on the foreign key
	// that the same step drops.
	lazyOn := testenv.LazyIntakeOn(t)
	migrated := f.ctl("new", "migrate", "--declare-topology")
	require.Contains(t, migrated, fmt.Sprintf("applied migrations %v", migrationsSince(t, 41, false)))
	require.Contains(t, migrated, "waiting for the rollout: "+lazyOn.String(), "lazy intake stays off while old binaries run")
	require.Equal(t, 0, count(t, db, `SELECT 1 FROM nudge_lazy_intake WHERE horizon IS NOT NULL`))
	add("new", stream("new", 300, at(10*time.Second), at(45*time.Second)))
	add("old", stream("old-late", 200, at(10*time.Second), at(45*time.Second)))

	// 3. The claimers roll as a group, as docs/deploy.md gives it (both
	// releases' claimers write reminder_state alone, and with lazy intake
	// off every reminder has its state row; the group roll is kept as the
	// documented order). Every old
	// claimer stops as a rollout stops it (SIGTERM, drained), then every
	// new one starts; reminders coming due wait in between. Intake and
	// nudgectl of both releases go on throughout.
	sleepUntil(14 * time.Second)
	for _, p := range []*proc{oldDispatcher, oldSMS, oldEmail, oldReconciler} {
		f.stop(p)
	}
	sleepUntil(16 * time.Second)
	f.start("new", "reconciler", reconcilerArgs...)
	f.start("new", "sms-worker", workerArgs...)
	f.start("new", "email-worker", workerArgs...)
	f.start("new", "dispatcher", dispatcherArgs...)
	sleepUntil(26 * time.Second)
	f.ctl("old", "cancel", "--tenant", "tenant-0", "--key-prefix", "cancel-old2-", "--reason", "upgrade test: old nudgectl, new schema")

	// 4. No component of the old release left (its nudgectl's last cancel
	// is done): the after-rollout step turns lazy intake on (horizon 2 h) and
	// drops reminder_state's foreign key under the running new fleet, which
	// goes on scheduling, canceling and delivering. The old release's intake
	// goes on too (an application not yet relinked): it reads the setting,
	// so both releases' intake leave a reminder due far ahead without its
	// state row, and both releases' cancel materializes it first.
	sleepUntil(28 * time.Second)
	require.Contains(t, f.ctl("new", "migrate", "--after-rollout"), fmt.Sprintf("applied migrations %v", migrationsSince(t, 41, true)))
	require.Equal(t, 1, count(t, db, `SELECT 1 FROM nudge_lazy_intake WHERE horizon = interval '2 hours'`))
	require.Equal(t, 0, count(t, db, `SELECT 1 FROM pg_constraint WHERE conrelid = 'reminder_state'::regclass AND contype = 'f'`))
	require.Equal(t, 1, count(t, db, `SELECT 1 FROM nudge_envelope_limit WHERE max_entries = 200`),
		"envelopes of 200 allowed once no old worker runs")
	add("old", toCancel("far-old", 10, time.Now().Add(3*time.Hour), time.Now().Add(4*time.Hour)))
	add("new", toCancel("far-new", 10, time.Now().Add(3*time.Hour), time.Now().Add(4*time.Hour)))
	require.Equal(t, 20, count(t, db, `SELECT 1 FROM reminders r WHERE r.key LIKE 'far-%' AND r.lazy
		AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)`), "due in 3 h: lazy, no state row")
	// On the test's time scale (the new dispatcher's H is 5 s): reminders
	// scheduled 10 s or more ahead are lazy and come due during the run
	// (those scheduled past due, one in twenty, are not).
	_, err := db.Pool.Exec(ctx, `UPDATE nudge_lazy_intake SET horizon = $1`, lazyHorizon)
	require.NoError(t, err)
	add("old", stream("lazy-old", 60, at(45*time.Second), at(52*time.Second)))
	add("new", stream("lazy-new", 60, at(45*time.Second), at(52*time.Second)))
	add("new", stream("after", 150, at(30*time.Second), at(45*time.Second)))
	add("new", toCancel("cancel-after", 20, at(40*time.Second), at(47*time.Second)))
	sleepUntil(34 * time.Second)
	f.ctl("new", "cancel", "--tenant", "tenant-0", "--key-prefix", "cancel-new-", "--reason", "upgrade test: new nudgectl")
	f.ctl("new", "cancel", "--tenant", "tenant-0", "--key-prefix", "cancel-after-", "--reason", "upgrade test: after the rollout")
	f.ctl("old", "cancel", "--tenant", "tenant-0", "--key-prefix", "far-old-", "--reason", "upgrade test: old nudgectl, lazy")
	f.ctl("new", "cancel", "--tenant", "tenant-0", "--key-prefix", "far-new-", "--reason", "upgrade test: new nudgectl, lazy")

	// 5. The new fleet alone until every reminder is terminal.
	openStates := ops.Filter{States: []reminder.State{reminder.Pending, reminder.Leased, reminder.Enqueued,
		reminder.Sending, reminder.Retrying, reminder.Quarantined}}
	drainBy := at(52 * time.Second).Add(60 * time.Second)
	for {
		page, err := ops.List(ctx, db.Pool, time.Now(), openStates, ops.Page{Size: 5})
		require.NoError(t, err)
		if page.Count.N == 0 {
			break
		}
		if time.Now().After(drainBy) {
			t.Fatalf("%s reminders still open a minute after the last was due, e.g. %+v", page.Count, page.Items)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("%s: every reminder terminal", time.Now().Format("15:04:05.0"))
	for _, p := range f.procs {
		if !p.stopped {
			f.stop(p)
		}
	}

	// What users observe.
	items := listAll(t, db)
	require.Len(t, items, len(intents), "every reminder scheduled is there")
	byKey := map[string]ops.Item{}
	byRecipient := map[string]ops.Item{}
	states := map[reminder.State]int{}
	var open, noReason []string
	for _, it := range items {
		byKey[it.Key], byRecipient[it.Recipient] = it, it
		states[it.State]++
		if !it.State.Terminal() {
			open = append(open, fmt.Sprintf("%d %s %s", it.ID, it.Key, it.State))
		}
		if it.Reason == "" {
			noReason = append(noReason, fmt.Sprintf("%d %s %s", it.ID, it.Key, it.State))
		}
	}
	t.Logf("states: %v", states)
	require.Len(t, byRecipient, len(items), "every reminder has a recipient of its own")
	require.Empty(t, open, "lost: reminders not terminal")
	require.Empty(t, noReason, "terminal without a reason")
	for _, in := range intents {
		if strings.HasPrefix(in.Key, "cancel-") {
			require.Equal(t, reminder.Canceled, byKey[in.Key].State, "%s was canceled before it was due", in.Key)
		}
	}
	require.NotZero(t, states[reminder.Delivered])
	// The lazy streams: every one left without its state row at intake
	// (past the horizon when scheduled), promoted and claimed by the new
	// fleet; the checks below hold for them as for the rest (sent at most
	// once, never after the deadline, delivered exactly when accepted).
	lazyDelivered, wantLazy := 0, 0
	for _, in := range intents {
		if !strings.HasPrefix(in.Key, "lazy-") {
			continue
		}
		if in.DueAt.After(at(40 * time.Second)) {
			wantLazy++
		}
		if byKey[in.Key].State == reminder.Delivered {
			lazyDelivered++
		}
	}
	require.Equal(t, wantLazy, count(t, db, `SELECT 1 FROM reminders WHERE key LIKE 'lazy-%' AND lazy`), "lazy at intake")
	require.Greater(t, lazyDelivered, 60, "lazy reminders of both releases' intake delivered")
	require.NotZero(t, states[reminder.Expired], "some deadlines pass during the run")
	require.NotZero(t, states[reminder.Failed], "the provider refuses some SMS for good")

	// The SMS provider's record: each reminder accepted at most once, never
	// at or after its deadline, and accepted exactly when delivered.
	accepted := map[string]int{}
	var smsProblems []string
	for _, m := range sms.Messages() {
		accepted[m.To]++
		it, ok := byRecipient[m.To]
		switch {
		case !ok:
			smsProblems = append(smsProblems, "accepted for no reminder: "+m.To)
		case !m.AcceptedAt.Before(it.Deadline):
			smsProblems = append(smsProblems, fmt.Sprintf("reminder %d accepted at %s, deadline %s", it.ID, m.AcceptedAt, it.Deadline))
		case it.State != reminder.Delivered:
			smsProblems = append(smsProblems, fmt.Sprintf("reminder %d accepted but %s (%s)", it.ID, it.State, it.Reason))
		}
	}
	var retried int
	for _, a := range sms.Attempts() {
		if a.Status == 429 || a.Status >= 500 {
			retried++
		}
	}
	require.NotZero(t, retried, "the provider made workers retry")

	// Mailpit's record: the same for email. A relay cannot deduplicate, but
	// nothing here kills a worker between the relay's answer and the record.
	mails, err := mail.Messages(ctx)
	require.NoError(t, err)
	received := map[string]int{}
	var emailProblems []string
	for _, m := range mails {
		for _, to := range m.To {
			received[to]++
			it, ok := byRecipient[to]
			switch {
			case !ok:
				emailProblems = append(emailProblems, "received for no reminder: "+to)
			case m.Created.After(it.Deadline.Add(sendTimeout)):
				emailProblems = append(emailProblems, fmt.Sprintf("reminder %d received at %s, deadline %s", it.ID, m.Created, it.Deadline))
			case it.State != reminder.Delivered:
				emailProblems = append(emailProblems, fmt.Sprintf("reminder %d received but %s (%s)", it.ID, it.State, it.Reason))
			}
		}
	}
	for _, it := range items {
		n := accepted[it.Recipient] + received[it.Recipient]
		switch {
		case n > 1:
			smsProblems = append(smsProblems, fmt.Sprintf("reminder %d (%s) sent %d times", it.ID, it.Channel, n))
		case n == 0 && it.State == reminder.Delivered:
			smsProblems = append(smsProblems, fmt.Sprintf("reminder %d (%s) delivered but never received", it.ID, it.Channel))
		}
	}
	require.Empty(t, smsProblems, "SMS and sends by either channel")
	require.Empty(t, emailProblems, "email")

	// Timelines, read through the new nudgectl: a sample of each outcome
	// from each intake batch shows every move once, in order, each one the
	// state machine allows, ending in the row's state.
	ids := sample(items, 2)
	for _, id := range ids {
		checkTimeline(t, f.read("new", "show", "--json", strconv.FormatInt(id, 10)))
	}
	t.Logf("timelines of %d reminders read whole", len(ids))

	// Dead letters: each names a verified reminder, says why, and the
	// reminder has ended.
	for _, ch := range []string{"email", "sms"} {
		var dl struct {
			Messages []ops.DeadLetter `json:"messages"`
		}
		require.NoError(t, json.Unmarshal([]byte(f.ctl("new", "dlq", "list", "--channel", ch, "--json")), &dl))
		for _, m := range dl.Messages {
			explained := m.Verified && m.ReminderID != 0 && m.Reason != "" && m.Row != nil && m.Row.State.Terminal()
			require.True(t, explained, "unexplained dead letter in %s: %+v (row %+v)", ch, m, m.Row)
		}
	}

	// No binary met an SQL error; no old binary logged an error at all.
	var logged []string
	for _, p := range f.procs {
		for _, line := range strings.Split(p.Output(), "\n") {
			if strings.Contains(line, "SQLSTATE") || (p.release == "old" && strings.Contains(strings.ToLower(line), `"level":"error"`)) {
				logged = append(logged, p.release+" "+p.Name+": "+line)
			}
		}
	}
	require.Empty(t, logged, "errors logged during the rollout")
	t.Logf("%d reminders, %d SMS accepted (%d answered 429/5xx), %d emails; %s in all (%s after the builds)",
		len(items), len(sms.Messages()), retried, len(mails), time.Since(began).Round(time.Second), time.Since(t0).Round(time.Second))
}

// deletePlanning deletes the planning queues and exchange that nudgectl
// migrate --declare-topology declares beside the topology, which
// testenv's cleanup does not know.
func deletePlanning(mq *testenv.Broker) {
	conn, err := broker.Dial(mq.URL, "nudge-test-cleanup")
	if err != nil {
		return
	}
	defer conn.Close()
	p := mq.Topology.Planning()
	for _, q := range p.Queues() {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	}
	if ch, err := conn.Channel(); err == nil {
		_ = ch.ExchangeDelete(p.RetryExchange(broker.PlanChannel), false, false)
		_ = ch.Close()
	}
}

// count counts the rows of a query.
func count(t *testing.T, db *testenv.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM (`+sql+`) q`, args...).Scan(&n), sql)
	return n
}

// listAll reads every reminder with this tree's ops.List, a page at a time.
func listAll(t *testing.T, db *testenv.DB) []ops.Item {
	t.Helper()
	var all []ops.Item
	p := ops.Page{Size: ops.MaxPageSize}
	for {
		page, err := ops.List(context.Background(), db.Pool, time.Now(), ops.Filter{}, p)
		require.NoError(t, err)
		all = append(all, page.Items...)
		if page.Next == 0 {
			return all
		}
		p.Before = page.Next
	}
}

// sample picks up to n reminders of each outcome (delivered at the first
// attempt, delivered after retries, expired, failed, canceled) from each
// intake batch (the key's prefix before its number).
func sample(items []ops.Item, n int) []int64 {
	seen := map[string]int{}
	var ids []int64
	for _, it := range items {
		batch := it.Key[:strings.LastIndexByte(it.Key, '-')]
		outcome := string(it.State)
		if it.State == reminder.Delivered && it.Attempts > 1 {
			outcome = "delivered-retried"
		}
		k := batch + "/" + outcome
		if seen[k] < n {
			seen[k]++
			ids = append(ids, it.ID)
		}
	}
	return ids
}

// checkTimeline checks the output of nudgectl show --json.
func checkTimeline(t *testing.T, out string) {
	t.Helper()
	var shown struct {
		Reminder reminder.Reminder `json:"reminder"`
		Events   []reminder.Event  `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &shown), out)
	r := shown.Reminder
	state := reminder.None
	var lastStored int64
	for _, ev := range shown.Events {
		// Writers take their own clocks' time (a reconciler's, read before
		// it waited for the row lock, may precede the event it follows):
		// stored events are in the order of their IDs. A happy-path event
		// folded into the row (schema 30) has none: its place is checked by
		// the chain of states below.
		if ev.ID != 0 {
			require.Greater(t, ev.ID, lastStored, "reminder %d: events in order\n%s", r.ID, out)
			lastStored = ev.ID
		}
		if reminder.IsNote(ev.Code) {
			continue
		}
		require.Equal(t, state, ev.From, "reminder %d: event %d moves from %q, the timeline stood at %q (a move missing or shown twice)\n%s",
			r.ID, ev.ID, ev.From, state, out)
		if ev.Code != "" { // events of schema versions before 9 have none
			ok := slices.ContainsFunc(reminder.Transitions, func(tr reminder.Transition) bool {
				return tr.From == ev.From && tr.To == ev.To && tr.Code == ev.Code
			})
			require.True(t, ok, "reminder %d: event %d (%s → %s, %s) is no transition of pkg/reminder\n%s", r.ID, ev.ID, ev.From, ev.To, ev.Code, out)
		}
		state = ev.To
	}
	require.Equal(t, r.State, state, "reminder %d: the timeline ends where the row stands\n%s", r.ID, out)
}

// migrationsSince is the versions of this tree's migrations past the old
// fleet's schema version that its migrate applies (afterRollout false: the
// regular ones before the first after-rollout one; a regular one after it,
// such as 46 behind 44, waits with it), or that its after-rollout step then
// applies (true: the rest), in order, as schema.Plan splits them.
func migrationsSince(t *testing.T, version int, afterRollout bool) []int {
	t.Helper()
	migs, err := schema.Migrations()
	require.NoError(t, err)
	applied := map[int]bool{}
	for _, m := range migs {
		applied[m.Version] = m.Version <= version
	}
	run, waiting := schema.Plan(migs, applied, false)
	if afterRollout {
		run = waiting
	}
	var vs []int
	for _, m := range run {
		vs = append(vs, m.Version)
	}
	return vs
}
