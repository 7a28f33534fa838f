package intake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func webhookRequest(key, url string, data any) intake.Request {
	return intake.Request{Tenant: "acme", Key: key, Channel: reminder.Webhook, Recipient: url,
		Template: "certificate-cleanup", Data: data, DueAt: due, Deadline: deadline}
}

// A webhook reminder's recipient is its target URL and its data the method
// and body: what the worker could not send is refused at intake, on the Go
// path and in the SQL function alike, naming the field.
func TestWebhookValidation(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()

	accepted := []struct {
		url  string
		data string
	}{
		{"https://app.internal/learners/42/drafts/7", `{}`},
		{"https://app.internal/learners/42/drafts/7", `{"method": "DELETE"}`},
		{"https://app.example.com:8443/hooks/cleanup?learner=42", `{"method": "POST", "body": {"learner": 42}}`},
		{"http://127.0.0.1:9000/drafts/7", `{"method": "PUT", "body": [1, "two"]}`},
		{"http://[::1]:9000/drafts/7", `{}`},
		{"https://app.internal", `{}`},
	}
	for i, tc := range accepted {
		req := webhookRequest(fmt.Sprintf("ok-%d", i), tc.url, json.RawMessage(tc.data))
		_, err := intake.Schedule(ctx, db.Pool, req)
		require.NoError(t, err, "%s %s: Go API", tc.url, tc.data)
		_, err = db.Pool.Exec(ctx, `SELECT nudge_schedule($1, $2, 'webhook', $3, 'certificate-cleanup', $4::jsonb, $5, $6)`,
			"acme", req.Key+"-sql", tc.url, tc.data, due, deadline)
		require.NoError(t, err, "%s %s: SQL function", tc.url, tc.data)
	}

	refused := []struct {
		name, url, data, field, reason string
	}{
		{"no url", "", `{}`, "recipient", "is required"},
		{"not a url", "app.internal/drafts/7", `{}`, "recipient", "URL"},
		{"ftp", "ftp://app.internal/drafts/7", `{}`, "recipient", "URL"},
		{"user info", "https://admin:pw@app.internal/drafts/7", `{}`, "recipient", "user info"},
		{"fragment", "https://app.internal/drafts/7#x", `{}`, "recipient", "fragment"},
		{"space", "https://app.internal/drafts 7", `{}`, "recipient", "URL"},
		{"too long", "https://app.internal/" + strings.Repeat("d", intake.MaxRecipientChars), `{}`, "recipient", "at most"},
		{"bad method", "https://app.internal/d/7", `{"method": "GET"}`, "data", "method"},
		{"lowercase method", "https://app.internal/d/7", `{"method": "delete"}`, "data", "method"},
		{"method not a string", "https://app.internal/d/7", `{"method": 1}`, "data", "method"},
		{"body on delete", "https://app.internal/d/7", `{"body": {"x": 1}}`, "data", "body"},
		{"unknown key", "https://app.internal/d/7", `{"Method": "POST"}`, "data", "only"},
	}
	for i, tc := range refused {
		req := webhookRequest(fmt.Sprintf("bad-%d", i), tc.url, json.RawMessage(tc.data))
		_, err := intake.Schedule(ctx, db.Pool, req)
		var verr *intake.ValidationError
		require.ErrorAs(t, err, &verr, "%s: Go API", tc.name)
		require.Equal(t, tc.field, verr.Field, "%s: Go API", tc.name)
		require.Contains(t, verr.Reason, tc.reason, "%s: Go API", tc.name)

		_, err = db.Pool.Exec(ctx, `SELECT nudge_schedule($1, $2, 'webhook', $3, 'certificate-cleanup', $4::jsonb, $5, $6)`,
			"acme", req.Key+"-sql", tc.url, tc.data, due, deadline)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: SQL function: %v", tc.name, err)
		require.Equal(t, tc.field, pgErr.ColumnName, "%s: SQL function", tc.name)
	}

	// The other fields are checked as on every channel; an unknown channel
	// names the three.
	bad := webhookRequest("bad-template", "https://app.internal/d/7", nil)
	bad.Template = "Not A Name"
	_, err := intake.Schedule(ctx, db.Pool, bad)
	var verr *intake.ValidationError
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "template", verr.Field)
	fax := valid()
	fax.Key, fax.Channel = "fax", "fax"
	_, err = intake.Schedule(ctx, db.Pool, fax)
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "channel", verr.Field)
	require.Equal(t, `must be "email", "sms" or "webhook"`, verr.Reason)
	fax.Tenant = ""
	_, err = intake.Schedule(ctx, db.Pool, fax)
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "tenant", verr.Field, "the tenant is reported before the channel, as before")
}
