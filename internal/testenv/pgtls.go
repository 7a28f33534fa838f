package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// TLSPostgres is a PostgreSQL server of a test's own, on a spare loopback
// port, that accepts only TLS connections: passwords (scram-sha-256) for
// every user, and the client certificate for CertUser. Plain connections
// have no pg_hba.conf entry.
type TLSPostgres struct {
	Port int
	// CertUser logs in with a client certificate (cert authentication).
	CertUser string
	dir      string
	bin      string
	owner    *user.User // runs the server when this process is root
}

// ErrPostgresServerNotFound means no initdb was found under
// /usr/lib/postgresql/*/bin (install the postgresql package).
var ErrPostgresServerNotFound = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found")

// StartTLSPostgres initialises a cluster in a new temporary directory and
// starts it with the server certificate (certFile, keyFile) and caFile as
// the authority for client certificates. PostgreSQL refuses to run as
// root, so as root the cluster belongs to the user postgres.
func StartTLSPostgres(ctx context.Context, certFile, keyFile, caFile string) (*TLSPostgres, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return nil, ErrPostgresServerNotFound
	}
	slices.SortFunc(bins, func(a, b string) int { return pgVersion(a) - pgVersion(b) })
	pg := &TLSPostgres{bin: filepath.Dir(bins[len(bins)-1]), CertUser: "nudge_cert"}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running PostgreSQL as root is refused, and there is no user postgres: %w", err)
		}
		pg.owner = u
	}
	dir, err := os.MkdirTemp("", "nudge-pgtls-")
	if err != nil {
		return nil, err
	}
	pg.dir = dir
	ok := false
	defer func() {
		if !ok {
			pg.Stop()
		}
	}()
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	pg.Port = ports[0]
	// The server's copies of the certificates: the key must belong to the
	// server's user and be readable by it only.
	for src, dst := range map[string]string{certFile: "server.crt", keyFile: "server.key", caFile: "ca.crt"} {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o600); err != nil {
			return nil, err
		}
	}
	if err := pg.chown(dir); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if out, err := pg.run(ctx, "initdb", "-D", data, "-U", "postgres", "-A", "trust", "--no-sync"); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	hba := "local all postgres trust\n" +
		"hostssl all " + pg.CertUser + " 127.0.0.1/32 cert\n" +
		"hostssl all all 127.0.0.1/32 scram-sha-256\n"
	conf := fmt.Sprintf("\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n"+
		"ssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\nssl_ca_file = '%s'\n"+
		"password_encryption = 'scram-sha-256'\nfsync = off\nmax_connections = 40\nshared_buffers = '16MB'\n",
		pg.Port, dir, filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"), filepath.Join(dir, "ca.crt"))
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = f.WriteString(conf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if err := pg.chown(dir); err != nil {
		return nil, err
	}
	if out, err := pg.run(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "server.log"), "-w", "-t", "30", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		return nil, fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	ok = true
	return pg, nil
}

func pgVersion(initdb string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return n
}

// Admin runs SQL statements as the superuser, over the Unix socket.
func (pg *TLSPostgres) Admin(ctx context.Context, stmts ...string) error {
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", pg.dir, pg.Port))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// Log is the server's log so far.
func (pg *TLSPostgres) Log() string {
	b, _ := os.ReadFile(filepath.Join(pg.dir, "server.log"))
	return string(b)
}

// Stop stops the server and removes its directory.
func (pg *TLSPostgres) Stop() {
	if pg.dir == "" {
		return
	}
	data := filepath.Join(pg.dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, _ = pg.run(ctx, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
		cancel()
	}
	_ = os.RemoveAll(pg.dir)
	pg.dir = ""
}

// run runs one of the server's programs as the server's user.
func (pg *TLSPostgres) run(ctx context.Context, prog string, args ...string) (string, error) {
	path := filepath.Join(pg.bin, prog)
	cmd := exec.CommandContext(ctx, path, args...)
	if pg.owner != nil {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", pg.owner.Username, "--", path}, args...)...)
	}
	cmd.Dir = pg.dir
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (pg *TLSPostgres) chown(dir string) error {
	if pg.owner == nil {
		return nil
	}
	uid, _ := strconv.Atoi(pg.owner.Uid)
	gid, _ := strconv.Atoi(pg.owner.Gid)
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
