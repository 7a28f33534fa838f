package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
)

// TestMain lets the test binary stand in for nudge-bench as the fake
// provider's process: startFakeProvider runs os.Executable with
// -serve-fake-provider, which is this binary under go test.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-serve-fake-provider" {
		if err := flag.CommandLine.Parse(os.Args[2:]); err != nil {
			os.Exit(2)
		}
		if err := serveFakeProvider(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "serve-fake-provider:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The fake provider's process answers as fakesms's handler does through
// net/http's server, byte for byte but for Date's value: an accept, a
// duplicate and refusals, on one connection.
func TestFakeProviderWire(t *testing.T) {
	fp, err := startFakeProvider()
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			fp.stop()
		}
	}()
	ref := httptest.NewServer(fakesms.New())
	defer ref.Close()
	ok := `{"to":"+14150000001","body":"Your course expires","reference":"42","tenant":"acme"}`
	send := func(key, body string) string {
		h := "POST /v1/messages HTTP/1.1\r\nHost: sms.test\r\nContent-Type: application/json\r\n"
		if key != "" {
			h += "Idempotency-Key: " + key + "\r\n"
		}
		return h + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	reqs := []string{send("k1", ok), send("k1", ok), send("", ok), send("k2", `{"to":`), send("k3", `{"to":"+1"}`)}
	answers := func(addr string) []string {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		var out []string
		for _, req := range reqs {
			if _, err := io.WriteString(c, req); err != nil {
				t.Fatal(err)
			}
			var raw bytes.Buffer
			resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(br, &raw)), nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			out = append(out, regexp.MustCompile(`Date: [^\r]*`).ReplaceAllString(raw.String(), "Date: -"))
		}
		return out
	}
	got, want := answers(strings.TrimPrefix(fp.URL, "http://")), answers(ref.Listener.Addr().String())
	for i := range reqs {
		if got[i] != want[i] {
			t.Errorf("request %d: got\n%q\nwant\n%q", i, got[i], want[i])
		}
	}
	stopped = true
	if n := fp.stop(); n != 1 {
		t.Errorf("the fake provider counted %d connections, want 1", n)
	}
}

// procCPU is a process's user+system CPU seconds, from /proc/<pid>/stat.
func procCPU(tb testing.TB, pid int) float64 {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		tb.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / clockTicks
}

// benchSenders is how many sends BenchmarkFakeProvider keeps in flight: about
// what two in-process workers of the end-to-end runs keep (concurrency 4,
// batches of 50 sent at once, several batches in flight each).
const benchSenders = 64

// BenchmarkFakeProvider drives the fake provider's process, as the
// end-to-end runs start it, with the product's SMS client over loopback,
// benchSenders sends in flight, every send a new idempotency key (so the
// fake keeps a record of each, as over a run). fake-µs/op is the fake's
// process's CPU (user+system, from /proc) per send: the harness's cost
// that the end-to-end table's "fake provider" column counts.
//
//	go test ./cmd/nudge-bench -run '^$' -bench '^BenchmarkFakeProvider$' -benchtime 100000x -count 3
func BenchmarkFakeProvider(b *testing.B) {
	fp, err := startFakeProvider()
	if err != nil {
		b.Fatal(err)
	}
	defer fp.stop()
	client, err := sms.New(sms.Config{URL: fp.URL, Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(24 * time.Hour)
	pid := fp.cmd.Process.Pid
	var next atomic.Int64
	var failed atomic.Int64
	before := procCPU(b, pid)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range benchSenders {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				_, err := client.Send(b.Context(), provider.Message{
					ReminderID: i, IdempotencyKey: "bench-" + strconv.FormatInt(i, 10), Tenant: "tenant-1",
					Recipient: "+14150000001", Template: "course-expiry", Data: map[string]any{"course": "Go 101"},
					Deadline: deadline,
				})
				if err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	after := procCPU(b, pid)
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d sends failed", n)
	}
	b.ReportMetric((after-before)/float64(b.N)*1e6, "fake-µs/op")
	var st fakesms.Stats
	resp, err := http.Get(fp.URL + "/stats")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		b.Fatal(err)
	}
	if st.Accepted != b.N {
		b.Fatalf("the fake accepted %d of %d", st.Accepted, b.N)
	}
}
