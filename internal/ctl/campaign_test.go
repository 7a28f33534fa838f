package ctl_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCampaignCommands(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	_, err := b.db.Pool.Exec(context.Background(), `
		CREATE TABLE renewals (learner_id bigint PRIMARY KEY, email text);
		INSERT INTO renewals SELECT i, 'l' || i || '@example.org' FROM generate_series(1, 30) i;
		GRANT SELECT ON renewals TO nudge_planner;
		SELECT nudge_campaign_source('renewals', 'acme', 'renewals', 'learner_id', 'email', NULL, NULL)`)
	require.NoError(t, err)
	create := []string{"campaign", "create", "--tenant", "acme", "--name", "spring", "--template", "renewal",
		"--source", "renewals", "--due", "2030-01-01T09:00:00Z", "--deadline", "2030-01-02T00:00:00Z", "--slice-size", "10"}
	r := b.run(create...)
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "campaign 1 created\n", r.stdout)
	r = b.run(create...)
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "campaign 1 exists\n", r.stdout)

	r = b.run("campaign", "status", "1")
	require.NoError(t, r.err, r.stderr)
	require.Contains(t, r.stdout, "spring")
	require.Contains(t, r.stdout, "planning")
	require.Contains(t, r.stdout, "remaining: 30\n")

	r = b.run("campaign", "pause", "1", "--tenant", "acme")
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "campaign 1 is paused\n", r.stdout)
	r = b.run("campaign", "resume", "1", "--tenant", "acme")
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "campaign 1 is planning\n", r.stdout)
	r = b.run("campaign", "cancel", "1", "--tenant", "globex")
	require.ErrorContains(t, r.err, "campaign not found")
	r = b.run("campaign", "cancel", "1", "--tenant", "acme")
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, "campaign 1 is canceled\n", r.stdout)

	r = b.run("campaign", "list", "--tenant", "acme")
	require.NoError(t, r.err, r.stderr)
	require.Contains(t, r.stdout, "canceled")
	r = b.run("campaign", "create", "--tenant", "acme", "--name", "x", "--template", "t", "--source", "renewals",
		"--deadline", "2030-01-02T00:00:00Z")
	require.ErrorContains(t, r.err, "give a due rule")
}
