package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Errors reading a dead-letter queue.
var (
	// ErrDLQBusy: another consumer (another operator's nudgectl) is reading
	// the queue. Reads are exclusive so that two of them cannot interleave
	// the messages they return.
	ErrDLQBusy = errors.New("another consumer is reading the dead-letter queue; try again when it is done")
	// ErrDLQTooLarge: the queue holds more messages than DLQ.MaxMessages.
	ErrDLQTooLarge = errors.New("the dead-letter queue holds more messages than one read may hold")
	// ErrDLQMissing: the queue does not exist (wrong --queue-prefix, or no
	// Nudge binary has declared the topology yet).
	ErrDLQMissing = errors.New("the dead-letter queue does not exist")
)

// MaxDLQPage is the most messages one consumer of a read can hold: the AMQP
// prefetch count is 16 bits. A deeper queue is read in several pages (see
// DLQ).
const MaxDLQPage = 65535

// MaxDeadLetterBody bounds the body a read keeps of each message (and shows):
// a real message is far smaller (message.MaxBodyBytes); what is longer is
// junk, kept as its first bytes and its length.
const MaxDeadLetterBody = 16 << 10

// DLQ reads a channel's dead-letter queue without losing, reordering or
// re-counting its messages, and acknowledges only the messages an operator
// decided about.
//
// How (RabbitMQ 3.10 quorum queues, checked by TestDLQReadKeepsOrder): a
// read takes the WHOLE queue with manual acknowledgement and holds every
// message until it is done, then returns them all unacknowledged, in the
// order they came. Returned messages go to the back of the queue's
// "returned" list, which is served before messages never delivered, in the
// order they were returned. Returning the whole queue therefore keeps its
// order; returning only a prefix (a read in pages that gave each page back
// before taking the next, or the management UI's "get N") moves that prefix
// behind the rest (TestQuorumQueueReturnsMovePrefixBehind).
//
// A read holds the queue in pages of PageSize messages, one exclusive
// consumer each on the same channel (exclusive also keeps a second
// nudgectl out): once a page's consumer holds its prefetch, it is
// cancelled, keeping its messages, and the next page's consumer receives the
// messages after them. Close gives the pages back one after the other, each
// in order (TestDLQReadPagesKeepOrder). One gap remains: between one
// page's cancel and the next page's consume (a round trip), a second
// reader that starts at that moment can take the queue. This read then
// fails busy and gives its pages back, which the other reads after the
// rest: nothing is lost or decided twice, but the queue's order is rotated
// by those pages.
// Each read raises every message's x-delivery-count by one (the
// dead-letter queues have no delivery limit, so nothing is dropped); the
// receive count shown is the worker's own x-nudge-receive-count, which
// reads do not change, and Reads shows x-delivery-count for what it is.
type DLQ struct {
	// URL is the broker.
	URL string
	// Topology names the queues (its prefix must be the fleet's).
	Topology broker.Topology
	// Keys, when set, verify message bodies, so that a message the broker
	// dead-lettered itself (delivery_limit, no x-nudge headers) can name its
	// reminder. Nil: only the worker's x-nudge-reminder-id header names one.
	Keys *message.Keyring
	// MaxMessages refuses a queue deeper than this, which bounds a read's
	// memory; the dead-letter queues hold at most Topology.DeadMaxLength
	// messages. Zero value: twice Topology.DeadMaxLength.
	MaxMessages int
	// PageSize is how many messages each of the read's consumers holds
	// (its prefetch). Zero value: MaxDLQPage; at most MaxDLQPage. Tests
	// lower it to read a deep queue without 65,535 messages.
	PageSize int
	// Wait bounds how long a read waits for the messages the queue said it
	// holds. Zero value: 10 seconds.
	Wait time.Duration
	// Settle is how long the queue must stay quiet, once the announced
	// depth was read, before a read is complete: messages another reader
	// just gave back may still be on their way (returns are asynchronous).
	// Zero value: 200 milliseconds.
	Settle time.Duration
}

