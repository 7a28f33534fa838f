package email_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/provider"
)

// Where a scripted SMTP server stops answering.
const (
	stallNever    = ""
	stallGreeting = "greeting"
	stallStartTLS = "starttls" // after "220 ready", before any TLS
	stallDataEnd  = "data-end" // the message is in, the reply never comes
)

// scriptedSMTP is a minimal SMTP server that answers everything with
// success until its stall point, then reads without answering until the
// client hangs up. It returns its address and a channel that receives once
// per message whose data came in.
func scriptedSMTP(t *testing.T, stallAt string) (string, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	got := make(chan struct{}, 16)
	var conns sync.WaitGroup
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() { converse(c, stallAt, got) })
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done; conns.Wait() })
	return ln.Addr().String(), got
}

func converse(c net.Conn, stallAt string, got chan<- struct{}) {
	defer c.Close()
	hang := func() { _, _ = io.Copy(io.Discard, c) } // until the client closes
	if stallAt == stallGreeting {
		hang()
		return
	}
	r := bufio.NewReader(c)
	say := func(s string) { _, _ = io.WriteString(c, s+"\r\n") }
	say("220 fake ESMTP")
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		verb := strings.ToUpper(strings.Fields(line + " x")[0])
		switch verb {
		case "EHLO", "HELO":
			if stallAt == stallStartTLS {
				say("250-fake")
				say("250-STARTTLS")
			}
			say("250 8BITMIME")
		case "STARTTLS":
			say("220 ready")
			hang()
			return
		case "DATA":
			say("354 go ahead")
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if l == ".\r\n" {
					break
				}
			}
			got <- struct{}{}
			if stallAt == stallDataEnd {
				hang()
				return
			}
			say("250 queued")
		case "QUIT":
			say("221 bye")
			return
		default:
			say("250 OK")
		}
	}
}

// scriptedSender is a Sender with one pooled connection to addr in TLS
// mode tls.
func scriptedSender(t *testing.T, addr string, tls email.TLSMode) *email.Sender {
	t.Helper()
	cfg, err := email.ParseSMTPURL("smtp://" + addr + "?from=reminders@nudge.test&insecure=1&pool=1")
	require.NoError(t, err)
	cfg.TLS = tls
	return newSender(t, cfg, "")
}

// The caller's deadline ends a send at whatever step the relay stalls, not
// Config.Timeout (15 s): go-mail sets its own connection deadlines from
// Config.Timeout, so the Sender closes the connection under it when ctx
// ends. The worker sets that deadline to the reminder's.
func TestSendIsCutAtTheCallersDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, stall string
		tls         email.TLSMode
	}{
		{"in the implicit TLS handshake", stallGreeting, email.TLSImplicit},
		{"in the STARTTLS handshake", stallStartTLS, email.TLSStartTLS},
		{"waiting for the reply to the message", stallDataEnd, email.TLSNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr, _ := scriptedSMTP(t, tc.stall)
			s := scriptedSender(t, addr, tc.tls)
			// The clock starts before the deadline is set: a send that ends
			// at its deadline took at least 300 ms from here.
			start := time.Now()
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			_, err := s.Send(ctx, reminder(1, "ada@example.com"))
			took := time.Since(start)
			requireKind(t, err, provider.Retryable, "timeout")
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.GreaterOrEqual(t, took, 300*time.Millisecond, "not before the deadline")
			require.Less(t, took, 5*time.Second, "at the deadline, not at Config.Timeout")
		})
	}
}

// The gate (provider.Message.Gate) runs once a connection is in hand: after
// the wait for a pooled connection, which can be long, and the dial. When
// it refuses, nothing is sent, and the connection goes back to the pool.
func TestGateRunsAfterThePoolWaitAndRefusalSendsNothing(t *testing.T) {
	t.Parallel()
	// One connection; the first send holds it, stalled, until its deadline.
	addr, got := scriptedSMTP(t, stallDataEnd)
	stalled := scriptedSender(t, addr, email.TLSNone)
	holder := make(chan error, 1)
	start := time.Now() // before the deadline is set, as in the test above
	hold, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	go func() { _, err := stalled.Send(hold, reminder(1, "ada@example.com")); holder <- err }()
	<-got // the first send holds the only connection
	var gateAt time.Duration
	m := reminder(2, "bob@example.com")
	m.Gate = func() error { gateAt = time.Since(start); return errors.New("deadline within the margin") }
	_, err := stalled.Send(t.Context(), m)
	requireKind(t, err, provider.Retryable, provider.CodeNotStarted)
	require.GreaterOrEqual(t, gateAt, 500*time.Millisecond, "the gate ran once the connection was free")
	requireKind(t, <-holder, provider.Retryable, "timeout")

	// On a relay that answers: a refused send leaves no mail and the pool
	// working; the next send goes out on the same connection.
	b := setup(t)
	calls := 0
	m = reminder(3, "carol@example.com")
	m.Gate = func() error { calls++; return errors.New("no") }
	_, err = b.sender.Send(ctxT(t), m)
	requireKind(t, err, provider.Retryable, provider.CodeNotStarted)
	n, err := b.mp.Count(ctxT(t))
	require.NoError(t, err)
	require.Zero(t, n, "nothing was sent")
	m.Gate = func() error { calls++; return nil }
	_, err = b.sender.Send(ctxT(t), m)
	require.NoError(t, err)
	require.Equal(t, 2, calls)
	_, err = b.mp.WaitForCount(ctxT(t), 1)
	require.NoError(t, err)
}
