package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
	"github.com/nudgehq/nudge/schema"
)

const signingKeys = "bench:nudge-bench-signing-secret-0123456789"

// nudgeSetup is a migrated schema holding n due SMS reminders and a topology
// of its own; cleanup drops both.
type nudgeSetup struct {
	url     string
	pool    *pgxpool.Pool
	topo    broker.Topology
	cleanup func()
}

func setupNudge(ctx context.Context, e *env, n int) (*nudgeSetup, error) {
	name, drop, err := e.newSchema(ctx, "bench_nudge")
	if err != nil {
		return nil, err
	}
	s := &nudgeSetup{url: e.schemaURL(name)}
	topo := broker.Topology{Prefix: "nudge-bench-" + testenv.RandomID()}.WithDefaults()
	s.topo = topo
	s.cleanup = func() {
		if s.pool != nil {
			s.pool.Close()
		}
		if conn, err := broker.Dial(e.amqpURL, "nudge-bench-cleanup"); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_ = topo.Delete(ch)
			}
			conn.Close()
		}
		drop()
	}
	fail := func(err error) (*nudgeSetup, error) { s.cleanup(); return nil, err }
	if s.pool, err = pgxpool.New(ctx, s.url); err != nil {
		return fail(err)
	}
	if _, err := schema.Migrate(ctx, s.pool); err != nil {
		return fail(fmt.Errorf("migrating %s: %w", name, err))
	}
	conn, err := broker.Dial(e.amqpURL, "nudge-bench-declare")
	if err != nil {
		return fail(err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = topo.Declare(ch)
	}
	conn.Close()
	if err != nil {
		return fail(err)
	}
	now := time.Now()
	const chunk = 2000
	for off := 0; off < n; off += chunk {
		reqs := make([]intake.Request, 0, chunk)
		for i := off; i < min(off+chunk, n); i++ {
			reqs = append(reqs, intake.Request{
				Tenant: fmt.Sprintf("tenant-%d", i%4), Key: fmt.Sprintf("bench:%d", i), Channel: reminder.SMS,
				Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
				Data: map[string]any{"course": "Go 101"}, DueAt: now.Add(-time.Minute), Deadline: now.Add(2 * time.Hour),
			})
		}
		out, err := intake.ScheduleMany(ctx, s.pool, reqs)
		if err != nil {
			return fail(err)
		}
		for _, o := range out {
			if o.Err != nil {
				return fail(fmt.Errorf("seeding: %w", o.Err))
			}
		}
	}
	return s, nil
}

func (s *nudgeSetup) dispatcher(e *env, keys *message.Keyring) (*dispatch.Dispatcher, *broker.Publisher) {
	pub := broker.NewPublisher(e.amqpURL, s.topo, "nudge-bench-dispatcher")
	return &dispatch.Dispatcher{
		Enqueuer: dispatch.Enqueuer{
			Store: store.New(s.pool), Publisher: pub, Keys: keys, Topology: s.topo,
			Clock: clock.Real{}, Actor: "bench-dispatcher",
		},
		Log: zerolog.Nop(),
	}, pub
}

// dispatchResult is one run of the dispatcher alone.
type dispatchResult struct {
	Rate    float64
	Batches int
	RSS     float64
}

// dispatcherAlone runs one dispatcher pass over n due reminders with no
// worker consuming: claim + publish (confirms) + record enqueued.
func dispatcherAlone(ctx context.Context, e *env, n int) (dispatchResult, error) {
	var res dispatchResult
	s, err := setupNudge(ctx, e, n)
	if err != nil {
		return res, err
	}
	defer s.cleanup()
	keys, err := message.ParseKeys(signingKeys)
	if err != nil {
		return res, err
	}
	d, pub := s.dispatcher(e, keys)
	defer pub.Close()
	resetPeakRSS()
	sum, err := d.RunOnce(ctx)
	res.RSS = peakRSSMiB()
	if err != nil {
		return res, err
	}
	if sum.Enqueued != n {
		return res, fmt.Errorf("dispatcher enqueued %d of %d (%+v)", sum.Enqueued, n, sum)
	}
	res.Rate = float64(sum.Enqueued) / sum.Elapsed.Seconds()
	res.Batches = sum.Batches
	return res, nil
}

// e2eResult is one end-to-end run.
type e2eResult struct {
	Rate      float64 // reminders/s, first claim to last terminal state
	Elapsed   time.Duration
	Delivered int
	CPU       cpuTicks // CPU seconds spent during the run, by owner
	RSS       float64  // peak RSS of the harness process during the run, MiB
	// Claim-to-terminal latency under saturation (ms), from the event trail.
	P50, P99, Max float64
}

