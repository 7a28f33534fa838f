package campaign_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// A campaign's reminders by state, as the status report (Deliveries) and
// nudge_campaign_status count them, read the state rows by runs of
// consecutive ids (schema 36): the counts must be those of the campaign's own
// reminders, whatever lies between its runs. The fixture writes the
// campaign's reminders as runs of several lengths (one of a single id, one
// beyond the rest) separated by another tenant's reminders, the tenant's
// single reminders and another campaign whose keys share the prefix's first
// characters (campaign:<id>0:), with every state among them. Before the
// after-rollout step (schema 34, the mirror on) the Go statement must count
// the same. Unpromoted, some reminders have no state row yet (the due-ordered
// store's promoter inserts it, schema 39): a tenth of every reminder, and the
// campaign's run of a single id whatever its state; they count as pending.
func TestDeliveriesCountTheCampaignsOwnReminders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                     string
		afterRollout, unpromoted bool
	}{
		{"before rollout", false, false},
		{"after rollout", true, false},
		{"unpromoted", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testenv.PostgresBeforeRollout(t)
			if tc.afterRollout {
				db = testenv.Postgres(t)
			}
			exec := func(sql string, args ...any) {
				t.Helper()
				_, err := db.Pool.Exec(ctx, sql, args...)
				require.NoError(t, err, sql)
			}
			exec(`INSERT INTO campaign_sources (name, tenant, relation, key_column, recipient_column)
			      VALUES ('src', 'acme', 'campaign_staged_rows'::regclass, 'key', 'recipient')`)
			var id int64
			require.NoError(t, db.Pool.QueryRow(ctx, `
				INSERT INTO campaigns (tenant, name, channel, template, source, due_at, deadline, lease, state)
				VALUES ('acme', 'spring', 'email', 'course-expiry', 'src', '2030-01-01 09:00Z', '2030-01-02 09:00Z',
				        '1 minute', 'done')
				RETURNING id`).Scan(&id))

			// Each segment is one INSERT: its ids are consecutive, a run.
			n := 0
			insert := func(tenant, key string, rows int) {
				t.Helper()
				exec(`WITH ins AS (
					INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline,
					                       idempotency_key)
					SELECT $1, $2 || i, 'email', 'u' || i || '@example.com', 'course-expiry', '{}',
					       '2030-01-01 09:00Z', '2030-01-02 09:00Z', 'idem-' || $2 || i
					  FROM generate_series($3::int, $3::int + $4::int - 1) i
					RETURNING id, tenant, channel, due_at, deadline)
					INSERT INTO reminder_state (id, tenant, channel, due_at, deadline)
					SELECT id, tenant, channel, due_at, deadline FROM ins
					    ON CONFLICT (id) DO NOTHING`, tenant, key, n, rows)
				n += rows
			}
			own := fmt.Sprintf("campaign:%d:", id)
			for _, run := range []int{37, 1, 12, 200, 3, 64} {
				insert("acme", own, run)
				insert("globex", "campaign:1:", 5)
				insert("acme", "single:", 2)
				insert("acme", fmt.Sprintf("campaign:%d0:", id), 4)
			}
			insert("acme", own, 19)
			const total = 37 + 1 + 12 + 200 + 3 + 64 + 19

			// The states in turn, over every reminder: the campaign's
			// reminders take every state, and so do the others.
			exec(`UPDATE reminder_state s SET state = (ARRAY['pending', 'leased', 'enqueued', 'sending', 'retrying',
			          'quarantined', 'delivered', 'failed', 'expired', 'canceled'])[1 + s.id % 10]`)
			if tc.unpromoted {
				var ids []int64
				rows, err := db.Pool.Query(ctx, `SELECT id FROM reminders WHERE id % 20 IN (0, 5) OR key = $1`, own+"37")
				require.NoError(t, err)
				for rows.Next() {
					var id int64
					require.NoError(t, rows.Scan(&id))
					ids = append(ids, id)
				}
				require.NoError(t, rows.Err())
				db.Unpromote(t, ids...)
			}
			want := map[reminder.State]int64{}
			rows, err := db.Pool.Query(ctx, `SELECT coalesce(s.state, 'pending'), count(*)
				FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id
				WHERE r.tenant = 'acme' AND r.key LIKE $1 || '%' GROUP BY 1`, own)
			require.NoError(t, err)
			var (
				st  reminder.State
				cnt int64
				sum int64
			)
			for rows.Next() {
				require.NoError(t, rows.Scan(&st, &cnt))
				want[st], sum = cnt, sum+cnt
			}
			require.NoError(t, rows.Err())
			require.EqualValues(t, total, sum)
			require.Len(t, want, len(reminder.States), "the fixture gives the campaign every state")

			report, err := campaign.GetReport(ctx, db.Pool, id, time.Now())
			require.NoError(t, err)
			require.Equal(t, want, report.Deliveries)

			var raw []byte
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT deliveries FROM nudge_campaign_status('acme', $1)`, id).
				Scan(&raw))
			var fromSQL map[reminder.State]int64
			require.NoError(t, json.Unmarshal(raw, &fromSQL))
			require.Equal(t, want, fromSQL)
		})
	}
}