// DeadLetter is one message of a dead-letter queue as read, with the row of
// the reminder it names (after DLQRead.LoadRows).
type DeadLetter struct {
	// Position is the message's place in the queue, from 1 at the head.
	Position  int    `json:"position"`
	MessageID string `json:"message_id"`
	// ReminderID is the reminder the message names (0: none).
	ReminderID int64 `json:"reminder_id,omitempty"`
	// Verified: ReminderID comes from a body whose signature verifies
	// against DLQ.Keys. Headers are outside the MAC: an ID taken from the
	// x-nudge-reminder-id header or an unsigned body is shown, never
	// acted on: such a message can only be dropped (dlq expire).
	Verified bool `json:"verified"`
	// Tenant and Fence come from the body (Tenant from the row when loaded).
	Tenant string `json:"tenant,omitempty"`
	Fence  int64  `json:"fence,omitempty"`
	// Reason is the worker's x-nudge-reason, or the broker's own reason
	// ("broker: delivery_limit from nudge.email") for a message it
	// dead-lettered itself.
	Reason string `json:"reason"`
	// ReceiveCount is how many times the work queue delivered the message
	// before it was dead-lettered (x-nudge-receive-count; 0: unknown).
	ReceiveCount int64      `json:"receive_count"`
	FirstSeen    *time.Time `json:"first_seen,omitempty"`
	// Deadline is the message's own; the row's (Row.Deadline) is authoritative.
	Deadline *time.Time `json:"deadline,omitempty"`
	// Reads counts earlier deliveries from the dead-letter queue itself
	// (x-delivery-count): every read that returned it, nudgectl's included.
	Reads int64 `json:"reads"`
	// Headers and Body are the message as stored; Body at most its first
	// MaxDeadLetterBody bytes, of BodyBytes.
	Headers   amqp.Table `json:"headers"`
	Body      string     `json:"body"`
	BodyBytes int        `json:"body_bytes"`
	// Row is the reminder's current row (nil: not loaded, or none).
	Row *DeadLetterRow `json:"row,omitempty"`

	tag   uint64
	page  int // of the read, from 1: the consumer that received it
	acked bool
}

// BodyTruncated reports whether Body holds only the start of the body.
func (m *DeadLetter) BodyTruncated() bool { return len(m.Body) < m.BodyBytes }

// DeadLetterRow is the part of a reminder row an operator decides on.
type DeadLetterRow struct {
	ID       int64            `json:"id"`
	Tenant   string           `json:"tenant"`
	Channel  reminder.Channel `json:"channel"`
	State    reminder.State   `json:"state"`
	Fence    int64            `json:"fence"`
	Deadline time.Time        `json:"deadline"`
	Attempts int              `json:"attempts"`
	Purged   bool             `json:"purged"`
	Reason   string           `json:"reason,omitempty"`
}

// TimeLeft is the time from now to the reminder's deadline (the row's when
// loaded, else the message's), and whether a deadline is known.
func (m *DeadLetter) TimeLeft(now time.Time) (time.Duration, bool) {
	switch {
	case m.Row != nil:
		return m.Row.Deadline.Sub(now), true
	case m.Deadline != nil:
		return m.Deadline.Sub(now), true
	}
	return 0, false
}

// DLQRead is one exclusive read of a dead-letter queue: it holds every
// message unacknowledged until Close returns them (all but those a decision
// acknowledged) in their order.
type DLQRead struct {
	Channel reminder.Channel
	Queue   string
	// Depth is how many messages the queue said it held when the read began.
	Depth int
	// Messages in queue order.
	Messages []*DeadLetter
	// Incomplete: fewer than Depth messages arrived within DLQ.Wait.
	Incomplete bool

	conn  *amqp.Connection
	ch    *amqp.Channel
	acked int
	pages int // consumers started, one a page
}

