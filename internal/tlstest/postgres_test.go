package tlstest

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// nudgectl migrates over TLS with sslmode=verify-full; with another CA it
// stops with the verification error, and the server takes no plain text.
func TestPostgresVerifyFull(t *testing.T) {
	s := setup(t)
	s.postgres(t)
	bins := testenv.Binaries(t)

	migrate := func(dbURL string) (int, string) {
		p := testenv.Start(t, bins, "nudgectl", []string{"NUDGE_DATABASE_URL=" + dbURL}, "migrate")
		code, _ := p.Wait(t, time.Minute)
		return code, p.Output()
	}
	code, out := migrate(s.dbURL("nudge", s.ca))
	require.Equal(t, 0, code, out)

	code, out = migrate(s.dbURL("nudge", s.wrong))
	require.NotEqual(t, 0, code)
	require.Contains(t, out, "x509: certificate signed by unknown authority", "a clear error")
	requireNoSecrets(t, out)

	// Plain text reaches the server (loopback is allowed to try) and is refused by it.
	plain := fmt.Sprintf("postgres://%s@127.0.0.1:%d/nudge?sslmode=disable", url.UserPassword(dbUser, dbPassword), s.pg.Port)
	code, out = migrate(plain)
	require.NotEqual(t, 0, code)
	require.Contains(t, out, "no encryption")
	requireNoSecrets(t, out)
}

// A client certificate logs in as its common name (pg_hba.conf: hostssl
// ... cert), with no password.
func TestPostgresClientCertificate(t *testing.T) {
	s := setup(t)
	s.postgres(t)
	ctx := ctxT(t)
	dsn := fmt.Sprintf("postgres://nudge_cert@127.0.0.1:%d/nudge?sslmode=verify-full&sslrootcert=%s&sslcert=%s&sslkey=%s",
		s.pg.Port, url.QueryEscape(s.ca.File), url.QueryEscape(s.clientCert), url.QueryEscape(s.clientKey))
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var who string
	var ssl bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()`).Scan(&who, &ssl))
	require.Equal(t, "nudge_cert", who)
	require.True(t, ssl)

	// Without the certificate the same user has no way in.
	_, err = pgx.Connect(ctx, fmt.Sprintf("postgres://nudge_cert@127.0.0.1:%d/nudge?sslmode=verify-full&sslrootcert=%s",
		s.pg.Port, url.QueryEscape(s.ca.File)))
	require.ErrorContains(t, err, "certificate")
}
