// Package opstest builds the situations operator tooling is tested against,
// the way the fleet would have left them: reminder rows in any state (as the
// state machine's statements leave them) and dead letters published to a
// channel's dead-letter queue exactly as a worker publishes them (signed
// body, original headers, x-nudge-* explanation), without running a worker.
package opstest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// KeysSpec is the signing-key setting Keys parses, for tests that pass it
// to a command line.
const KeysSpec = "test:0123456789abcdef0123456789abcdef"

// Keys is a keyring for tests.
func Keys(t testing.TB) *message.Keyring {
	t.Helper()
	k, err := message.ParseKeys(KeysSpec)
	require.NoError(t, err)
	return k
}

// Row describes a reminder to insert.
type Row struct {
	Tenant string // default "acme"
	Key    string // required
	// Channel defaults to email (recipient learner@example.com); sms uses +14155550100.
	Channel reminder.Channel
	State   reminder.State // default pending
	Fence   int64
	// Attempts and Republishes set the budgets used.
	Attempts    int
	Republishes int
	DueAt       time.Time // default now − 1 minute
	Deadline    time.Time // default DueAt + 1 day
	// Since is when the row entered its state: enqueued_at, lease_until,
	// next_attempt_at or finished_at as the state implies. Default: now.
	Since time.Time
	// Reason is the row's reason column.
	Reason string
}

// Insert inserts r with a "scheduled" event and returns its id.
func Insert(t testing.TB, db pg.Querier, r Row) int64 {
	t.Helper()
	now := time.Now()
	if r.Tenant == "" {
		r.Tenant = "acme"
	}
	if r.Channel == "" {
		r.Channel = reminder.Email
	}
	if r.State == "" {
		r.State = reminder.Pending
	}
	if r.DueAt.IsZero() {
		r.DueAt = now.Add(-time.Minute)
	}
	if r.Deadline.IsZero() {
		r.Deadline = r.DueAt.Add(24 * time.Hour)
	}
	if r.Since.IsZero() {
		r.Since = now
	}
	recipient := "learner@example.com"
	if r.Channel == reminder.SMS {
		recipient = "+14155550100"
	}
	var since struct{ enqueued, lease, next, finished *time.Time }
	switch r.State {
	case reminder.Enqueued:
		since.enqueued = &r.Since
	case reminder.Leased, reminder.Sending:
		since.lease = &r.Since
	case reminder.Retrying:
		since.next = &r.Since
	case reminder.Delivered, reminder.Failed, reminder.Expired, reminder.Canceled:
		since.finished = &r.Since
	}
	var id int64
	err := db.QueryRow(context.Background(), `
		WITH r AS (
			INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline,
			                       idempotency_key)
			VALUES (@tenant, @key, @channel, @recipient, 'course-expiry', '{"course": "Go 101"}', @due_at, @deadline,
			        nudge_idempotency_key(@tenant, @key))
			RETURNING id, tenant, channel, due_at, deadline
		), st AS (
			-- The state row, as intake writes it (the mirror of schema 32,
			-- while it runs, finds it there and leaves it).
			INSERT INTO reminder_state (id, tenant, channel, state, fence, due_at, deadline, attempts, republishes,
			                            enqueued_at, lease_until, next_attempt_at, finished_at, reason, updated_at)
			SELECT id, tenant, channel, @state, @fence, due_at, deadline, @attempts, @republishes,
			       @enqueued_at, @lease_until, @next_attempt_at, @finished_at, nullif(@reason, ''), @since FROM r
			ON CONFLICT (id) DO NOTHING
		), ev AS (
			INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, reason, at)
			SELECT id, NULL, 'pending', 0, 'opstest', 'scheduled', @since FROM r
		)
		SELECT id FROM r`, pgx.NamedArgs{
		"tenant": r.Tenant, "key": r.Key, "channel": string(r.Channel), "recipient": recipient,
		"due_at": r.DueAt, "deadline": r.Deadline, "state": string(r.State), "fence": r.Fence,
		"attempts": r.Attempts, "republishes": r.Republishes, "enqueued_at": since.enqueued,
		"lease_until": since.lease, "next_attempt_at": since.next, "finished_at": since.finished,
		"reason": r.Reason, "since": r.Since,
	}).Scan(&id)
	require.NoError(t, err, "inserting reminder %s", r.Key)
	return id
}

// DeadLetter describes a message to dead-letter.
type DeadLetter struct {
	Channel reminder.Channel // default email
	// ReminderID and Fence are the message's; zero ReminderID publishes an
	// unsigned, malformed body the way a worker dead-letters what it cannot
	// verify (no x-nudge-reminder-id).
	ReminderID int64
	Fence      int64
	Tenant     string
	Deadline   time.Time
	// Reason is x-nudge-reason; ReceiveCount x-nudge-receive-count (default 1).
	Reason       string
	ReceiveCount int64
	// MessageID defaults to "ID-FENCE" (the dispatcher's) or "dead-N".
	MessageID string
	// Body replaces the body of an unverifiable message.
	Body string
}

