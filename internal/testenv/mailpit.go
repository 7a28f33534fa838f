package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// MailpitInstall is how to provide Mailpit when it is missing.
const MailpitInstall = "go install github.com/axllent/mailpit@v1.33.1"

// ErrMailpitNotFound means no mailpit binary was found; StartMailpit's error
// wraps it so a harness can tell "not installed" from "failed to start".
var ErrMailpitNotFound = errors.New("mailpit binary not found")

// MailpitServer is one Mailpit process: an SMTP sink with an HTTP API to read
// what it received. Each test gets its own, so message counts are exact.
type MailpitServer struct {
	cmd      *exec.Cmd
	smtpAddr string
	httpAddr string
	logPath  string
	ownDir   string // removed by Stop when StartMailpit created it
	http     *http.Client

	exited  chan struct{} // closed when the process has exited
	waitErr error         // set before exited is closed

	stopOnce sync.Once
}

// MailpitMessage is a message as Mailpit's list API summarises it.
type MailpitMessage struct {
	// ID is Mailpit's database ID, for Message and Headers.
	ID string
	// MessageID is the Message-ID header without angle brackets.
	MessageID string
	// From is the From address (no display name).
	From string
	// To are the To addresses (no display names).
	To      []string
	Subject string
	// Created is when Mailpit received the message.
	Created time.Time
	Size    uint64
	Snippet string
}

// MailpitMessageDetail is one message with its decoded bodies.
type MailpitMessageDetail struct {
	ID        string
	MessageID string
	From      string
	To        []string
	Subject   string
	// Date is the Date header, or the receive time if there was none.
	Date time.Time
	// Text and HTML are the decoded text/plain and text/html parts.
	Text string
	HTML string
}

// MailpitChaos makes Mailpit's SMTP server fail on purpose; see
// https://mailpit.axllent.org/docs/integration/chaos/. A zero trigger never
// fires.
type MailpitChaos struct {
	Sender         MailpitChaosTrigger // fails MAIL FROM
	Recipient      MailpitChaosTrigger // fails RCPT TO
	Authentication MailpitChaosTrigger // fails AUTH
}

// MailpitChaosTrigger returns ErrorCode (400-599) with Probability percent
// (0-100).
type MailpitChaosTrigger struct {
	ErrorCode   int
	Probability int
}

// Mailpit starts a fresh Mailpit for the calling test and stops it when the
// test ends. extraArgs are appended to the command line, e.g.
// "--smtp-allowed-recipients", "@example\\.com$" to reject other recipients
// with 550, or "--smtp-auth-accept-any", "--smtp-auth-allow-insecure" to
// offer AUTH without TLS (Mailpit refuses those two with a TLS requirement,
// so they are not defaults). A missing binary is reported
// with Unavailable; one that fails to start fails the test.
//
// The binary is $NUDGE_TEST_MAILPIT_BIN, else mailpit on $PATH, else
// mailpit in $(go env GOBIN) or $(go env GOPATH)/bin.
func Mailpit(tb testing.TB, extraArgs ...string) *MailpitServer {
	tb.Helper()
	needs(tb, "Mailpit")
	bin, err := mailpitBinary()
	if err != nil {
		Unavailable(tb, "Mailpit", MailpitInstall, err)
		return nil
	}
	dir := tb.TempDir() // before Cleanup(Stop), so it is removed after Stop
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := startMailpit(ctx, bin, dir, extraArgs)
	if err != nil {
		tb.Fatalf("starting Mailpit: %v", err)
	}
	tb.Cleanup(srv.Stop)
	return srv
}

// StartMailpit starts Mailpit with its database in dir, for harnesses that
// have no testing.TB. dir "" means a new temporary directory, removed by
// Stop. The caller must call Stop.
func StartMailpit(ctx context.Context, dir string, extraArgs ...string) (*MailpitServer, error) {
	bin, err := mailpitBinary()
	if err != nil {
		return nil, fmt.Errorf("starting Mailpit (%s): %w", MailpitInstall, err)
	}
	own := ""
	if dir == "" {
		if dir, err = os.MkdirTemp("", "nudge-mailpit-"); err != nil {
			return nil, fmt.Errorf("starting Mailpit: %w", err)
		}
		own = dir
	}
	srv, err := startMailpit(ctx, bin, dir, extraArgs)
	if err != nil {
		if own != "" {
			_ = os.RemoveAll(own)
		}
		return nil, err
	}
	srv.ownDir = own
	return srv, nil
}

