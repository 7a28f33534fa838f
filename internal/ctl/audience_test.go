package ctl_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/ctl"
)

func readAudience(t *testing.T, format, text string) ([]campaign.StagedRow, []string, error) {
	t.Helper()
	var rows []campaign.StagedRow
	var bad []string
	err := ctl.ReadAudience(strings.NewReader(text), format, ctl.DefaultAudienceColumns, "email",
		func(r campaign.StagedRow) error { rows = append(rows, r); return nil },
		func(e campaign.StageError) { bad = append(bad, e.String()) })
	return rows, bad, err
}

func TestReadAudienceCSV(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", ctl.MaxLineBytes)
	text := "\uFEFFkey,recipient,date,zone,first_name\n" +
		"1,ada@example.org,2027-01-31,Europe/Stockholm,Ada\n" +
		"2,,2027-01-31,,Bob\n" +
		"3,not an address,,,Cy\n" +
		"4,dee@example.org,31/01/2027,,Dee\n" +
		"5,eve@example.org,,Mars/Base,Eve\n" +
		"6,fay@example.org,,,\"Fay, \"\"the\"\" second\"\n" +
		"7,gus@example.org\n" +
		"8,hal@example.org,,," + long + "\n" +
		",ian@example.org,,,Ian\n" +
		"10,\"jo@example.org\",2027-02-28,,\"Jo\nmultiline\"\n"
	rows, bad, err := readAudience(t, "csv", text)
	require.NoError(t, err)
	require.Len(t, rows, 3)
	require.Equal(t, "1", rows[0].Key)
	require.Equal(t, 2, rows[0].Line)
	require.Equal(t, "Europe/Stockholm", *rows[0].Zone)
	require.Equal(t, "2027-01-31", rows[0].Date.Format("2006-01-02"))
	require.JSONEq(t, `{"first_name":"Ada"}`, string(rows[0].Data))
	require.JSONEq(t, `{"first_name":"Fay, \"the\" second"}`, string(rows[1].Data))
	require.Nil(t, rows[1].Zone, "an empty zone is the campaign's default")
	require.Equal(t, "10", rows[2].Key)
	require.Equal(t, 11, rows[2].Line)
	require.Equal(t, []string{
		`line 3 (key "2"): field "recipient" is required`,
		`line 4 (key "3"): field "recipient" must be an email address like name@example.com`,
		`line 5 (key "4"): field "date" must be a date like 2027-01-31, not "31/01/2027"`,
		`line 6 (key "5"): field "zone" must be an IANA time zone name: invalid time zone: unknown zone "Mars/Base" (want an IANA name such as "Europe/Stockholm" or "UTC")`,
		`line 8: field "line" is not valid CSV: wrong number of fields`,
		fmt.Sprintf(`line 9: field "line" is %d bytes, longer than %d, the limit for one line; skipped`, len(long)+21, ctl.MaxLineBytes),
		`line 10: field "key" is required`,
	}, bad)

	_, _, err = readAudience(t, "csv", "id,email\n1,a@example.org\n")
	require.ErrorContains(t, err, `line 1: the header has no column "key" (it has id, email; name the columns with --key-column and --recipient-column)`)
	_, _, err = readAudience(t, "csv", "key,recipient,key\n")
	require.ErrorContains(t, err, `column "key" appears twice`)
	_, _, err = readAudience(t, "csv", "key,recipient\n1,"+strings.Repeat("y", ctl.MaxAudiencePhysicalLine+1)+"\n")
	require.ErrorContains(t, err, "line 2 is longer than")
}

func TestReadAudienceJSONL(t *testing.T) {
	t.Parallel()
	text := `{"key": "a", "recipient": "a@example.org", "date": "2027-01-31", "zone": "Asia/Tokyo", "data": {"n": 1}}
{"key": 42, "recipient": "b@example.org"}

{"key": "c", "recipient": "c@example.org", "data": [1]}
{"key": "d", "recipient": "d@example.org", "colour": "red"}
{"key": true, "recipient": "e@example.org"}
not json
{"key": "f", "recipient": "f@example.org", "zone": null, "date": null}
` + `{"key": "g", "recipient": "g@example.org", "data": {"x": "` + strings.Repeat("z", ctl.MaxLineBytes) + `"}}
{"key": "` + strings.Repeat("k", 201) + `", "recipient": "h@example.org"}
`
	rows, bad, err := readAudience(t, "jsonl", text)
	require.NoError(t, err)
	require.Len(t, rows, 3)
	require.Equal(t, "a", rows[0].Key)
	require.JSONEq(t, `{"n": 1}`, string(rows[0].Data))
	require.Equal(t, "42", rows[1].Key, "an integer key")
	require.Equal(t, "f", rows[2].Key)
	require.Equal(t, 8, rows[2].Line)
	require.Len(t, bad, 6)
	require.Equal(t, `line 4 (key "c"): field "data" must be a JSON object`, bad[0])
	require.Equal(t, `line 5: field "colour" is not a field of an audience line (want key, recipient, date, zone, data)`, bad[1])
	require.Equal(t, `line 6: field "key" must be a string or an integer`, bad[2])
	require.Contains(t, bad[3], `line 7: field "line" must be a JSON object`)
	require.Contains(t, bad[4], `line 9: field "line" is longer than`)
	require.True(t, strings.HasPrefix(bad[5], "line 10 (key \"kkk"))
	require.Contains(t, bad[5], `field "key" must be at most 200 characters`)
}
