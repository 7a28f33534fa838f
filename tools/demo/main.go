// Command demo runs Nudge end to end on this machine, as separate processes
// built by `make build`: it starts Mailpit and the fake SMS provider on
// loopback, and the tenants' application that webhook reminders reach (app.go),
// migrates a fresh schema, schedules 1,000 reminders over the three channels
// and several tenants (some already past their deadline, some canceled), runs
// the dispatcher, the three workers and the reconciler until every reminder is
// terminal, prints the outcomes per channel and state, checks them against
// what the sinks and the application received, and stops and removes
// everything it started. With --console (make demo CONSOLE=1) it
// first serves the web console on the run's data, prints its address and
// token, and waits for Ctrl-C.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/testenv"
)

const (
	reminders  = 1000
	tenants    = 4
	signingKey = "demo:demo-signing-secret-0123456789abcdef"
	// webhookRoot is the webhook worker's root secret (--webhook-secrets);
	// each tenant's application verifies with its derivation.
	webhookRoot = "demo-webhook-root-secret-0123456789abcdef"
)

func main() {
	console := flag.Bool("console", false, "at the end, serve the web console on this run's data until Ctrl-C")
	flag.Parse()
	if err := run(*console); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

type procs struct{ list []*exec.Cmd }

func (p *procs) start(logDir, name string, env []string, bin string, args ...string) error {
	logf, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p.list = append(p.list, cmd)
	return nil
}

// stop sends SIGTERM to every process and waits for them to exit.
func (p *procs) stop() {
	for _, c := range p.list {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range p.list {
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	}
	p.list = nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func run(console bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, _ := os.Getwd()
	bin := filepath.Join(root, "bin")
	for _, b := range []string{"dispatcher", "email-worker", "sms-worker", "webhook-worker", "reconciler", "nudgectl", "fake-sms"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Errorf("bin/%s is missing: run `make build` first", b)
		}
	}
	id := time.Now().UTC().Format("20060102_150405")
	runDir := filepath.Join(root, ".demo", id)
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	fmt.Printf("Nudge demo %s (logs in %s)\n", id, runDir)

	// Database: a fresh schema in the local test database.
	baseURL := os.Getenv("NUDGE_DEMO_DATABASE_URL")
	if baseURL == "" {
		baseURL = testenv.DefaultDatabaseURL
	}
	schema := "nudge_demo_" + id
	admin, err := pgxpool.New(ctx, baseURL)
	if err != nil {
		return fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return fmt.Errorf("creating schema %s: %w", schema, err)
	}
	defer func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") }()
	u, _ := url.Parse(baseURL)
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	dbURL := u.String()

	// Sinks: Mailpit (real SMTP) and the fake SMS provider, on loopback.
	mailDir := filepath.Join(runDir, "mailpit")
	if err := os.MkdirAll(mailDir, 0o755); err != nil {
		return err
	}
	mail, err := testenv.StartMailpit(ctx, mailDir)
	if err != nil {
		return fmt.Errorf("starting Mailpit: %w", err)
	}
	defer mail.Stop()
	smsPort, err := freePort()
	if err != nil {
		return err
	}
	smsURL := fmt.Sprintf("http://127.0.0.1:%d", smsPort)

	amqpURL := testenv.DefaultAMQPURL
	if v := os.Getenv("NUDGE_DEMO_AMQP_URL"); v != "" {
		amqpURL = v
	}
	prefix := "nudge-demo-" + strings.ReplaceAll(id, "_", "-")
	defer deleteTopology(amqpURL, prefix)

	env := []string{
		"NUDGE_DATABASE_URL=" + dbURL, "NUDGE_AMQP_URL=" + amqpURL, "NUDGE_SIGNING_KEYS=" + signingKey,
		"NUDGE_QUEUE_PREFIX=" + prefix, "NUDGE_SMTP_URL=" + mail.SMTPURL(), "NUDGE_SMS_URL=" + smsURL,
		"NUDGE_LOG_FORMAT=json", "NUDGE_LISTEN=",
	}
	var sinks, p procs
	defer sinks.stop()
	defer p.stop()
	// The provider misbehaves a little, so retries show in the outcome.
	if err := sinks.start(runDir, "fake-sms", env, filepath.Join(bin, "fake-sms"),
		"--listen", fmt.Sprintf("127.0.0.1:%d", smsPort), "--rate-5xx", "0.05", "--rate-429", "0.03", "--retry-after", "1"); err != nil {
		return err
	}
	if err := waitHTTP(ctx, smsURL+"/healthz"); err != nil {
		return fmt.Errorf("fake SMS provider: %w", err)
	}

	// The tenants' application, and the targets file that lets each tenant's
	// webhooks reach it on loopback (refused unless its network is listed).
	application, appURL, err := startApp(webhookRoot)
	if err != nil {
		return fmt.Errorf("starting the application: %w", err)
	}
	defer application.stop()
	targets := filepath.Join(runDir, "targets.json")
	if err := writeTargets(targets); err != nil {
		return err
	}

	nudgectl := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "nudgectl"), args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The schema (a fresh one: no previous release runs, so the
	// after-rollout step too), and the broker topology the fleet only
	// checks at start.
	if out, err := nudgectl("migrate", "--after-rollout", "--declare-topology"); err != nil {
		return fmt.Errorf("nudgectl migrate: %v\n%s", err, out)
	}

	// Intent: 1,000 reminders through the bulk intake path.
	file := filepath.Join(runDir, "reminders.jsonl")
	canceled, err := writeReminders(file, time.Now(), appURL)
	if err != nil {
		return err
	}
	out, err := nudgectl("schedule", "-f", file)
	fmt.Print("schedule: ", out)
	if err != nil {
		return fmt.Errorf("nudgectl schedule: %v", err)
	}
	for _, c := range canceled {
		if out, err := nudgectl("cancel", "--tenant", c[0], "--key", c[1], "--reason", "learner unsubscribed"); err != nil {
			return fmt.Errorf("nudgectl cancel: %v\n%s", err, out)
		}
	}
	fmt.Printf("canceled %d reminders before dispatch\n", len(canceled))

	// The fleet.
	start := time.Now()
	workerFlags := []string{"--backoff-base", "500ms", "--max-attempts", "6"}
	// The webhook worker's root secret goes in its environment, as a
	// Secret would put it, not on its command line.
	webhookEnv := append(slices.Clip(env), "NUDGE_TARGETS="+targets, "NUDGE_WEBHOOK_SECRETS=demo:"+webhookRoot)
	for _, s := range []struct {
		name string
		env  []string
		args []string
	}{
		{"dispatcher", env, []string{"--every", "1s"}},
		{"email-worker", env, workerFlags},
		{"sms-worker", env, workerFlags},
		{"webhook-worker", webhookEnv, workerFlags},
		{"reconciler", env, []string{"--every", "2s", "--overdue", "1m"}},
	} {
		if err := p.start(runDir, s.name, s.env, filepath.Join(bin, s.name), s.args...); err != nil {
			return err
		}
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	for {
		var open int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state
			WHERE state NOT IN ('delivered', 'failed', 'expired', 'canceled')`).Scan(&open); err != nil {
			return fmt.Errorf("counting open reminders: %w", err)
		}
		if open == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d reminders still open when the demo's time ran out (logs in %s)", open, runDir)
		case <-time.After(500 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	p.stop()

	counts, err := countStates(ctx, pool)
	if err != nil {
		return err
	}
	mails, err := mail.Count(ctx)
	if err != nil {
		return fmt.Errorf("reading Mailpit: %w", err)
	}
	smsAccepted, err := fakeSMSAccepted(smsURL)
	if err != nil {
		return err
	}
	fmt.Printf("\nEvery reminder reached a terminal state in %s.\n\n", elapsed.Round(100*time.Millisecond))
	if err := ctl.PrintOutcomeTable(os.Stdout, counts); err != nil {
		return err
	}
	var attempts, retried int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT reminder_id) FILTER (WHERE attempt > 1)
		FROM delivery_attempts`).Scan(&attempts, &retried); err != nil {
		return fmt.Errorf("counting attempts: %w", err)
	}
	hooks := application.stats()
	fmt.Printf("\n%d send attempts; %d reminders needed more than one (the SMS provider answers 5%% 503 and 3%% 429, the application 503 to one key in 20 at first).", attempts, retried)
	fmt.Printf("\nSinks: Mailpit received %d emails; the SMS provider accepted %d messages; the application verified %d signed webhook requests for %d keys (%d cleanups performed, %d already absent, %d keys retried).\n",
		mails, smsAccepted, hooks.Requests, hooks.Keys, hooks.Performed, hooks.Absent, hooks.Retried)
	results, err := webhookResults(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Printf("Delivered: %d email, %d sms, %d webhook (recorded on their attempts: %d performed, %d already absent).\n",
		counts["email"]["delivered"], counts["sms"]["delivered"], counts["webhook"]["delivered"],
		results["performed"], results["already_absent"])
	if int64(mails) != counts["email"]["delivered"] || int64(smsAccepted) != counts["sms"]["delivered"] ||
		int64(hooks.Keys) != counts["webhook"]["delivered"] ||
		results["performed"] != int64(hooks.Performed) || results["already_absent"] != int64(hooks.Absent) {
		return errors.New("the sinks disagree with the delivered counts")
	}
	if hooks.Invalid > 0 {
		return fmt.Errorf("the application refused %d webhook requests whose signature did not verify", hooks.Invalid)
	}
	if !console {
		fmt.Println("\nTo browse this run in the web console (search, timelines, dead letters): make demo CONSOLE=1")
		return nil
	}
	return serveConsole(runDir, env, filepath.Join(bin, "nudgectl"), &p)
}

// serveConsole runs `nudgectl console` on the demo's data, prints where and
// with which token, and waits for Ctrl-C (the caller's deferred cleanup then
// stops it and removes the schema and queues).
func serveConsole(runDir string, env []string, nudgectl string, p *procs) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return err
	}
	token := hex.EncodeToString(secret)
	tokenFile := filepath.Join(runDir, "console-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := p.start(runDir, "console", env, nudgectl, "console", "--listen", addr, "--token-file", tokenFile,
		"--show-recipients"); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := waitHTTP(wait, "http://"+addr+"/healthz"); err != nil {
		return fmt.Errorf("the console did not start (log: %s): %w", filepath.Join(runDir, "console.log"), err)
	}
	fmt.Printf("\nThe web console is at http://%s/ (sign in with any name and the token %s).\n", addr, token)
	fmt.Println("Press Ctrl-C to stop it and clean up.")
	<-ctx.Done()
	return nil
}

// writeReminders writes the demo's reminders as JSON Lines (email, SMS, and
// cleanups as webhooks to the application at appURL) and returns the
// (tenant, key) pairs it will cancel.
func writeReminders(path string, now time.Time, appURL string) ([][2]string, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	templates := []string{"course-expiry", "subscription-renewal", "certificate-cleanup"}
	var canceled [][2]string
	for i := range reminders {
		tenant := fmt.Sprintf("tenant-%c", 'a'+i%tenants)
		line := map[string]any{
			"tenant": tenant, "key": fmt.Sprintf("%s:learner-%d", templates[i%3], i),
			"template": templates[i%3],
			"data":     map[string]any{"learner": fmt.Sprintf("Learner %d", i), "course": "Go 101", "plan": "Pro", "certificate": "TLS"},
		}
		switch (i / 3) % 5 {
		case 0, 1:
			line["channel"], line["recipient"] = "email", fmt.Sprintf("learner%d@example.com", i)
		case 2, 3:
			line["channel"], line["recipient"] = "sms", fmt.Sprintf("+1415555%04d", i)
		default: // a cleanup in the tenant's application
			line["channel"] = "webhook"
			if i%3 == 0 {
				line["template"], line["key"] = "certificate-cleanup", fmt.Sprintf("certificate-cleanup:learner-%d", i)
				line["recipient"] = fmt.Sprintf("%s/tenants/%s/hooks/certificate-cleanup", appURL, tenant)
				line["data"] = map[string]any{"method": "POST", "body": map[string]any{"learner": i, "certificates": []int{7, 9}}}
			} else {
				draft := i/15 + 1
				line["template"], line["key"] = "draft-cleanup", fmt.Sprintf("draft-cleanup:learner-%d:draft-%d", i, draft)
				line["recipient"] = fmt.Sprintf("%s/tenants/%s/learners/%d/drafts/%d", appURL, tenant, i, draft)
				line["data"] = map[string]any{}
			}
		}
		due, deadline := now.Add(-time.Minute), now.Add(time.Hour)
		switch {
		case i%10 == 9: // the nightly job ran too late for these
			due, deadline = now.Add(-3*time.Hour), now.Add(-time.Hour)
		case i%10 == 4: // due a few seconds into the demo
			due = now.Add(time.Duration(2+i%5) * time.Second)
		case i%20 == 1, i%60 == 13: // the learner unsubscribed, the draft was submitted (a webhook)
			canceled = append(canceled, [2]string{tenant, line["key"].(string)})
		}
		line["due_at"], line["deadline"] = due.UTC().Format(time.RFC3339Nano), deadline.UTC().Format(time.RFC3339Nano)
		b, _ := json.Marshal(line)
		w.Write(b)
		w.WriteByte('\n')
	}
	return canceled, w.Flush()
}

// writeTargets writes the webhook worker's targets file: every tenant may
// reach the application on loopback, over plain HTTP.
func writeTargets(path string) error {
	ts := map[string]any{}
	for t := range tenants {
		ts[fmt.Sprintf("tenant-%c", 'a'+t)] = map[string]any{
			"hosts": []string{"127.0.0.1"}, "allow_networks": []string{"127.0.0.0/8"}, "allow_http": true,
		}
	}
	b, err := json.Marshal(map[string]any{"version": "demo", "tenants": ts})
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// webhookResults counts the delivered webhook attempts by what the
// application answered (webhook.Result: performed or already_absent).
func webhookResults(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	rows, err := pool.Query(ctx, `SELECT split_part(a.provider_message_id, ':', 1), count(*)
		  FROM delivery_attempts a JOIN reminders r ON r.id = a.reminder_id
		 WHERE r.channel = 'webhook' AND a.outcome = 'delivered' GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("counting webhook results: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var result string
		var n int64
		if err := rows.Scan(&result, &n); err != nil {
			return nil, err
		}
		out[result] = n
	}
	return out, rows.Err()
}

func countStates(ctx context.Context, pool *pgxpool.Pool) (map[string]map[string]int64, error) {
	rows, err := pool.Query(ctx, `SELECT channel, state, count(*) FROM reminder_state GROUP BY 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("counting reminders: %w", err)
	}
	defer rows.Close()
	out := map[string]map[string]int64{}
	for rows.Next() {
		var ch, st string
		var n int64
		if err := rows.Scan(&ch, &st, &n); err != nil {
			return nil, err
		}
		if out[ch] == nil {
			out[ch] = map[string]int64{}
		}
		out[ch][st] = n
	}
	return out, rows.Err()
}

func waitHTTP(ctx context.Context, u string) error {
	for range 100 {
		resp, err := http.Get(u)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not answer", u)
}

func fakeSMSAccepted(base string) (int, error) {
	resp, err := http.Get(base + "/stats")
	if err != nil {
		return 0, fmt.Errorf("reading the fake SMS provider: %w", err)
	}
	defer resp.Body.Close()
	var s struct {
		Accepted int `json:"accepted"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return 0, fmt.Errorf("reading the fake SMS provider: %w", err)
	}
	return s.Accepted, nil
}

func deleteTopology(amqpURL, prefix string) {
	conn, err := broker.Dial(amqpURL, "nudge-demo-cleanup")
	if err != nil {
		return
	}
	defer conn.Close()
	// The migration step declared the campaign planner's queues beside the
	// channels' (Topology.Planning): both go, or every demo run would leave
	// three quorum queues on the broker.
	t := broker.Topology{Prefix: prefix}.WithDefaults()
	for _, topo := range []broker.Topology{t, t.Planning()} {
		if ch, err := conn.Channel(); err == nil {
			_ = topo.Delete(ch)
		}
	}
}
