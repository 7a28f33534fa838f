package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Inventory: the reminder changes while its message waits, a newer version
// with new content (issue 14): another recipient and other data. The queued
// message of the old content is discarded; the new content is sent once, and
// the old never.
func TestUpdatedWhileQueuedSendsTheNewContentOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t)
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t) // a message for the old content in the queue
	ctx := context.Background()
	c, err := intake.Update(ctx, b.db.Pool, "acme", "k", intake.Content{Recipient: "+14155550199",
		Data: map[string]any{"learner": "Ada", "course": "Go 102"}}, "app", "learner changed number and course")
	require.NoError(t, err)
	require.Equal(t, intake.Change{ID: id, Key: "k", Status: intake.Changed, State: reminder.Pending}, c)
	b.dispatch(t) // a message for the new content

	w2, err := worker.New(worker.Config{Channel: reminder.SMS}, worker.Deps{AMQPURL: b.mq.URL, Topology: b.mq.Topology,
		Store: b.st, Sender: mustSMS(t, b), Keys: b.keys, Clock: b.clock, Log: b.log})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = w2.Run(wctx) }()
	b.waitState(t, id, reminder.Delivered)
	require.Eventually(t, func() bool { return w2.Counts().Duplicates == 1 }, 10*time.Second, 10*time.Millisecond,
		"the old content's message was discarded")
	attempts := b.sms.Attempts()
	require.Len(t, attempts, 1, "one send, of the new content")
	require.Equal(t, "+14155550199", attempts[0].To)
	require.Contains(t, attempts[0].Body, "Hi Ada, your access to Go 102")

	var codes []reminder.Code
	for _, e := range b.events(t, id) {
		codes = append(codes, e.Code)
	}
	require.Equal(t, []reminder.Code{reminder.CodeScheduled, reminder.CodeClaimed, reminder.CodeUpdated,
		reminder.CodeClaimed, reminder.CodeAttemptClaimed, reminder.CodeDelivered}, codes)

	c, err = intake.Update(ctx, b.db.Pool, "acme", "k", intake.Content{Recipient: "+14155550100"}, "app", "too late")
	require.NoError(t, err)
	require.Equal(t, intake.Change{ID: id, Key: "k", Status: intake.AlreadyTerminal, State: reminder.Delivered}, c)
}
