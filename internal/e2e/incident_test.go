package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// buggyAdapter panics on some recipients until the fix is "deployed".
type buggyAdapter struct {
	provider.Sender
	fixed   atomic.Bool
	victims map[string]bool
}

func (b *buggyAdapter) Send(ctx context.Context, m provider.Message) (string, error) {
	if !b.fixed.Load() && b.victims[m.Recipient] {
		panic("runtime error: index out of range [2] with length 2")
	}
	return b.Sender.Send(ctx, m)
}

// TestIncidentOperatorSession drives a real incident to its end with
// nudgectl, as the on-call operator would: the workers were down so work
// aged; when they came back, a bug in the SMS adapter quarantined a batch;
// stats shows it, dlq list explains it, replay (dry run first) sends what
// still has time once the fix is out, expire ends the rest; every decision
// leaves an audit trail and nothing is sent twice.
func TestIncidentOperatorSession(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	ctx := context.Background()
	now := time.Now()
	victims := map[string]bool{}
	var reqs []intake.Request
	for i := range 60 {
		r := intake.Request{Tenant: "acme", Key: fmt.Sprint("renewal-", i), Channel: reminder.SMS,
			Recipient: fmt.Sprintf("+1415555%04d", i), Template: "subscription-renewal",
			DueAt: now.Add(-time.Minute), Deadline: now.Add(time.Hour)}
		if i%10 == 0 { // six reminders meet the bug
			victims[r.Recipient] = true
			if i >= 40 { // two of them are close to their deadline
				r.Deadline = now.Add(3 * time.Minute)
			}
		}
		reqs = append(reqs, r)
	}
	out, err := intake.ScheduleMany(ctx, f.db.Pool, reqs)
	require.NoError(t, err)
	for _, o := range out {
		require.NoError(t, o.Err)
	}
	// The dispatcher ran half a minute ago, and no worker has run since.
	// (Its clock is set back, rather than the test sleeping until the
	// enqueued work has aged.)
	earlier := f.dispatcher("dispatcher")
	earlier.Clock = clock.NewShifted(-30 * time.Second)
	_, err = earlier.RunOnce(ctx)
	require.NoError(t, err)

	operator := func(args ...string) (string, error) {
		cmd := ctl.Command()
		config.BindEnv(cmd)
		var stdout, stderr bytes.Buffer
		cmd.SetOut(&stdout)
		cmd.SetErr(&stderr)
		cmd.SetIn(strings.NewReader(""))
		full := append(args, "--database-url", f.db.URL)
		if args[0] == "dlq" || args[0] == "stats" {
			full = append(full, "--amqp-url", f.mq.URL, "--queue-prefix", f.mq.Topology.Prefix)
		}
		if args[0] == "dlq" {
			full = append(full, "--signing-keys", signingKeys)
		}
		cmd.SetArgs(full)
		err := cmd.Execute()
		return stdout.String() + stderr.String(), err
	}

	// 1. The workers are down: stats shows the work aging in the queue.
	// (stats exits 6 when an answer is over objective: still an answer.)
	answered := func(err error) bool { c := ctl.ExitCode(err); return c == ctl.ExitOK || c == ctl.ExitUnhealthy }
	res, err := operator("stats", "--json")
	require.True(t, answered(err), "%v: %s", err, res)
	var stats ops.Report
	require.NoError(t, json.Unmarshal([]byte(res), &stats), res)
	require.EqualValues(t, 60, stats.ByChannel["sms"]["enqueued"])
	require.NotNil(t, stats.OldestEnqueuedAgeSeconds)
	require.GreaterOrEqual(t, *stats.OldestEnqueuedAgeSeconds, 30.0, "the oldest enqueued reminder is aging")

	// 2. The workers come back with the adapter bug.
	hs := httptest.NewServer(f.smsSrv)
	t.Cleanup(hs.Close)
	client, err := sms.New(sms.Config{URL: hs.URL})
	require.NoError(t, err)
	adapter := &buggyAdapter{Sender: client, victims: victims}
	w, err := worker.New(worker.Config{Channel: reminder.SMS, Name: "sms-incident"}, worker.Deps{AMQPURL: f.mq.URL,
		Topology: f.mq.Topology, Store: f.store, Sender: adapter, Keys: f.keys, Clock: clock.Real{}, Log: f.log})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()
	require.Eventually(t, func() bool {
		return countState(t, f, reminder.Delivered) == 54 && countState(t, f, reminder.Quarantined) == 6
	}, 30*time.Second, 50*time.Millisecond)

	// 3. stats names the problem; dlq list explains it. (The rows turn
	// quarantined just before their messages reach the dead-letter queue.)
	require.Eventually(t, func() bool {
		res, err = operator("stats", "--json")
		require.True(t, answered(err), "%v: %s", err, res)
		require.NoError(t, json.Unmarshal([]byte(res), &stats))
		return stats.DeadLetters["sms"] == 6
	}, 10*time.Second, 100*time.Millisecond, "dead letters: %v", stats.DeadLetters)
	require.EqualValues(t, 6, stats.ByChannel["sms"]["quarantined"])
	res, err = operator("dlq", "list", "--channel", "sms")
	require.NoError(t, err, res)
	require.Equal(t, 6, strings.Count(res, "panicked"), res)

	// 4. The fix is deployed; a dry run first, then the replay.
	adapter.fixed.Store(true)
	res, err = operator("dlq", "replay", "--channel", "sms", "--all", "--attempts", "reset",
		"--reason", "adapter fix 1.4.2 deployed", "--actor", "alice", "--dry-run")
	require.NoError(t, err, res)
	require.Contains(t, res, "replay 4")
	require.Contains(t, res, "refused: deadline 2")
	require.EqualValues(t, 6, countState(t, f, reminder.Quarantined), "a dry run changes nothing")

	res, err = operator("dlq", "replay", "--channel", "sms", "--all", "--attempts", "reset",
		"--reason", "adapter fix 1.4.2 deployed", "--actor", "alice")
	require.NoError(t, err, res)
	_, err = f.dispatcher("dispatcher").RunOnce(ctx) // the next CronJob run
	require.NoError(t, err)
	require.Eventually(t, func() bool { return countState(t, f, reminder.Delivered) == 58 }, 30*time.Second, 50*time.Millisecond)

	// 5. What has no time left is ended, on the record.
	res, err = operator("dlq", "expire", "--channel", "sms", "--all", "--reason", "too close to the renewal deadline",
		"--actor", "alice")
	require.NoError(t, err, res)
	require.EqualValues(t, 2, countState(t, f, reminder.Expired))

	// Running the replay again sends nothing twice.
	res, err = operator("dlq", "replay", "--channel", "sms", "--all", "--attempts", "reset", "--reason", "again", "--actor", "alice")
	require.NoError(t, err, res)
	res, err = operator("replay", "--from", "now-2h", "--to", "now", "--reason", "belt and braces", "--actor", "alice",
		"--attempts", "keep")
	require.NoError(t, err, res)

	// Final states, the audit trail, and what the provider received.
	require.EqualValues(t, 58, countState(t, f, reminder.Delivered))
	require.EqualValues(t, 2, countState(t, f, reminder.Expired))
	var aliceEvents, audits int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_events WHERE actor = 'alice'`).Scan(&aliceEvents))
	require.Equal(t, 6, aliceEvents, "four replays and two expiries, each an event by the operator")
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM operator_audit WHERE actor = 'alice'`).Scan(&audits))
	require.Equal(t, 6, audits)
	require.Len(t, f.smsSrv.Messages(), 58)
	for _, a := range f.smsSrv.Attempts() {
		require.False(t, a.Duplicate, "nothing was sent twice")
	}
	require.Len(t, f.smsSrv.Attempts(), 58)
}

func countState(t *testing.T, f *fleet, st reminder.State) int64 {
	t.Helper()
	var n int64
	require.NoError(t, f.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM reminder_state WHERE state = $1`, st).Scan(&n))
	return n
}
