package ctl_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/testenv"
)

// Staging checks a file's recipients in Go so that a bad address is told
// with its line when the file is staged; intake checks them again in SQL
// (nudge_invalid) when the rows are planned. The two copies of the rule must
// agree: a recipient staging accepts that intake refuses becomes a bad row
// only at planning time, and one staging refuses that intake accepts is lost.
// Staging trims a recipient and stages the trimmed value, so intake is asked
// about that.
func TestStagingRecipientRuleIsIntakes(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	recipients := map[string][]string{
		"email": {"ada@example.org", "a.b+c@sub.example.co.uk", "no-at-sign", "two@@example.org", "a@b", "a@b.",
			"@example.org", "ada@example.org ", " ada@example.org", "a da@example.org", "<ada@example.org>",
			"ada@exa\tmple.org", "ada@例え.jp", "+14155550100", "x@y.z", strings.Repeat("a", 250) + "@b.co"},
		"sms": {"+14155550100", "+1415555010", "+123456", "+1234567", "+123456789012345", "+1234567890123456",
			"14155550100", "+04155550100", "+1 415 555 0100", "+1415555010a", "+١٢٣٤٥٦٧٨", "ada@example.org"},
	}
	ctx := context.Background()
	for channel, rs := range recipients {
		for i, r := range rs {
			var field *string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (nudge_invalid('acme', 'k', $1, $2, 'course-expiry', '{}',
				now(), now() + interval '1 hour'))[1]`, channel, strings.TrimSpace(r)).Scan(&field))
			intakeRefuses := field != nil && *field == "recipient"

			var bad []string
			line := fmt.Sprintf("key,recipient\n%d,\"%s\"\n", i, strings.ReplaceAll(r, `"`, `""`))
			err := ctl.ReadAudience(strings.NewReader(line), "csv", ctl.DefaultAudienceColumns, channel,
				func(campaign.StagedRow) error { return nil },
				func(e campaign.StageError) { bad = append(bad, e.String()) })
			require.NoError(t, err)
			stagingRefuses := len(bad) > 0
			require.Equal(t, intakeRefuses, stagingRefuses, "%s recipient %q: intake refuses %v (%v), staging refuses %v (%v)",
				channel, r, intakeRefuses, field, stagingRefuses, bad)
		}
	}
}
