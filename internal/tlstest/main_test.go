package tlstest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/testenv"
)

// The secrets every test configures. Each holds a reserved character of
// URLs; the broker's has no "#" (rabbitmq.conf would read a comment).
const (
	dbPassword    = "Qj/Kx@9:%?#Zw"
	mqPassword    = "Rb/Vw@7:%?Yt"
	smtpPassword  = "Sm/Tp@5:%?#Xq"
	smsToken      = "Tk/Aa@Bb:Cc%Dd?Ee#Ff"
	signingSecret = "Sg/Kk@Ll:Mm%Nn?Oo#Pp-0123456789abcdef"
	dbUser        = "nudge"
	mqUser        = "nudge-client"
)

// secrets are what must never be printed, each also as URLs encode it.
func secrets() []string {
	var out []string
	for _, s := range []string{dbPassword, mqPassword, smtpPassword, smsToken, signingSecret} {
		out = append(out, s, url.QueryEscape(s), url.PathEscape(s), url.UserPassword("u", s).String()[2:])
	}
	return out
}

// servers are started once for the package: a RabbitMQ node takes seconds
// to boot.
type servers struct {
	dir        string
	ca, wrong  *testenv.CA
	clientCert string // CN nudge_cert (PostgreSQL) ...
	clientKey  string
	mqCert     string // ... and CN nudge-client (RabbitMQ)
	mqKey      string
	pg         *testenv.TLSPostgres
	mq         *testenv.TLSRabbitMQ
	pgErr      error
	mqErr      error
}

var (
	shared   servers
	startErr error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.pg != nil {
		shared.pg.Stop()
	}
	if shared.mq != nil {
		shared.mq.Stop()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

var once sync.Once

// start makes the CAs and certificates and starts both servers side by side.
func start() {
	dir, err := os.MkdirTemp("", "nudge-tlstest-")
	if err != nil {
		startErr = err
		return
	}
	// The servers get copies of what they need: the PostgreSQL server's
	// user may not be able to read this directory.
	shared.dir = dir
	if shared.ca, err = testenv.NewCA(dir, "ca"); err == nil {
		shared.wrong, err = testenv.NewCA(dir, "other-ca")
	}
	var srvCert, srvKey string
	if err == nil {
		srvCert, srvKey, err = shared.ca.Server("server")
	}
	if err == nil {
		shared.clientCert, shared.clientKey, err = shared.ca.Client("pg-client", "nudge_cert")
	}
	if err == nil {
		shared.mqCert, shared.mqKey, err = shared.ca.Client("mq-client", mqUser)
	}
	if err != nil {
		startErr = err
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		shared.pg, shared.pgErr = testenv.StartTLSPostgres(ctx, srvCert, srvKey, shared.ca.File)
		if shared.pgErr == nil {
			shared.pgErr = shared.pg.Admin(ctx,
				fmt.Sprintf(`CREATE ROLE %s LOGIN SUPERUSER PASSWORD '%s'`, dbUser, dbPassword),
				`CREATE ROLE nudge_cert LOGIN`,
				`CREATE DATABASE nudge OWNER `+dbUser,
				`CREATE DATABASE nudge_run OWNER `+dbUser)
		}
	})
	wg.Go(func() {
		shared.mq, shared.mqErr = testenv.StartTLSRabbitMQ(ctx, srvCert, srvKey, shared.ca.File, mqUser, mqPassword)
	})
	wg.Wait()
}

func setup(t *testing.T) *servers {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL and RabbitMQ servers of its own")
	}
	once.Do(start)
	if startErr != nil {
		t.Fatalf("making certificates: %v", startErr)
	}
	return &shared
}

// postgres is the TLS-only cluster, or the test fails (CI) or skips.
func (s *servers) postgres(t *testing.T) *testenv.TLSPostgres {
	t.Helper()
	if s.pgErr != nil {
		testenv.Unavailable(t, "a PostgreSQL cluster of the test's own", "apt-get install postgresql (scripts/ensure-services.sh)", s.pgErr)
	}
	return s.pg
}

func (s *servers) rabbitmq(t *testing.T) *testenv.TLSRabbitMQ {
	t.Helper()
	if s.mqErr != nil {
		testenv.Unavailable(t, "a RabbitMQ node of the test's own", "apt-get install rabbitmq-server (scripts/ensure-services.sh)", s.mqErr)
	}
	return s.mq
}

// dbURL connects as dbUser to database db, verifying the server against ca.
func (s *servers) dbURL(db string, ca *testenv.CA) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=verify-full&sslrootcert=%s",
		url.UserPassword(dbUser, dbPassword), s.pg.Port, db, url.QueryEscape(ca.File))
}

// amqpURL connects as mqUser with its password, verifying against ca.
func (s *servers) amqpURL(ca *testenv.CA) string {
	return fmt.Sprintf("amqps://%s@127.0.0.1:%d/?cacertfile=%s",
		url.UserPassword(mqUser, mqPassword), s.mq.Port, url.QueryEscape(ca.File))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