// Read consumes every message of channel's dead-letter queue and holds them
// until Close. The caller must Close it.
func (d DLQ) Read(ctx context.Context, channel reminder.Channel) (*DLQRead, error) {
	if !channel.Valid() {
		return nil, fmt.Errorf(`--channel %q: want "email", "sms" or "webhook"`, channel)
	}
	topo := d.Topology.WithDefaults()
	maxMsgs := d.MaxMessages
	if maxMsgs <= 0 {
		maxMsgs = 2 * topo.DeadMaxLength
	}
	page := d.PageSize
	if page <= 0 || page > MaxDLQPage {
		page = MaxDLQPage
	}
	wait := d.Wait
	if wait <= 0 {
		wait = 10 * time.Second
	}
	settle := d.Settle
	if settle <= 0 {
		settle = 200 * time.Millisecond
	}
	r := &DLQRead{Channel: channel, Queue: topo.DeadQueue(string(channel))}
	conn, err := broker.Dial(d.URL, "nudgectl-dlq")
	if err != nil {
		return nil, err
	}
	r.conn = conn
	ch, err := conn.Channel()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("opening a channel: %w", err)
	}
	r.ch = ch
	// A reader that just finished (this operator's previous command) leaves
	// its consumer registered for a moment after its connection closed: give
	// it a few seconds before calling the queue busy.
	var q amqp.Queue
	for busyUntil := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		q, err = ch.QueueDeclarePassive(r.Queue, true, false, false, false, nil)
		if err != nil || q.Consumers == 0 || time.Now().After(busyUntil) {
			break
		}
	}
	if err != nil {
		r.Close()
		if isAMQPCode(err, amqp.NotFound) {
			return nil, fmt.Errorf("%w: %s", ErrDLQMissing, r.Queue)
		}
		return nil, fmt.Errorf("inspecting %s: %w", r.Queue, err)
	}
	r.Depth = q.Messages
	if q.Consumers > 0 {
		r.Close()
		return nil, fmt.Errorf("%w (%s has %d consumers)", ErrDLQBusy, r.Queue, q.Consumers)
	}
	if r.Depth > maxMsgs {
		r.Close()
		return nil, fmt.Errorf("%w: %s holds %d, the limit is %d (--max-messages; reading part of a quorum queue reorders it)",
			ErrDLQTooLarge, r.Queue, r.Depth, maxMsgs)
	}
	// The prefetch is the page, not the depth: messages another reader just
	// gave back may still be on their way into the queue (returns are
	// asynchronous), and they must be read too.
	if err := ch.Qos(page, 0, false); err != nil {
		r.Close()
		return nil, fmt.Errorf("setting prefetch: %w", err)
	}
	deliveries, err := r.consumePage()
	if err != nil {
		r.Close()
		return nil, err
	}
	// Read the depth announced, then until the queue stays quiet for the
	// settle time.
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	quiet := time.NewTimer(settle)
	defer quiet.Stop()
	for {
		select {
		case dv, ok := <-deliveries:
			if !ok {
				r.Close()
				return nil, fmt.Errorf("reading %s: the broker closed the channel", r.Queue)
			}
			m := d.parse(dv, len(r.Messages)+1)
			m.page = r.pages
			r.Messages = append(r.Messages, m)
			if len(r.Messages) > maxMsgs {
				// It grew past the limit while being read. What grew is
				// new dead letters, behind everything read so far, so
				// giving back what was read keeps the order.
				r.Close()
				return nil, fmt.Errorf("%w: %s grew past %d while being read", ErrDLQTooLarge, r.Queue, maxMsgs)
			}
			if len(r.Messages) == r.pages*page {
				// This page's consumer is full: the next one takes the
				// messages after it.
				if deliveries, err = r.consumePage(); err != nil {
					r.Close()
					return nil, err
				}
			}
			quiet.Reset(settle)
		case <-quiet.C:
			if len(r.Messages) >= r.Depth {
				return r, nil
			}
			quiet.Reset(settle)
		case <-deadline.C:
			r.Incomplete = len(r.Messages) < r.Depth
			return r, nil
		case <-ctx.Done():
			r.Close()
			return nil, ctx.Err()
		}
	}
}

