package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nudgehq/nudge/pkg/webhooksig"
)

// app is the tenants' application the webhook reminders reach: it verifies
// each request's signature with the tenant's secret (as the README tells an
// application to), acts once per Idempotency-Key, and answers as a real one
// would: 204 for a draft it deleted, 404 for one the learner already
// removed (every fifth: Nudge records "already absent"), 200 for a certificate cleanup
// POSTed with a JSON body, and now and then 503 on a key's first request,
// so that a retry with the same key shows.
type app struct {
	root string // the webhook worker's root secret; each tenant verifies with its own derivation

	mu        sync.Mutex
	requests  int             // signed requests received
	keys      map[string]int  // Idempotency-Key -> requests with it
	acted     map[string]bool // keys acted on: once each, whatever repeats
	performed int             // keys whose draft or certificates were removed
	absent    int             // keys answered 404: nothing left to delete
	invalid   int             // requests refused: bad or missing signature
	srv       *http.Server
}

// appStats is what the application saw.
type appStats struct {
	Requests  int // signed requests
	Keys      int // distinct Idempotency-Keys acted on
	Performed int
	Absent    int
	Retried   int // keys that came more than once
	Invalid   int
}

func startApp(root string) (*app, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	a := &app{root: root, keys: map[string]int{}, acted: map[string]bool{}}
	a.srv = &http.Server{Handler: a, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = a.srv.Serve(ln) }()
	return a, "http://" + ln.Addr().String(), nil
}

func (a *app) stop() { _ = a.srv.Close() }

// ServeHTTP serves /tenants/TENANT/learners/N/drafts/M (DELETE) and
// /tenants/TENANT/hooks/certificate-cleanup (POST).
func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if len(parts) < 3 || parts[0] != "tenants" {
		http.NotFound(w, r)
		return
	}
	tenant := parts[1]
	secret := webhooksig.TenantSecret([]byte(a.root), tenant)
	if err := webhooksig.Verify(secret, r, time.Now(), webhooksig.DefaultTolerance); err != nil {
		a.mu.Lock()
		a.invalid++
		a.mu.Unlock()
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	key := r.Header.Get(webhooksig.IdempotencyHeader)

	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests++
	a.keys[key]++
	if a.keys[key] == 1 && demoHash(key)%20 == 0 {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	first := !a.acted[key]
	switch {
	case r.Method == http.MethodDelete && len(parts) == 6 && parts[4] == "drafts":
		draft, _ := strconv.Atoi(parts[5])
		gone := draft%5 == 0 // the learner deleted it first
		if first {
			a.acted[key] = true
			if gone {
				a.absent++
			} else {
				a.performed++
			}
		}
		if gone {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && len(parts) == 4 && parts[3] == "certificate-cleanup":
		var req struct {
			Learner int `json:"learner"`
		}
		if err := json.Unmarshal(body, &req); err != nil || req.Learner == 0 {
			http.Error(w, "want {\"learner\": N}", http.StatusBadRequest)
			return
		}
		if first {
			a.acted[key] = true
			a.performed++
		}
		w.WriteHeader(http.StatusOK)
	default:
		http.Error(w, "no such action", http.StatusMethodNotAllowed)
	}
}

func (a *app) stats() appStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := appStats{Requests: a.requests, Keys: len(a.acted), Performed: a.performed, Absent: a.absent, Invalid: a.invalid}
	for _, n := range a.keys {
		if n > 1 {
			st.Retried++
		}
	}
	return st
}

// demoHash is FNV-1a, to pick the keys answered 503 at first the same way
// on every run.
func demoHash(s string) uint32 {
	h := uint32(2166136261)
	for i := range len(s) {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}
