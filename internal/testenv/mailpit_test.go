package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"net/smtp"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// sendRaw delivers a minimal message with net/smtp, so this test does not
// depend on the email package it exists to serve.
func sendRaw(t *testing.T, addr, to, subject, messageID string) {
	t.Helper()
	body := "From: test@example.com\r\n" +
		"To: " + to + "\r\n" +
		"Subject: " + subject + "\r\n" +
		"Message-ID: <" + messageID + ">\r\n" +
		"X-Test: yes\r\n" +
		"\r\n" +
		"hello\r\n"
	require.NoError(t, smtp.SendMail(addr, nil, "test@example.com", []string{to}, []byte(body)))
}

func TestMailpitReceivesAndPaginates(t *testing.T) {
	t.Parallel()
	mp := testenv.Mailpit(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	require.True(t, strings.HasPrefix(mp.SMTPURL(), "smtp://127.0.0.1:"), mp.SMTPURL())
	require.True(t, strings.HasSuffix(mp.SMTPURL(), "?tls=none"), mp.SMTPURL())

	// More than one page of the list API (1000), to exercise pagination.
	const n = 1005
	for i := range n {
		sendRaw(t, mp.SMTPAddr(), fmt.Sprintf("r%d@example.com", i), fmt.Sprintf("s%d", i), fmt.Sprintf("id-%d@test", i))
	}
	msgs, err := mp.WaitForCount(ctx, n)
	require.NoError(t, err)
	require.Len(t, msgs, n)
	seen := map[string]bool{}
	for _, m := range msgs {
		require.False(t, seen[m.ID], "duplicate ID %s", m.ID)
		seen[m.ID] = true
	}
	first := msgs[0]
	require.Equal(t, "id-0@test", first.MessageID)
	require.Equal(t, "test@example.com", first.From)
	require.Equal(t, []string{"r0@example.com"}, first.To)
	require.Equal(t, "s0", first.Subject)
	require.WithinDuration(t, time.Now(), first.Created, time.Minute)

	h, err := mp.Headers(ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, []string{"yes"}, h["X-Test"])

	d, err := mp.Message(ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, "hello", strings.TrimSpace(d.Text))

	require.NoError(t, mp.DeleteAll(ctx))
	c, err := mp.Count(ctx)
	require.NoError(t, err)
	require.Zero(t, c)
}

func TestMailpitInstancesAreIsolated(t *testing.T) {
	t.Parallel()
	a, b := testenv.Mailpit(t), testenv.Mailpit(t)
	require.NotEqual(t, a.SMTPAddr(), b.SMTPAddr())
	sendRaw(t, a.SMTPAddr(), "x@example.com", "only a", "iso@test")
	ctx := t.Context()
	_, err := a.WaitForCount(ctx, 1)
	require.NoError(t, err)
	n, err := b.Count(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestMailpitWaitForCountHonoursContext(t *testing.T) {
	t.Parallel()
	mp := testenv.Mailpit(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := mp.WaitForCount(ctx, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestStartMailpitWithoutTB(t *testing.T) {
	t.Parallel()
	mp, err := testenv.StartMailpit(t.Context(), "")
	if errors.Is(err, testenv.ErrMailpitNotFound) {
		testenv.Unavailable(t, "Mailpit", testenv.MailpitInstall, err)
	}
	require.NoError(t, err)
	t.Cleanup(mp.Stop)
	dir := filepath.Dir(mp.LogPath())
	sendRaw(t, mp.SMTPAddr(), "x@example.com", "harness", "h@test")
	_, err = mp.WaitForCount(t.Context(), 1)
	require.NoError(t, err)
	mp.Stop()
	mp.Stop() // idempotent
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist, "Stop removes the directory StartMailpit created")
}