// consumePage starts the read's next page: it stops the consumer of the
// previous page, which keeps holding its messages, and starts an exclusive
// consumer (prefetch: the page size) that receives the messages after them.
func (r *DLQRead) consumePage() (<-chan amqp.Delivery, error) {
	if r.pages > 0 {
		if err := r.ch.Cancel(r.consumerTag(), false); err != nil {
			return nil, fmt.Errorf("reading %s past its first %d messages: %w", r.Queue, len(r.Messages), err)
		}
	}
	r.pages++
	deliveries, err := r.ch.Consume(r.Queue, r.consumerTag(), false, true, false, false, nil)
	if isAMQPCode(err, amqp.AccessRefused) || isAMQPCode(err, amqp.ResourceLocked) {
		return nil, fmt.Errorf("%w (%s)", ErrDLQBusy, r.Queue)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", r.Queue, err)
	}
	return deliveries, nil
}

func (r *DLQRead) consumerTag() string { return fmt.Sprintf("nudgectl-dlq-read-%d", r.pages) }

func isAMQPCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}

func (d DLQ) parse(dv amqp.Delivery, pos int) *DeadLetter {
	m := &DeadLetter{
		Position: pos, MessageID: dv.MessageId, Headers: dv.Headers, tag: dv.DeliveryTag,
		Body: string(dv.Body[:min(len(dv.Body), MaxDeadLetterBody)]), BodyBytes: len(dv.Body),
		Reason: headerString(dv.Headers, message.HeaderReason), ReceiveCount: headerInt(dv.Headers, message.HeaderReceiveCount),
		Reads: headerInt(dv.Headers, "x-delivery-count"),
	}
	if m.Reason == "" {
		if r := headerString(dv.Headers, "x-first-death-reason"); r != "" {
			m.Reason = "broker: " + r
			if q := headerString(dv.Headers, "x-first-death-queue"); q != "" {
				m.Reason += " from " + q
			}
		}
	}
	m.FirstSeen = headerTime(dv.Headers, message.HeaderFirstSeen)
	m.Deadline = headerTime(dv.Headers, message.HeaderDeadline)
	var env message.Envelope
	_ = json.Unmarshal(dv.Body, &env) // a hint only, unless it verifies
	m.Tenant, m.Fence = env.Tenant, env.Fence
	if m.FirstSeen == nil && !env.FirstSeen.IsZero() {
		m.FirstSeen = &env.FirstSeen
	}
	if m.Deadline == nil && !env.Deadline.IsZero() {
		m.Deadline = &env.Deadline
	}
	hdrID, _ := strconv.ParseInt(headerString(dv.Headers, message.HeaderReminderID), 10, 64)
	var verified *message.Envelope
	if d.Keys != nil {
		if e, err := d.Keys.Open(dv.Body, dv.Headers); err == nil {
			verified = &e
		}
	}
	switch {
	case verified != nil:
		// Only the MAC vouches for a reminder: headers are whatever the last
		// publisher put there, so a signed body wins over every one of them.
		m.ReminderID, m.Verified = verified.ReminderID, true
		m.Deadline, m.FirstSeen = &verified.Deadline, &verified.FirstSeen
	case hdrID > 0:
		m.ReminderID = hdrID // shown, never acted on
	case env.ReminderID > 0:
		m.ReminderID = env.ReminderID
	}
	return m
}

func headerString(h amqp.Table, k string) string {
	switch v := h[k].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

func headerInt(h amqp.Table, k string) int64 {
	switch v := h[k].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	case int16:
		return int64(v)
	case int8:
		return int64(v)
	case int:
		return int64(v)
	case uint8:
		return int64(v)
	case uint16:
		return int64(v)
	case uint32:
		return int64(v)
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}

func headerTime(h amqp.Table, k string) *time.Time {
	switch v := h[k].(type) {
	case time.Time:
		return &v
	case string:
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			return &t
		}
	}
	return nil
}

