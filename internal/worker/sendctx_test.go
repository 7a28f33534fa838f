package worker

import (
	"context"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fakesms"
	smsapi "github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/pkg/reminder"
)

type ctxKey struct{}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitClosed waits for ch to close, failing the test after a few seconds.
func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: Done not closed", what)
	}
}

// interrupts counts Interrupt calls (a provider.Interrupter).
type interrupts struct{ n atomic.Int32 }

func (i *interrupts) Interrupt() { i.n.Add(1) }

func TestSendCtxSemantics(t *testing.T) {
	t.Parallel()
	const ahead = time.Hour
	cases := []struct {
		name string
		// deadline is from now; cancel cancels the batch context, after
		// Done was first called when doneFirst.
		deadline  time.Duration
		cancel    bool
		doneFirst bool
		wantErr   error
	}{
		{name: "running", deadline: ahead},
		{name: "running, Done called", deadline: ahead, doneFirst: true},
		{name: "deadline passed, Err only", deadline: -time.Millisecond, wantErr: context.DeadlineExceeded},
		{name: "deadline passed, Done first", deadline: -time.Millisecond, doneFirst: true, wantErr: context.DeadlineExceeded},
		{name: "deadline passes while Done waits", deadline: 20 * time.Millisecond, doneFirst: true, wantErr: context.DeadlineExceeded},
		{name: "batch canceled, Done after", deadline: ahead, cancel: true, wantErr: context.Canceled},
		{name: "batch canceled, Done before", deadline: ahead, cancel: true, doneFirst: true, wantErr: context.Canceled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "batch"))
			defer cancel()
			watch := newSendWatch(parent)
			defer watch.close()
			var c sendCtx
			deadline := time.Now().Add(tc.deadline)
			c.start(parent, watch, deadline)

			got, ok := c.Deadline()
			require.True(t, ok)
			require.Equal(t, deadline, got)
			require.Equal(t, "batch", c.Value(ctxKey{}), "Value is the batch context's")
			require.Nil(t, c.Value("other"))

			var done <-chan struct{}
			if tc.doneFirst {
				done = c.Done()
			}
			if tc.cancel {
				cancel()
			}
			if tc.wantErr == nil {
				require.NoError(t, c.Err())
				if done != nil {
					require.False(t, closed(done), "Done stays open")
				}
			} else {
				if done != nil {
					waitClosed(t, done, tc.name) // by the timer or the watch
				}
				require.ErrorIs(t, c.Err(), tc.wantErr)
				waitClosed(t, c.Done(), tc.name)
			}
			if !tc.doneFirst && tc.wantErr == nil {
				require.Nil(t, c.timer, "no timer armed: nobody called Done")
			}

			c.release()
			if tc.wantErr != nil {
				require.ErrorIs(t, c.Err(), tc.wantErr, "the first error stays")
			} else {
				require.ErrorIs(t, c.Err(), context.Canceled, "released as a cancel would")
				cancel()
			}
			watch.mu.Lock()
			require.Nil(t, watch.head, "the context left the watch")
			watch.mu.Unlock()
		})
	}
}

// WatchCancel interrupts on the batch's cancellation, not at the deadline,
// and arms no timer; StopWatching undoes it.
func TestSendCtxWatchCancel(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name            string
		deadline        time.Duration
		cancel          bool
		wantInterrupted int32
		wantStopped     bool
	}{
		{name: "returned in time", deadline: time.Hour, wantStopped: true},
		{name: "batch canceled", deadline: time.Hour, cancel: true, wantInterrupted: 1},
		{name: "deadline passed: the caller's connection deadline cuts it", deadline: -time.Millisecond, wantStopped: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			watch := newSendWatch(parent)
			defer watch.close()
			var c sendCtx
			c.start(parent, watch, time.Now().Add(tc.deadline))
			var r interrupts
			c.WatchCancel(&r)
			require.Nil(t, c.timer, "no timer armed")
			if tc.cancel {
				cancel()
				require.Eventually(t, func() bool { return r.n.Load() == 1 }, 5*time.Second, time.Millisecond)
				require.ErrorIs(t, c.Err(), context.Canceled)
			}
			require.Equal(t, tc.wantStopped, c.StopWatching())
			c.release()
			cancel()
			require.Equal(t, tc.wantInterrupted, r.n.Load())
		})
	}

	// Watching a context whose batch already ended interrupts at once.
	parent, cancel := context.WithCancel(context.Background())
	watch := newSendWatch(parent)
	defer watch.close()
	var c sendCtx
	c.start(parent, watch, time.Now().Add(time.Hour))
	cancel()
	var r interrupts
	c.WatchCancel(&r)
	require.Equal(t, int32(1), r.n.Load())
	require.False(t, c.StopWatching())
}

// Contexts derived from a sendCtx (an adapter's own timeout, an
// AfterFunc) end with it.
func TestSendCtxChildrenEndWithIt(t *testing.T) {
	t.Parallel()
	parent, cancel := context.WithCancel(context.Background())
	watch := newSendWatch(parent)
	defer watch.close()
	var c sendCtx
	c.start(parent, watch, time.Now().Add(time.Hour))
	child, stopChild := context.WithTimeout(&c, time.Hour)
	defer stopChild()
	ran := make(chan struct{})
	context.AfterFunc(&c, func() { close(ran) })
	stopped := context.AfterFunc(&c, func() { t.Error("a stopped AfterFunc ran") })
	require.True(t, stopped())
	cancel()
	waitClosed(t, child.Done(), "child")
	require.ErrorIs(t, child.Err(), context.Canceled)
	waitClosed(t, ran, "AfterFunc")
	c.release()
}