// Publish dead-letters msgs, in order, to their channel's dead-letter queue
// through the dead-letter exchange, as internal/worker's deadLetter does,
// and returns their message IDs.
func Publish(t testing.TB, url string, topo broker.Topology, keys *message.Keyring, msgs ...DeadLetter) []string {
	t.Helper()
	pub := broker.NewPublisher(url, topo, "opstest")
	defer pub.Close()
	firstSeen := time.Now().Add(-time.Hour).UTC()
	out := make([]broker.Outgoing, len(msgs))
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		if m.Channel == "" {
			m.Channel = reminder.Email
		}
		if m.ReceiveCount == 0 {
			m.ReceiveCount = 1
		}
		var body []byte
		headers := amqp.Table{}
		if m.ReminderID != 0 {
			env := message.Envelope{ReminderID: m.ReminderID, Fence: m.Fence, IdempotencyKey: "nudge-test",
				Channel: string(m.Channel), Tenant: m.Tenant, Deadline: m.Deadline, Attempt: 0, FirstSeen: firstSeen}
			b, h, err := keys.Seal(env)
			require.NoError(t, err)
			body = b
			for k, v := range h {
				headers[k] = v
			}
			headers["x-nudge-reminder-id"] = strconv.FormatInt(m.ReminderID, 10)
			headers["x-nudge-deadline"] = m.Deadline.UTC().Format(time.RFC3339)
			headers["x-nudge-first-seen"] = firstSeen.Format(time.RFC3339)
			if m.MessageID == "" {
				m.MessageID = fmt.Sprintf("%d-%d", m.ReminderID, m.Fence)
			}
		} else {
			body = []byte(m.Body)
			if m.Body == "" {
				body = []byte(`{"id": "not a number"}`)
			}
			headers["x-nudge-first-seen"] = time.Now().UTC().Format(time.RFC3339)
			if m.MessageID == "" {
				m.MessageID = fmt.Sprintf("dead-%d", i+1)
			}
		}
		headers["x-nudge-reason"] = m.Reason
		headers["x-nudge-receive-count"] = m.ReceiveCount
		ids[i] = m.MessageID
		out[i] = broker.Outgoing{
			Exchange: topo.DeadExchange(), RoutingKey: string(m.Channel),
			Msg: amqp.Publishing{MessageId: m.MessageID, ContentType: "application/json", Headers: headers, Body: body},
		}
	}
	results, err := pub.PublishBatch(context.Background(), out)
	require.NoError(t, err)
	for i, r := range results {
		require.NoError(t, r, "dead-lettering message %d", i)
	}
	return ids
}

// Event is a recorded transition, for assertions.
type Event struct {
	From, To reminder.State
	Fence    int64
	Actor    string
	Reason   string
}

// Events returns the events of reminder id, oldest first: its timeline
// (stored and folded events, schema version 30).
func Events(t testing.TB, db pg.Querier, id int64) []Event {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT coalesce(from_state, ''), to_state, fence, actor, reason
		FROM reminder_timeline WHERE reminder_id = $1 ORDER BY seq`, id)
	require.NoError(t, err)
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.From, &e.To, &e.Fence, &e.Actor, &e.Reason)
		return e, err
	})
	require.NoError(t, err)
	return evs
}

// LastEvent returns the newest event of reminder id.
func LastEvent(t testing.TB, db pg.Querier, id int64) Event {
	t.Helper()
	evs := Events(t, db, id)
	require.NotEmpty(t, evs)
	return evs[len(evs)-1]
}

// State returns reminder id's state, fence and attempts, as operators see
// them: without a state row yet (schema 39) it is pending at fence 0.
func State(t testing.TB, db pg.Querier, id int64) (reminder.State, int64, int) {
	t.Helper()
	var s reminder.State
	var fence int64
	var attempts int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT coalesce(s.state, 'pending'), coalesce(s.fence, 0),
			coalesce(s.attempts, 0)
		  FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id WHERE r.id = $1`, id).
		Scan(&s, &fence, &attempts))
	return s, fence, attempts
}

// QueueIDs reads the message IDs in queue's order without disturbing it
// (an ops.DLQ read, closed at once).
func QueueIDs(t testing.TB, url string, topo broker.Topology, ch reminder.Channel) []string {
	t.Helper()
	r, err := ops.DLQ{URL: url, Topology: topo, Wait: 5 * time.Second}.Read(context.Background(), ch)
	require.NoError(t, err)
	defer r.Close()
	require.False(t, r.Incomplete, "every message arrived")
	ids := make([]string, len(r.Messages))
	for i, m := range r.Messages {
		ids[i] = m.MessageID
	}
	return ids
}

// SharedBuffers runs sql under EXPLAIN (ANALYZE, BUFFERS) on q and returns
// its shared buffers, hit and read: the statements of the functions it calls
// included. What a statement reads, which the machine's load does not move.
func SharedBuffers(tb testing.TB, q pg.Querier, sql string, args ...any) int {
	tb.Helper()
	var raw []byte
	require.NoError(tb, q.QueryRow(context.Background(), `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+sql, args...).Scan(&raw))
	var plan []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	require.NoError(tb, json.Unmarshal(raw, &plan))
	return plan[0].Plan.Hit + plan[0].Plan.Read
}
