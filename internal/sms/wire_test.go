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

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/stretchr/testify/require"
)

// dumpServer is a cannedServer answering with answer that first sends each
// request it receives, as it came on the wire (its Host as HOST), on the
// channel it returns.
func dumpServer(t *testing.T, answer http.HandlerFunc) (string, <-chan string) {
	t.Helper()
	got := make(chan string, 4)
	url := cannedServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, err := httputil.DumpRequest(r, true)
		require.NoError(t, err)
		got <- strings.Replace(string(b), "Host: "+r.Host+"\r\n", "Host: HOST\r\n", 1)
		answer(w, r)
	})
	return url, got
}

// wireMessage is the message the wire-format tests send: strings that need
// escaping, HTML characters, U+2028, a control byte, invalid UTF-8.
func wireMessage() provider.Message {
	m := message("rem-42-v3")
	m.Data = map[string]any{"learner": "A<d>a & \"B\" \u2028 \x01 é \xff", "course": "Go\t101\n"}
	return m
}

// TestSendWireFormat: the request the provider receives, headers and body
// byte for byte, through either transport, is the one Send wrote before its
// request was built from parts kept per client (wantWire was dumped from
// that version, 27063d5, with the same message): strings that need
// escaping, HTML characters, U+2028, a control byte, invalid UTF-8.
func TestSendWireFormat(t *testing.T) {
	t.Parallel()
	url, got := dumpServer(t, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"id":"prov-1"}`))
	})
	for _, tr := range transports {
		c, err := sms.New(sms.Config{URL: url + "/gateway/", Token: "tok", Sender: "NUDGE", HTTPClient: tr.http()})
		require.NoError(t, err)
		id, err := c.Send(t.Context(), wireMessage())
		require.NoError(t, err, tr.name)
		require.Equal(t, "prov-1", id)
		require.Equal(t, wantWire, <-got, tr.name)
	}
}

// wantWire is the request TestSendWireFormat's send must reach the provider
// as, dumped from 27063d5.
const wantWire = "POST /gateway/v1/messages HTTP/1.1\r\nHost: HOST\r\nAccept: application/json\r\nAccept-Encoding: gzip\r\n" +
	"Authorization: Bearer tok\r\nContent-Length: 239\r\nContent-Type: application/json\r\nIdempotency-Key: rem-42-v3\r\n" +
	"User-Agent: Go-http-client/1.1\r\n\r\n" +
	`{"to":"+15555550100","body":"Hi A\u003cd\u003ea \u0026 \"B\" \u2028 \u0001 é \ufffd, your access to Go\t101\n expires on 31 Jan 2030. ` +
	`Finish your lessons before then to keep your progress.","reference":"42","tenant":"acme","from":"NUDGE"}`

// TestTwilioWireFormat: the requests Twilio receives from a send and a
// lookup by SID, headers (the basic-auth Authorization among them) and body
// byte for byte, are the ones the client wrote when it built the
// Authorization header per request with SetBasicAuth (the golden below was
// dumped from that version, 29b3d7e, with the same message), through either
// transport.
func TestTwilioWireFormat(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			twilioWireFormat(t, tr.http())
		})
	}
}

func twilioWireFormat(t *testing.T, hc *http.Client) {
	url, got := dumpServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
		_, _ = w.Write([]byte(`{"sid":"SM123","status":"queued"}`))
	})
	c, err := sms.NewTwilio(sms.TwilioConfig{URL: url, AccountSID: testAccount, AuthToken: testToken, From: "+15005550006",
		StatusCallback: "https://hooks.example.com/twilio?x=1", HTTPClient: hc})
	require.NoError(t, err)
	require.Equal(t, hc == nil, sms.TwilioDirect(c))
	m := wireMessage()
	id, err := c.Send(t.Context(), m)
	require.NoError(t, err)
	require.Equal(t, "SM123", id)
	const auth = "Authorization: Basic QUMwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMTp0d2lsaW8tYXV0aC10b2tlbg==\r\n" // testAccount:testToken
	want := "POST /2010-04-01/Accounts/" + testAccount + "/Messages.json HTTP/1.1\r\nHost: HOST\r\nAccept: application/json\r\n" +
		"Accept-Encoding: gzip\r\n" + auth + "Content-Length: 307\r\nContent-Type: application/x-www-form-urlencoded\r\n" +
		"User-Agent: Go-http-client/1.1\r\n\r\n" +
		"Body=Hi+A%3Cd%3Ea+%26+%22B%22+%E2%80%A8+%01+%C3%A9+%FF%2C+your+access+to+Go%09101%0A+expires+on+31+Jan+2030." +
		"+Finish+your+lessons+before+then+to+keep+your+progress.%0Aref+a1076f6edb&From=%2B15005550006" +
		"&StatusCallback=https%3A%2F%2Fhooks.example.com%2Ftwilio%3Fnudge_ref%3Da1076f6edb%26x%3D1&To=%2B15555550100"
	require.Equal(t, want, <-got)

	m.Earlier = []provider.Earlier{{ProviderID: "SM123"}}
	id, err = c.Lookup(t.Context(), m)
	require.NoError(t, err)
	require.Equal(t, "SM123", id)
	require.Equal(t, "GET /2010-04-01/Accounts/"+testAccount+"/Messages/SM123.json HTTP/1.1\r\nHost: HOST\r\n"+
		"Accept: application/json\r\nAccept-Encoding: gzip\r\n"+auth+"User-Agent: Go-http-client/1.1\r\n\r\n", <-got)
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
