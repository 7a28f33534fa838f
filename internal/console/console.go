// Package console is Nudge's web console for on-call operators, served by
// `nudgectl console`: the runbook's four questions as live figures with an
// hour of per-minute charts, reminders searchable by ID, key, tenant, state,
// channel and time with their whole timeline and attempts, the dead-letter
// queues with reasons and deadlines, and the operator's decisions (cancel,
// replay, expire, on one reminder, a search's selection or a dead letter),
// and the campaigns' progress (read-only, as nudgectl campaign status).
//
// It is a thin face on internal/ops, so the console and nudgectl cannot
// disagree: every figure comes from the functions nudgectl prints, and every
// decision is the same fenced statement with the same audit rows, with the
// authenticated operator as actor. Each decision first shows its dry run
// (how many reminders would change) and needs a reason.
//
// Why server-rendered HTML: an operator at 03:00 needs a page that works
// behind any proxy with nothing to build. Templates and one small script are
// embedded (//go:embed); charts are SVG drawn on the server; the Content
// Security Policy allows no inline script at all.
//
// Security: every page but /healthz and /login needs the token (bearer,
// basic authentication's password, or the session cookie the login form
// sets); behind an SSO proxy a trusted header names the operator. Every
// form that changes something carries a CSRF token (an HMAC of the operator
// and their session), read-only mode refuses every change, and recipients
// are masked unless the console was started with ShowRecipients.
package console

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/pg"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Config is the console's behaviour.
type Config struct {
	// Token authenticates operators (ReadTokenFile). Required.
	Token string
	// TrustedUserHeader, when set, names the header an SSO proxy in front of
	// the console sets to the operator's name (X-Forwarded-User). The token
	// is still required (the proxy adds it), so the header cannot be forged
	// by a client that reaches the console around the proxy.
	TrustedUserHeader string
	// ReadOnly refuses every action; the pages show no action buttons.
	ReadOnly bool
	// ShowRecipients shows recipients in full; otherwise they are masked.
	ShowRecipients bool
	// ActorPrefix is put before the operator's name in events and audit
	// rows. Zero value: "console:".
	ActorPrefix string
}

// Deps are what the console reads and writes.
type Deps struct {
	// DB is the fleet's database.
	DB pg.Beginner
	// DLQ reads the dead-letter queues (with the signing keys, so that a
	// message's reminder can be acted on). A zero URL: no broker pages.
	DLQ ops.DLQ
	// Now is the clock. Zero value: time.Now.
	Now func() time.Time
	Log zerolog.Logger
}

// Server is the console's http.Handler.
type Server struct {
	cfg  Config
	deps Deps
	auth *auth
	tmpl map[string]*template.Template
	mux  *http.ServeMux
	// dlqMu serialises this console's dead-letter reads: a read holds the
	// queue exclusively, so two at once would only make one fail busy.
	dlqMu sync.Mutex
}

// New returns the console.
func New(cfg Config, deps Deps) (*Server, error) {
	if len(cfg.Token) < MinTokenLength {
		return nil, fmt.Errorf("the console needs a token of at least %d characters (--token-file)", MinTokenLength)
	}
	if deps.DB == nil {
		return nil, errors.New("the console needs a database")
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if cfg.ActorPrefix == "" {
		cfg.ActorPrefix = "console:"
	}
	a, err := newAuth(cfg.Token, cfg.TrustedUserHeader, deps.Now)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, deps: deps, auth: a, mux: http.NewServeMux()}
	if s.tmpl, err = parseTemplates(); err != nil {
		return nil, err
	}
	static, _ := fs.Sub(assets, "static")
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	s.mux.HandleFunc("GET /login", s.loginPage)
	s.mux.HandleFunc("POST /login", s.login)
	s.mux.HandleFunc("POST /logout", s.authed(s.logout))
	s.mux.HandleFunc("GET /{$}", s.authed(s.overview))
	s.mux.HandleFunc("GET /reminders", s.authed(s.reminders))
	s.mux.HandleFunc("GET /reminders/{id}", s.authed(s.reminder))
	s.mux.HandleFunc("GET /dead-letters", s.authed(s.deadLetters))
	s.mux.HandleFunc("GET /campaigns", s.authed(s.campaigns))
	s.mux.HandleFunc("GET /campaigns/{id}", s.authed(s.campaign))
	s.mux.HandleFunc("GET /confirm", s.authed(s.confirm))
	s.mux.HandleFunc("POST /act", s.authed(s.act))
	return s, nil
}

// ServeHTTP adds the security headers to every answer.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

type userKey struct{}

// authed lets authenticated requests through, with the operator's name in
// the context; a browser is sent to the login form, anything else gets 401.
// Every POST must carry the CSRF token.
func (s *Server) authed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		user, err := s.auth.user(r)
		if err != nil {
			if r.Method == http.MethodGet && r.Header.Get("Authorization") == "" {
				http.Redirect(w, r, "/login?next="+template.URLQueryEscaper(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			w.Header().Set("WWW-Authenticate", `Basic realm="nudge console"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
			if !s.auth.csrfOK(r, user) {
				http.Error(w, "missing or invalid CSRF token: reload the page and try again", http.StatusForbidden)
				return
			}
		}
		next(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	}
}

func userOf(r *http.Request) string { u, _ := r.Context().Value(userKey{}).(string); return u }

// actor is the name recorded in events and audit rows.
func (s *Server) actor(r *http.Request) string { return s.cfg.ActorPrefix + userOf(r) }

// page is what every page's template gets besides its own data.
type page struct {
	Title    string
	Nav      string
	User     string
	CSRF     string
	ReadOnly bool
	Now      time.Time
	Data     any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	p := page{Title: title, Nav: name, User: userOf(r), ReadOnly: s.cfg.ReadOnly, Now: s.deps.Now().UTC(), Data: data}
	if p.User != "" {
		p.CSRF = s.auth.csrf(r, p.User)
	}
	var buf bytes.Buffer
	if err := s.tmpl[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		s.deps.Log.Error().Err(err).Str("page", name).Msg("rendering a console page")
		http.Error(w, "rendering the page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail shows an error page: the operator's input (400) or what the fleet answered (500).
func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if status >= 500 {
		s.deps.Log.Error().Err(err).Str("path", r.URL.Path).Msg("console request failed")
	}
	s.render(w, r, status, "error", "Error", err.Error())
}

func parseTemplates() (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for _, name := range []string{"overview", "reminders", "reminder", "dead-letters", "campaigns", "campaign", "confirm", "done", "error", "login"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("parsing the %s template: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}