// mailpitBinary finds the mailpit executable.
func mailpitBinary() (string, error) {
	if p := os.Getenv("NUDGE_TEST_MAILPIT_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: NUDGE_TEST_MAILPIT_BIN: %w", ErrMailpitNotFound, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("mailpit"); err == nil {
		return p, nil
	}
	var candidates []string
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) == 2 {
			if gobin := strings.TrimSpace(lines[0]); gobin != "" {
				candidates = append(candidates, filepath.Join(gobin, "mailpit"))
			}
			for _, gp := range filepath.SplitList(strings.TrimSpace(lines[1])) {
				candidates = append(candidates, filepath.Join(gp, "bin", "mailpit"))
			}
		}
	} else if home, herr := os.UserHomeDir(); herr == nil {
		candidates = append(candidates, filepath.Join(home, "go", "bin", "mailpit"))
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w in NUDGE_TEST_MAILPIT_BIN, PATH or %s", ErrMailpitNotFound, strings.Join(candidates, ", "))
}

// startMailpit starts bin, retrying with new ports if the ones it picked were
// taken between choosing and binding.
func startMailpit(ctx context.Context, bin, dir string, extraArgs []string) (*MailpitServer, error) {
	var lastErr error
	for range 5 {
		srv, err := startMailpitOnce(ctx, bin, dir, extraArgs)
		if err == nil {
			return srv, nil
		}
		lastErr = err
		// Retry only the race this cannot prevent: a port chosen as free
		// taken before Mailpit bound it.
		if ctx.Err() != nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, lastErr
}

func startMailpitOnce(ctx context.Context, bin, dir string, extraArgs []string) (*MailpitServer, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, fmt.Errorf("starting Mailpit: %w", err)
	}
	srv := &MailpitServer{
		smtpAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
		httpAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])),
		logPath:  filepath.Join(dir, "mailpit.log"),
		http:     &http.Client{Timeout: 10 * time.Second},
		exited:   make(chan struct{}),
	}
	logFile, err := os.Create(srv.logPath)
	if err != nil {
		return nil, fmt.Errorf("starting Mailpit: %w", err)
	}
	args := []string{
		"--smtp", srv.smtpAddr,
		"--listen", srv.httpAddr,
		"--database", filepath.Join(dir, "mailpit.db"),
		"--max", "0", // keep every message: tests count them
		"--disable-version-check",
		"--smtp-disable-rdns",
		"--enable-chaos", // SetChaos; no failures until set
	}
	args = append(args, extraArgs...)
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Mailpit reads MP_* variables; keep the developer's own out of tests.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "MP_") })
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting Mailpit %s: %w", bin, err)
	}
	srv.cmd = cmd
	go func() {
		srv.waitErr = cmd.Wait()
		_ = logFile.Close()
		close(srv.exited)
	}()
	if err := srv.waitReady(ctx); err != nil {
		srv.Stop()
		return nil, fmt.Errorf("starting Mailpit %s: %w\n%s", strings.Join(cmd.Args, " "), err, srv.logTail())
	}
	return srv, nil
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		defer l.Close() // held until all are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitReady polls until the HTTP API reports ready and SMTP accepts
// connections, or the process exits.
func (s *MailpitServer) waitReady(ctx context.Context) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.ready(ctx) {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("mailpit exited early: %v", s.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("waiting for Mailpit to answer: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

func (s *MailpitServer) ready(ctx context.Context) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.APIURL()+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	c, err := net.DialTimeout("tcp", s.smtpAddr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// logTail returns the end of Mailpit's log, for error messages.
func (s *MailpitServer) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return ""
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return "mailpit log:\n" + strings.Join(lines, "\n")
}

// Stop stops Mailpit (SIGTERM, then SIGKILL after 5 seconds) and removes the
// directory StartMailpit created. It is idempotent.
func (s *MailpitServer) Stop() {
	s.stopOnce.Do(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			_ = s.cmd.Process.Signal(os.Interrupt)
			select {
			case <-s.exited:
			case <-time.After(5 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.exited
			}
		}
		if s.ownDir != "" {
			_ = os.RemoveAll(s.ownDir)
		}
	})
}

// SMTPURL is the SMTP address as an email.ParseSMTPURL URL, without TLS.
func (s *MailpitServer) SMTPURL() string { return "smtp://" + s.smtpAddr + "?tls=none" }

// SMTPAddr is the SMTP host:port.
func (s *MailpitServer) SMTPAddr() string { return s.smtpAddr }

// APIURL is the base URL of the web UI and API, without a trailing slash.
func (s *MailpitServer) APIURL() string { return "http://" + s.httpAddr }

// LogPath is Mailpit's log file.
func (s *MailpitServer) LogPath() string { return s.logPath }

// Messages returns every message Mailpit holds, oldest first.
func (s *MailpitServer) Messages(ctx context.Context) ([]MailpitMessage, error) {
	const pageSize = 1000
	seen := map[string]bool{}
	var all []MailpitMessage
	for start := 0; ; start += pageSize {
		page, err := s.listPage(ctx, start, pageSize)
		if err != nil {
			return nil, err
		}
		// The list is newest first, so a message arriving meanwhile shifts
		// older ones to later pages: skip the repeats.
		for _, m := range page.Messages {
			if !seen[m.ID] {
				seen[m.ID] = true
				all = append(all, m.summary())
			}
		}
		if len(page.Messages) < pageSize || start+pageSize >= page.Total {
			break
		}
	}
	slices.Reverse(all)
	slices.SortStableFunc(all, func(a, b MailpitMessage) int { return a.Created.Compare(b.Created) })
	return all, nil
}

// Count returns how many messages Mailpit holds.
func (s *MailpitServer) Count(ctx context.Context) (int, error) {
	page, err := s.listPage(ctx, 0, 1)
	if err != nil {
		return 0, err
	}
	return page.Total, nil
}

// WaitForCount polls until Mailpit holds at least n messages and returns
// them all, oldest first. It gives up when ctx ends.
func (s *MailpitServer) WaitForCount(ctx context.Context, n int) ([]MailpitMessage, error) {
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		have, err := s.Count(ctx)
		if err == nil && have >= n {
			return s.Messages(ctx)
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return nil, fmt.Errorf("waiting for %d Mailpit messages: %w (last error: %v)", n, ctx.Err(), err)
			}
			return nil, fmt.Errorf("waiting for %d Mailpit messages, have %d: %w", n, have, ctx.Err())
		case <-tick.C:
		}
	}
}