// sendCtxWorker is a worker that sends through the Twilio client to the
// fake SMS provider, on a fake clock nobody moves.
func sendCtxWorker(t *testing.T, cfg Config, fake *fakesms.Server) *Worker {
	t.Helper()
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	t.Cleanup(fake.Close)
	c, err := smsapi.NewTwilio(smsapi.TwilioConfig{URL: srv.URL, AccountSID: "AC00000000000000000000000000000sc1",
		AuthToken: "token", From: "+15005550006", Timeout: time.Minute})
	require.NoError(t, err)
	cfg.Channel = reminder.SMS
	w, err := New(cfg, Deps{Topology: topo, Clock: clock.NewFake(t0), Log: zerolog.Nop(), Sender: c,
		Rand: func() float64 { return 0 }})
	require.NoError(t, err)
	return w
}

func sendCtxItem(id int64, key string) *item {
	it := claimedItem(id, at(time.Hour))
	it.row.Recipient, it.row.Template, it.row.IdempotencyKey = "+15555550100", "course-expiry", key
	it.row.Data = map[string]any{"course": "Go 101"}
	return it
}

// A send on a pooled connection arms no timer: the direct client enforces
// the deadline on its connection. (The first send dials, and the dialer
// waits on Done.)
func TestSendThroughTheDirectClientArmsNoTimer(t *testing.T) {
	t.Parallel()
	w := sendCtxWorker(t, Config{SendTimeout: 10 * time.Second}, fakesms.New())
	for i, key := range []string{"sendctx-dial", "sendctx-pooled"} {
		it := sendCtxItem(int64(i+1), key)
		w.send(t.Context(), it)
		require.Equal(t, reminder.Delivered, it.out.State(), it.out.Reason)
		if i == 1 {
			require.Nil(t, it.sctx.timer, "no timer armed")
		}
	}
}

// Shutdown: when the batch context is canceled (the grace period ran out)
// the send in flight is cut at once, not at its send timeout.
func TestShutdownCancelsAnInFlightSend(t *testing.T) {
	t.Parallel()
	fake := fakesms.New(fakesms.WithConfig(fakesms.Config{Delay: time.Minute}))
	w := sendCtxWorker(t, Config{SendTimeout: time.Minute}, fake)
	it := sendCtxItem(2, "sendctx-shutdown")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.send(ctx, it)
	}()
	require.Eventually(t, func() bool { return fake.Stats().Attempts == 1 }, 5*time.Second, time.Millisecond,
		"the request reached the provider")
	start := time.Now()
	cancel()
	waitClosed(t, done, "send")
	require.Less(t, time.Since(start), 5*time.Second)
	require.Equal(t, "canceled", it.code, it.out.Reason)
	require.Equal(t, reminder.OutcomeUnknown, it.out.Attempt, "it may have been accepted")
	require.Eventually(t, func() bool { return fake.Stats().ClientGone == 1 }, 5*time.Second, time.Millisecond,
		"the provider saw the client go")
	require.Zero(t, fake.Stats().Accepted)
}

// A send that outlives its deadline (here the send timeout) is aborted at
// the provider, and retried as a timeout.
func TestSendPastItsDeadlineIsAbortedAtTheProvider(t *testing.T) {
	t.Parallel()
	fake := fakesms.New(fakesms.WithConfig(fakesms.Config{Delay: time.Minute}))
	w := sendCtxWorker(t, Config{SendTimeout: 200 * time.Millisecond}, fake)
	it := sendCtxItem(3, "sendctx-deadline")
	start := time.Now()
	w.send(context.Background(), it)
	require.Less(t, time.Since(start), 5*time.Second, "cut at the send's deadline")
	require.Equal(t, "timeout", it.code, it.out.Reason)
	require.Equal(t, reminder.Retrying, it.out.State())
	require.Equal(t, reminder.OutcomeUnknown, it.out.Attempt)
	require.Eventually(t, func() bool { return fake.Stats().ClientGone == 1 }, 5*time.Second, time.Millisecond,
		"the provider saw the client go")
	require.Zero(t, fake.Stats().Accepted)
}

// Shutdown with a batch in flight: the batch's one watch cuts every send
// (each on its own runner), and nothing is recorded (the send leases expire
// and the reconciler retries with the same idempotency keys).
func TestShutdownCancelsABatchInFlight(t *testing.T) {
	t.Parallel()
	fake := fakesms.New(fakesms.WithConfig(fakesms.Config{Delay: time.Minute}))
	w := sendCtxWorker(t, Config{SendTimeout: time.Minute}, fake)
	items := []*item{sendCtxItem(11, "sendctx-b1"), sendCtxItem(12, "sendctx-b2"), sendCtxItem(13, "sendctx-b3")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.sendAndRecord(ctx, items)
	}()
	require.Eventually(t, func() bool { return fake.Stats().Attempts == len(items) }, 5*time.Second, time.Millisecond,
		"every request reached the provider")
	cancel()
	waitClosed(t, done, "batch")
	for _, it := range items {
		require.Equal(t, "canceled", it.code, "reminder %d: %s", it.row.ID, it.out.Reason)
		require.Equal(t, unsettled, it.settled, "nothing settled")
	}
	require.Eventually(t, func() bool { return fake.Stats().ClientGone == len(items) }, 5*time.Second, time.Millisecond)
	require.Zero(t, fake.Stats().Accepted)
}
