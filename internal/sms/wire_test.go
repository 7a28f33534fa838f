package sms_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nudgehq/nudge/internal/sms"
	"github.com/stretchr/testify/require"
)

// TestSendWireFormat: the request the provider receives, headers and body
// byte for byte, is the one Send wrote before its request was built from
// parts kept per client (the golden below was dumped from that version,
// 27063d5, with the same message): strings that need escaping, HTML
// characters, U+2028, a control byte, invalid UTF-8.
func TestSendWireFormat(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	url := cannedServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := httputil.DumpRequest(r, true)
		require.NoError(t, err)
		got <- strings.Replace(string(b), "Host: "+r.Host+"\r\n", "Host: HOST\r\n", 1)
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"id":"prov-1"}`))
	})
	c, err := sms.New(sms.Config{URL: url + "/gateway/", Token: "tok", Sender: "NUDGE"})
	require.NoError(t, err)
	m := message("rem-42-v3")
	m.Data = map[string]any{"learner": "A<d>a & \"B\" \u2028 \x01 é \xff", "course": "Go\t101\n"}
	id, err := c.Send(t.Context(), m)
	require.NoError(t, err)
	require.Equal(t, "prov-1", id)
	want := "POST /gateway/v1/messages HTTP/1.1\r\nHost: HOST\r\nAccept: application/json\r\nAccept-Encoding: gzip\r\n" +
		"Authorization: Bearer tok\r\nContent-Length: 239\r\nContent-Type: application/json\r\nIdempotency-Key: rem-42-v3\r\n" +
		"User-Agent: Go-http-client/1.1\r\n\r\n" +
		`{"to":"+15555550100","body":"Hi A\u003cd\u003ea \u0026 \"B\" \u2028 \u0001 é \ufffd, your access to Go\t101\n expires on 31 Jan 2030. ` +
		`Finish your lessons before then to keep your progress.","reference":"42","tenant":"acme","from":"NUDGE"}`
	require.Equal(t, want, <-got)
}

// countingConn counts the writes to a connection.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestSendWritesRequestOnce: a send's request, headers and body, leaves in
// one write to the connection (net/http flushes the headers apart, a TCP
// segment more on each side, when it does not know the body is in memory).
func TestSendWritesRequestOnce(t *testing.T) {
	t.Parallel()
	url := cannedServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"id":"prov-1"}`))
	})
	var writes atomic.Int64
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		return countingConn{c, &writes}, err
	}}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := sms.New(sms.Config{URL: url, Token: "tok", HTTPClient: &http.Client{Transport: tr}})
	require.NoError(t, err)
	for i := range 3 {
		_, err := c.Send(t.Context(), message("k"))
		require.NoError(t, err)
		require.Equal(t, int64(i+1), writes.Load(), "writes after send %d", i+1)
	}
}