// LoadRows reads the rows of the reminders the messages name, in one query.
func (r *DLQRead) LoadRows(ctx context.Context, q pg.Querier) error {
	var ids []int64
	for _, m := range r.Messages {
		if m.ReminderID > 0 {
			ids = append(ids, m.ReminderID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, query("DeadLetterRows"), pgx.NamedArgs{"ids": ids})
	if err != nil {
		return fmt.Errorf("reading the reminders of dead letters: %w", err)
	}
	byID := map[int64]*DeadLetterRow{}
	var row DeadLetterRow
	_, err = pgx.ForEachRow(rows, []any{&row.ID, &row.Tenant, &row.Channel, &row.State, &row.Fence,
		&row.Deadline, &row.Attempts, &row.Purged, &row.Reason}, func() error {
		c := row
		byID[c.ID] = &c
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the reminders of dead letters: %w", err)
	}
	for _, m := range r.Messages {
		m.Row = byID[m.ReminderID]
		if m.Row != nil {
			m.Tenant = m.Row.Tenant
		}
	}
	return nil
}

// ack acknowledges msgs, then makes a synchronous call on the same channel
// so the broker has processed every ack before the channel closes (acks are
// asynchronous; closing at once can return an acked message).
func (r *DLQRead) ack(msgs []*DeadLetter) error {
	if len(msgs) == 0 {
		return nil
	}
	if r.ch == nil {
		return errors.New("the dead-letter read is closed")
	}
	for _, m := range msgs {
		if err := r.ch.Ack(m.tag, false); err != nil {
			return fmt.Errorf("acknowledging message %s: %w", m.MessageID, err)
		}
		m.acked = true
		r.acked++
	}
	if _, err := r.ch.QueueDeclarePassive(r.Queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("settling acknowledgements on %s: %w", r.Queue, err)
	}
	return nil
}

// Close returns every message not acknowledged to the queue, in order, and
// disconnects once the broker counts them as ready again (returns are
// processed asynchronously: without the wait, a command run right after
// could find the queue short). It is safe to call more than once.
func (r *DLQRead) Close() error {
	var err error
	if r.ch != nil {
		if r.pages > 1 {
			// Closing the channel would return every page at once, in an
			// order of the broker's choosing: stop the last consumer (or it
			// would take back what is returned), then give the pages back
			// one after the other, each with one multiple nack naming its
			// last message still held (the channel sends them in order).
			err = r.ch.Cancel(r.consumerTag(), false)
			for _, tag := range r.lastHeld() {
				if err == nil && tag > 0 {
					err = r.ch.Nack(tag, true, true)
				}
			}
		}
		if cerr := r.ch.Close(); err == nil {
			err = cerr
		}
		r.ch = nil
		if held := len(r.Messages) - r.acked; held > 0 && err == nil && r.conn != nil && !r.conn.IsClosed() {
			r.awaitReturns(held)
		}
	}
	if r.conn != nil {
		if cerr := r.conn.Close(); err == nil && !errors.Is(cerr, amqp.ErrClosed) {
			err = cerr
		}
		r.conn = nil
	}
	if errors.Is(err, amqp.ErrClosed) {
		err = nil
	}
	return err
}

// lastHeld returns, for each page in order, the delivery tag of its last
// message still held (not acknowledged), or 0.
func (r *DLQRead) lastHeld() []uint64 {
	last := make([]uint64, r.pages)
	for _, m := range r.Messages {
		if !m.acked {
			last[m.page-1] = max(last[m.page-1], m.tag)
		}
	}
	return last
}

// awaitReturns polls the queue's ready count until it holds at least the
// held messages again, for up to 5 seconds.
func (r *DLQRead) awaitReturns(held int) {
	ch, err := r.conn.Channel()
	if err != nil {
		return
	}
	defer ch.Close()
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(5 * time.Millisecond) {
		q, err := ch.QueueDeclarePassive(r.Queue, true, false, false, false, nil)
		if err != nil || q.Messages >= held {
			return
		}
	}
}

// Find returns the messages naming reminder id, with message ID msgID, or
// at position pos (each ignored when zero or empty).
func (r *DLQRead) Find(id int64, msgID string, pos int) []*DeadLetter {
	var out []*DeadLetter
	for _, m := range r.Messages {
		if (id != 0 && m.ReminderID == id) || (msgID != "" && m.MessageID == msgID) || (pos != 0 && m.Position == pos) {
			out = append(out, m)
		}
	}
	return out
}