// nudgeE2E runs k in-process SMS workers against an instant fake SMS
// provider and one dispatcher pass over n due reminders, and measures from
// the first claim to the last terminal state (both from the event trail).
func nudgeE2E(ctx context.Context, e *env, n, k int, profile string) (e2eResult, error) {
	var res e2eResult
	s, err := setupNudge(ctx, e, n)
	if err != nil {
		return res, err
	}
	defer s.cleanup()
	keys, err := message.ParseKeys(signingKeys)
	if err != nil {
		return res, err
	}
	sink := httptest.NewServer(fakesms.New())
	defer sink.Close()
	// A pooled transport: the production default (http.Client{} with
	// MaxIdleConnsPerHost 2) would measure TCP connection churn instead.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024}}
	sender, err := sms.New(sms.Config{URL: sink.URL, Timeout: 10 * time.Second, HTTPClient: hc})
	if err != nil {
		return res, err
	}

	wctx, stopWorkers := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	var workers []*worker.Worker
	var pools []*pgxpool.Pool
	defer func() {
		stopWorkers()
		wg.Wait()
		for _, p := range pools {
			p.Close()
		}
	}()
	for i := range k {
		p, err := pgxpool.New(ctx, s.url)
		if err != nil {
			return res, err
		}
		pools = append(pools, p)
		w, err := worker.New(worker.Config{Channel: reminder.SMS, Name: fmt.Sprintf("bench-sms-worker-%d", i)},
			worker.Deps{AMQPURL: e.amqpURL, Topology: s.topo, Store: store.New(p), Sender: sender,
				Keys: keys, Clock: clock.Real{}, Log: zerolog.Nop()})
		if err != nil {
			return res, err
		}
		workers = append(workers, w)
		wg.Go(func() { _ = w.Run(wctx) })
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		ready := true
		for _, w := range workers {
			ready = ready && w.Ready()
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			return res, errors.New("workers not ready after 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	d, pub := s.dispatcher(e, keys)
	defer pub.Close()
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return res, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return res, err
		}
		defer pprof.StopCPUProfile()
	}
	resetPeakRSS()
	cpu0 := readCPU()
	dispErr := make(chan error, 1)
	go func() { _, err := d.RunOnce(ctx); dispErr <- err }()

	timeout := time.After(10 * time.Minute)
	for {
		var done int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM reminders
			WHERE state IN ('delivered', 'failed', 'expired', 'canceled')`).Scan(&done); err != nil {
			return res, err
		}
		if done >= n {
			break
		}
		select {
		case err := <-dispErr:
			if err != nil {
				return res, fmt.Errorf("dispatcher: %w", err)
			}
			dispErr = nil
		case <-timeout:
			return res, fmt.Errorf("only %d of %d reminders terminal after 10 minutes", done, n)
		case <-time.After(50 * time.Millisecond):
		}
	}
	res.CPU = readCPU().sub(cpu0)
	res.RSS = peakRSSMiB()
	if profile != "" {
		pprof.StopCPUProfile()
	}
	if dispErr != nil {
		if err := <-dispErr; err != nil {
			return res, fmt.Errorf("dispatcher: %w", err)
		}
	}

	var first, last time.Time
	if err := s.pool.QueryRow(ctx, `SELECT min(at) FILTER (WHERE to_state = 'leased'),
			max(at) FILTER (WHERE to_state IN ('delivered', 'failed', 'expired', 'canceled'))
		FROM reminder_events`).Scan(&first, &last); err != nil {
		return res, err
	}
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM reminders WHERE state = 'delivered'`).Scan(&res.Delivered); err != nil {
		return res, err
	}
	res.Elapsed = last.Sub(first)
	res.Rate = float64(n) / res.Elapsed.Seconds()
	err = s.pool.QueryRow(ctx, `WITH l AS (
			SELECT reminder_id,
			       max(at) FILTER (WHERE to_state IN ('delivered', 'failed', 'expired', 'canceled'))
			     - min(at) FILTER (WHERE to_state = 'leased') AS d
			  FROM reminder_events GROUP BY reminder_id)
		SELECT extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY d)) * 1000,
		       extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY d)) * 1000,
		       extract(epoch FROM max(d)) * 1000
		  FROM l`).Scan(&res.P50, &res.P99, &res.Max)
	return res, err
}
