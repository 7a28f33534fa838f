package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// BenchmarkLoadForDelivery reads 50 SMS reminders (with data, as the
// Pipeline benchmark schedules them) as a worker's claim reads its rows:
// allocs/op are the scan's per statement (the rows' scan is
// ClaimForDelivery's too).
//
//	CI=true go test ./internal/store -run '^$' -bench LoadForDelivery -benchmem
func BenchmarkLoadForDelivery(b *testing.B) {
	ctx := context.Background()
	db := testenv.Postgres(b)
	now := time.Now()
	reqs := make([]intake.Request, 50)
	for i := range reqs {
		reqs[i] = intake.Request{
			Tenant: "acme", Key: fmt.Sprintf("scan:%d", i), Channel: reminder.SMS,
			Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
			Data: map[string]any{"course": "Go 101"}, DueAt: now.Add(-time.Minute), Deadline: now.Add(time.Hour),
		}
	}
	out, err := intake.ScheduleMany(ctx, db.Pool, reqs)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]int64, len(out))
	for i, o := range out {
		if o.Err != nil {
			b.Fatal(o.Err)
		}
		ids[i] = o.ID
	}
	st := store.New(db.Pool)
	b.ReportAllocs()
	for b.Loop() {
		got, err := st.LoadForDelivery(ctx, ids)
		if err != nil || len(got) != len(ids) {
			b.Fatalf("%d rows, %v", len(got), err)
		}
	}
}
