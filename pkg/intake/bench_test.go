package intake_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// BenchmarkScheduleFunctionVsBulk schedules NUDGE_BENCH_N (default 20,000)
// SMS reminders three ways into fresh tables and reports the CPU of the
// PostgreSQL backend that served each (from /proc/PID/stat), per 1,000
// reminders: the SQL function nudge_schedule called once per reminder, each
// call a transaction of its own, by a login of nudge_intake granted its
// tenants (as a web tier calls it) and by the schema's owner; intake.Schedule
// once per reminder, each a transaction, by the owner; the function
// called once per row of a statement over 1,000 rows (SELECT
// nudge_schedule(...) FROM unnest(...), as an import job calls it); and the
// set-based bulk path (intake.ScheduleMany, batches of 1,000). The
// function's target is at most 1.5× the bulk path per row; a transaction
// per call adds its commit (a WAL flush) and round trip, which no function
// body can save.
//
//	CI=true go test ./pkg/intake -run '^$' -bench ScheduleFunctionVsBulk -benchtime 1x -v
//
// NUDGE_BENCH_WAYS picks some of the ways, separated by ";", by the names
// the log prints ("function per row, batches;bulk").
func BenchmarkScheduleFunctionVsBulk(b *testing.B) {
	n := 20000
	if v, err := strconv.Atoi(os.Getenv("NUDGE_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	ways := []string{"function, intake login", "function, owner", "Schedule, owner", "function per row, batches", "bulk"}
	if v := os.Getenv("NUDGE_BENCH_WAYS"); v != "" {
		ways = strings.Split(v, ";")
	}
	for range b.N {
		cpu := map[string]float64{}
		for _, how := range ways {
			cpu[how] = scheduleCPU(b, n, how)
		}
		units := map[string]string{"function, intake login": "fn-login", "function, owner": "fn-owner",
			"Schedule, owner": "schedule", "function per row, batches": "fn-rows", "bulk": "bulk"}
		for how, c := range cpu {
			b.ReportMetric(c, units[how]+"-cpu-s/1k")
			if bulk, ok := cpu["bulk"]; ok && how != "bulk" {
				b.ReportMetric(c/bulk, units[how]+"/bulk")
			}
		}
	}
}

// scheduleCPU schedules n reminders the given way into a schema of its own
// and returns the backend's CPU-s per 1,000.
func scheduleCPU(b *testing.B, n int, how string) float64 {
	ctx := context.Background()
	db := testenv.Postgres(b)
	connURL := db.URL
	if how == "function, intake login" {
		name := "nudge_b_" + testenv.RandomID()
		ident := pgx.Identifier{name}.Sanitize()
		if _, err := db.Pool.Exec(ctx, `CREATE ROLE `+ident+` LOGIN IN ROLE nudge_intake`); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), `DROP OWNED BY `+ident+`; DROP ROLE `+ident) })
		for t := range 4 {
			if _, err := db.Pool.Exec(ctx, `INSERT INTO nudge_intake_tenants (grantee, tenant) VALUES ($1, $2)`,
				name, fmt.Sprintf("tenant-%d", t)); err != nil {
				b.Fatal(err)
			}
		}
		u, err := url.Parse(db.URL)
		if err != nil {
			b.Fatal(err)
		}
		u.User = url.User(name)
		connURL = u.String()
	}
	conn, err := pgx.Connect(ctx, connURL)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		b.Fatal(err)
	}
	due := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	req := func(i int) intake.Request {
		return intake.Request{Tenant: fmt.Sprintf("tenant-%d", i%4), Key: fmt.Sprintf("bench:%d", i), Channel: reminder.SMS,
			Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry", Data: map[string]any{"course": "Go 101"},
			DueAt: due, Deadline: due.Add(2 * time.Hour)}
	}
	const fnSQL = `SELECT nudge_schedule($1, $2, $3, $4, $5, $6::jsonb, $7, $8)`
	// Warm the backend (catalog caches, plans) outside the measurement.
	if how == "bulk" {
		if _, err := intake.ScheduleMany(ctx, conn, []intake.Request{req(-1)}); err != nil {
			b.Fatal(err)
		}
	} else if _, err := conn.Exec(ctx, fnSQL, "tenant-0", "warm", "sms", "+14150000000", "t", `{}`, due, due.Add(time.Hour)); err != nil {
		b.Fatal(err)
	}
	cpu0, t0 := procCPU(b, pid), time.Now()
	if how == "bulk" {
		for off := 0; off < n; off += 1000 {
			reqs := make([]intake.Request, 0, 1000)
			for i := off; i < min(off+1000, n); i++ {
				reqs = append(reqs, req(i))
			}
			out, err := intake.ScheduleMany(ctx, conn, reqs)
			if err != nil {
				b.Fatal(err)
			}
			for _, o := range out {
				if o.Err != nil || o.Status != intake.Created {
					b.Fatalf("bulk: %+v", o)
				}
			}
		}
	} else if how == "function per row, batches" {
		for off := 0; off < n; off += 1000 {
			var tenants, keys, recipients []string
			for i := off; i < min(off+1000, n); i++ {
				r := req(i)
				tenants, keys, recipients = append(tenants, r.Tenant), append(keys, r.Key), append(recipients, r.Recipient)
			}
			if _, err := conn.Exec(ctx, `SELECT nudge_schedule(t, k, 'sms', r, 'course-expiry', '{"course":"Go 101"}', $4, $5)
				FROM unnest($1::text[], $2::text[], $3::text[]) AS u(t, k, r)`, tenants, keys, recipients, due, due.Add(2*time.Hour)); err != nil {
				b.Fatal(err)
			}
		}
	} else if how == "Schedule, owner" {
		for i := range n {
			if res, err := intake.Schedule(ctx, conn, req(i)); err != nil || res.Status != intake.Created {
				b.Fatalf("Schedule: %+v, %v", res, err)
			}
		}
	} else {
		for i := range n {
			r := req(i)
			if _, err := conn.Exec(ctx, fnSQL, r.Tenant, r.Key, string(r.Channel), r.Recipient, r.Template,
				`{"course":"Go 101"}`, r.DueAt, r.Deadline); err != nil {
				b.Fatal(err)
			}
		}
	}
	cpu := procCPU(b, pid) - cpu0
	wall := time.Since(t0)
	var rows int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminders WHERE key LIKE 'bench:%'`).Scan(&rows); err != nil {
		b.Fatal(err)
	}
	if rows != n {
		b.Fatalf("%s: %d reminders scheduled, want %d", how, rows, n)
	}
	per1k := cpu.Seconds() * 1000 / float64(n)
	b.Logf("%-24s N=%d backend CPU %.3f CPU-s per 1000, wall %s", how, n, per1k, wall.Round(time.Millisecond))
	return per1k
}

// procCPU is the user+system CPU time of process pid, from /proc.
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("reading the backend's CPU (is PostgreSQL on this machine?): %v", err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ = 100
}