// Message returns one message with its text and HTML bodies.
func (s *MailpitServer) Message(ctx context.Context, id string) (MailpitMessageDetail, error) {
	var m struct {
		ID        string
		MessageID string
		From      *apiAddress
		To        []apiAddress
		Subject   string
		Date      time.Time
		Text      string
		HTML      string
	}
	if err := s.getJSON(ctx, "/api/v1/message/"+url.PathEscape(id), &m); err != nil {
		return MailpitMessageDetail{}, fmt.Errorf("getting Mailpit message %s: %w", id, err)
	}
	return MailpitMessageDetail{
		ID: m.ID, MessageID: m.MessageID, From: m.From.address(), To: addresses(m.To),
		Subject: m.Subject, Date: m.Date, Text: m.Text, HTML: m.HTML,
	}, nil
}

// Headers returns a message's headers, keys canonicalised as net/mail does.
func (s *MailpitServer) Headers(ctx context.Context, id string) (map[string][]string, error) {
	var h map[string][]string
	if err := s.getJSON(ctx, "/api/v1/message/"+url.PathEscape(id)+"/headers", &h); err != nil {
		return nil, fmt.Errorf("getting Mailpit headers of %s: %w", id, err)
	}
	return h, nil
}

// DeleteAll deletes every message.
func (s *MailpitServer) DeleteAll(ctx context.Context) error {
	if err := s.do(ctx, http.MethodDelete, "/api/v1/messages", nil, nil); err != nil {
		return fmt.Errorf("deleting Mailpit messages: %w", err)
	}
	return nil
}

// SetChaos replaces the SMTP failure triggers. MailpitChaos{} turns them off.
func (s *MailpitServer) SetChaos(ctx context.Context, c MailpitChaos) error {
	body, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("setting Mailpit chaos: %w", err)
	}
	if err := s.do(ctx, http.MethodPut, "/api/v1/chaos", body, nil); err != nil {
		return fmt.Errorf("setting Mailpit chaos: %w", err)
	}
	return nil
}

type apiAddress struct {
	Name    string
	Address string
}

func (a *apiAddress) address() string {
	if a == nil {
		return ""
	}
	return a.Address
}

func addresses(as []apiAddress) []string {
	out := make([]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.Address)
	}
	return out
}

type apiSummary struct {
	ID        string
	MessageID string
	From      *apiAddress
	To        []apiAddress
	Subject   string
	Created   time.Time
	Size      uint64
	Snippet   string
}

func (m apiSummary) summary() MailpitMessage {
	return MailpitMessage{
		ID: m.ID, MessageID: m.MessageID, From: m.From.address(), To: addresses(m.To),
		Subject: m.Subject, Created: m.Created, Size: m.Size, Snippet: m.Snippet,
	}
}

type apiList struct {
	Total    int `json:"total"`
	Messages []apiSummary
}

func (s *MailpitServer) listPage(ctx context.Context, start, limit int) (apiList, error) {
	var page apiList
	path := "/api/v1/messages?start=" + strconv.Itoa(start) + "&limit=" + strconv.Itoa(limit)
	if err := s.getJSON(ctx, path, &page); err != nil {
		return apiList{}, fmt.Errorf("listing Mailpit messages: %w", err)
	}
	return page, nil
}

func (s *MailpitServer) getJSON(ctx context.Context, path string, out any) error {
	return s.do(ctx, http.MethodGet, path, nil, out)
}

// do sends one API request and decodes a JSON response into out, if not nil.
func (s *MailpitServer) do(ctx context.Context, method, path string, body []byte, out any) error {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.APIURL()+path, r)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decoding response: %w", method, path, err)
	}
	return nil
}
