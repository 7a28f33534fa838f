package sms_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
)

// accepting is a provider that accepts every send at once: the benchmark
// measures what failover itself costs per send.
type accepting struct{}

func (accepting) Send(context.Context, provider.Message) (string, error) { return "ok", nil }
func (accepting) Lookup(context.Context, provider.Message) (string, error) {
	return "", provider.ErrNotFound
}

// BenchmarkFailoverSends is four workers' Failovers (sharing provider_failover
// in PostgreSQL) sending successes concurrently through providers that
// accept at once: the cost failover adds to each send, and how the one
// shared row holds up.
//
//	CI=true go test -run '^$' -bench FailoverSends -benchtime 3s ./internal/sms/
func BenchmarkFailoverSends(b *testing.B) {
	db := testenv.Postgres(b)
	st := store.New(db.Pool)
	var workers []*sms.Failover
	for range 4 {
		f, err := sms.NewFailover(sms.FailoverConfig{}, []sms.Named{{Name: "a", Looker: accepting{}}, {Name: "b", Looker: accepting{}}})
		if err != nil {
			b.Fatal(err)
		}
		f.Share(st, clock.Real{}, zerolog.Nop(), nil)
		workers = append(workers, f)
	}
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := workers[next.Add(1)%int64(len(workers))]
		for pb.Next() {
			if _, err := w.Send(context.Background(), message("k")); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	var sends int
	if err := db.Pool.QueryRow(context.Background(), `SELECT window_sends FROM provider_failover`).Scan(&sends); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(sends)/float64(b.N), "counted/send")
}
