// Package node_test runs the Node.js example (main.js) against a fresh,
// migrated schema, as a login of the intake role, so the example cannot
// drift from the SQL functions it shows.
package node_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// stamp, inside node_modules, records the lockfile that `npm ci` installed.
const stamp = "node_modules/.nudge-lockfile-sha256"

func TestNodeExample(t *testing.T) {
	t.Parallel()
	node, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	if err := firstErr(errNode, errNpm); err != nil {
		testenv.Unavailable(t, "Node.js and npm", "install them: scripts/ensure-services.sh does (Debian nodejs, npm)", err)
		return
	}
	db := testenv.Postgres(t)
	npmCI(t, npm)

	ctx := context.Background()
	login := "nudge_t_node_" + testenv.RandomID()
	ident := pgx.Identifier{login}.Sanitize()
	appSchema := pgx.Identifier{login + "_app"}.Sanitize()
	_, err := db.Pool.Exec(ctx, `CREATE ROLE `+ident+` LOGIN IN ROLE nudge_intake`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+appSchema+` CASCADE; DROP OWNED BY `+ident+`; DROP ROLE `+ident)
		if err != nil {
			t.Errorf("dropping the example's role and schema: %v", err)
		}
	})
	_, err = db.Pool.Exec(ctx, `CREATE SCHEMA `+appSchema+` AUTHORIZATION `+ident)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO nudge_intake_tenants (grantee, tenant) VALUES ($1, 'acme')`, login)
	require.NoError(t, err)
	// Another tenant's reminder, which the example must not reach.
	_, err = db.Pool.Exec(ctx, `SELECT nudge_schedule('globex', 'k', 'email', 'g@example.com', 'course-expiry', '{}',
		now(), now() + interval '1 day')`)
	require.NoError(t, err)

	u, err := url.Parse(db.URL)
	require.NoError(t, err)
	u.User = url.User(login)
	q := u.Query()
	q.Del("search_path") // node-postgres takes it from APP_SCHEMA and NUDGE_SCHEMA instead
	q.Del("jit")
	u.RawQuery = q.Encode()

	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(runCtx, node, "main.js")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+u.String(), "NUDGE_SCHEMA="+db.Schema, "APP_SCHEMA="+login+"_app")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("node main.js:\n%s", out.String())
	require.NoError(t, err, "the example failed")
	require.Contains(t, out.String(), "\nok\n")

	// What it left, seen by the owner: each change is one event with its code.
	var codes []string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT array_agg(e.code ORDER BY e.id) FROM reminder_events e
		JOIN reminders r ON r.id = e.reminder_id WHERE r.key = 'course-expiry:learner-42:course-7'`).Scan(&codes))
	require.Equal(t, []string{"scheduled", "rescheduled", "canceled"}, codes)
	var globex string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT state FROM reminder_state WHERE tenant = 'globex'`).Scan(&globex))
	require.Equal(t, "pending", globex)
}

// npmCI installs the locked dependencies unless node_modules already holds
// exactly them.
func npmCI(t *testing.T, npm string) {
	t.Helper()
	lock, err := os.ReadFile("package-lock.json")
	require.NoError(t, err)
	sum := sha256.Sum256(lock)
	want := hex.EncodeToString(sum[:])
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "npm ci:\n%s", out)
	require.NoError(t, os.WriteFile(filepath.FromSlash(stamp), []byte(want), 0o644))
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
