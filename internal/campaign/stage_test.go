package campaign_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/pkg/localtime"
)

// stageRows stages n rows k001.. into source for tenant, in one call.
func stageRows(t *testing.T, b *bundle, source, tenant, digest string, n int, zone *string) campaign.StageResult {
	t.Helper()
	day := time.Date(2027, 3, 8, 0, 0, 0, 0, time.UTC)
	res, err := campaign.Stage(context.Background(), b.db.Pool, campaign.StageFile{Source: source, Tenant: tenant,
		Digest: digest, File: source + ".csv", By: "test"}, b.now, 10,
		func(row func(campaign.StagedRow) error, bad func(campaign.StageError)) error {
			for i := 1; i <= n; i++ {
				if err := row(campaign.StagedRow{Line: i + 1, Key: fmt.Sprintf("k%03d", i),
					Recipient: fmt.Sprintf("r%d@example.org", i), Date: &day, Zone: zone}); err != nil {
					return err
				}
			}
			// A repeated key is a bad line, the first kept.
			if err := row(campaign.StagedRow{Line: n + 2, Key: "k001", Recipient: "again@example.org"}); err != nil {
				return err
			}
			bad(campaign.StageError{Line: n + 3, Key: "x", Field: "recipient", Reason: "is required"})
			return nil
		})
	require.NoError(t, err)
	return res
}

// A staged file is a source like a table: planned with the keyset cursor
// over its own rows only, under the local due rule, and staging the same
// file again changes nothing.
func TestAStagedFileIsPlannedLikeATable(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	ctx := context.Background()
	tokyo := "Asia/Tokyo"
	res := stageRows(t, b, "spreadsheet", "acme", "d1", 250, &tokyo)
	require.False(t, res.Same)
	require.Equal(t, int64(250), res.Rows)
	require.Equal(t, int64(2), res.Bad)
	require.Equal(t, `line 252 (key "k001"): field "key" repeats the key of line 2; the first is kept`, res.Errors[0].String())
	stageRows(t, b, "other-sheet", "acme", "d2", 30, nil)
	again := stageRows(t, b, "spreadsheet", "acme", "d1", 250, &tokyo)
	require.True(t, again.Same, "the same file again")
	require.Equal(t, int64(250), again.Rows)
	require.Len(t, again.Errors, 2, "the bad lines of the first staging")

	days := 7
	at := localtime.Clock(9, 0)
	id, _, err := campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Name: "from-file", Channel: "email",
		Template: "renewal", Source: "spreadsheet", DaysBefore: &days, AtLocal: &at,
		Deadline: utc("2027-06-01T00:00:00Z"), SliceSize: 100})
	require.NoError(t, err)
	remaining, err := campaign.Remaining(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, int64(250), remaining, "its own rows, not the other sheet's")
	require.Equal(t, 3, b.planAll(t, b.newPlanner("p1"), id))
	got := b.reminders(t, id)
	require.Len(t, got, 250)
	// 2027-03-01 09:00 JST; deadline the start of 2027-03-08 in Tokyo.
	require.True(t, got["k001"].due.Equal(utc("2027-03-01T00:00:00Z")), "due %s", got["k001"].due)
	require.True(t, got["k250"].deadline.Equal(utc("2027-03-07T15:00:00Z")), "deadline %s", got["k250"].deadline)
	require.Equal(t, "Asia/Tokyo", got["k100"].tz)

	_, err = b.db.Pool.Exec(ctx, `UPDATE campaigns SET state = 'planning' WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = campaign.Stage(ctx, b.db.Pool, campaign.StageFile{Source: "spreadsheet", Tenant: "acme", Digest: "d3",
		File: "new.csv"}, b.now, 10, func(func(campaign.StagedRow) error, func(campaign.StageError)) error { return nil })
	require.ErrorContains(t, err, "is still planning from source 'spreadsheet'", "a new file does not pull rows from under a campaign")
	_, err = campaign.Stage(ctx, b.db.Pool, campaign.StageFile{Source: "renewals", Tenant: "acme", Digest: "d4",
		File: "x.csv"}, b.now, 10, func(func(campaign.StagedRow) error, func(campaign.StageError)) error { return nil })
	require.ErrorContains(t, err, "is a table source")
	_, err = campaign.Stage(ctx, b.db.Pool, campaign.StageFile{Source: "other-sheet", Tenant: "globex", Digest: "d5",
		File: "x.csv"}, b.now, 10, func(func(campaign.StagedRow) error, func(campaign.StageError)) error { return nil })
	require.ErrorContains(t, err, "belongs to another tenant")
}
