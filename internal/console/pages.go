package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, http.StatusOK, "login", "Sign in", map[string]string{"Next": localPath(r.URL.Query().Get("next"))})
}

// localPath keeps a redirect on this site.
func localPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.Contains(p, `\`) {
		return "/"
	}
	return p
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	name, tok := strings.TrimSpace(r.PostFormValue("name")), r.PostFormValue("token")
	if !s.auth.tokenOK(tok) || !validName(name) {
		s.render(w, r, http.StatusUnauthorized, "login", "Sign in", map[string]string{
			"Next": localPath(r.PostFormValue("next")), "Error": "Wrong token, or no name (one word, for the audit trail)."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: s.auth.newSession(name), Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https",
		MaxAge: int(sessionTTL.Seconds())})
	http.Redirect(w, r, localPath(r.PostFormValue("next")), http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// overviewData answers the runbook's four questions.
type overviewData struct {
	Stats   *ops.Stats
	Minutes []ops.Minute
	// Series are the per-minute figures of each question, for the charts.
	Scheduled, Claimed, Started, Terminal, Quarantined []int64
	Channels                                           []reminder.Channel
	States                                             []reminder.State
	// Owed is the oldest repair the reconciler owes.
	Owed *time.Time
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := s.deps.Now()
	st, err := ops.ReadStats(ctx, s.deps.DB, now)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if s.deps.DLQ.URL != "" {
		if depths, err := ops.DLQDepths(s.deps.DLQ.URL, s.deps.DLQ.Topology); err != nil {
			st.DeadLettersErr = err.Error()
		} else {
			st.DeadLetters = depths
		}
	}
	ms, err := ops.ReadMinutes(ctx, s.deps.DB, now)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d := overviewData{Stats: st, Minutes: ms, Channels: reminder.Channels, States: reminder.States}
	for _, m := range ms {
		d.Scheduled = append(d.Scheduled, m.Scheduled)
		d.Claimed = append(d.Claimed, m.Claimed)
		d.Started = append(d.Started, m.Started)
		d.Terminal = append(d.Terminal, m.Terminal)
		d.Quarantined = append(d.Quarantined, m.Quarantined)
	}
	d.Owed = st.OldestUnexpired
	if d.Owed == nil || (st.OldestDeadLease != nil && st.OldestDeadLease.Before(*d.Owed)) {
		d.Owed = st.OldestDeadLease
	}
	s.render(w, r, http.StatusOK, "overview", "Overview", d)
}

// searchFields are the query parameters of a search (failure: the
// reminder's reason or last error contains it; "reason" is the operator's), carried from the
// search page to a bulk action's confirmation and to the action itself.
var searchFields = []string{"id", "tenant", "key", "state", "channel", "due_from", "due_to", "late", "failure"}

// filterOf reads a search from form or query values. Times are RFC 3339 or
// an HTML datetime-local value, taken as UTC.
func filterOf(v url.Values) (ops.Filter, error) {
	f := ops.Filter{Tenant: strings.TrimSpace(v.Get("tenant")), KeyPrefix: strings.TrimSpace(v.Get("key")),
		Channel: reminder.Channel(v.Get("channel")), Late: v.Get("late") == "on", Reason: strings.TrimSpace(v.Get("failure"))}
	if id := strings.TrimSpace(v.Get("id")); id != "" {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil || n <= 0 {
			return f, fmt.Errorf("reminder ID %q: must be a positive number", id)
		}
		f.IDs = []int64{n}
	}
	for _, st := range v["state"] {
		if st != "" {
			f.States = append(f.States, reminder.State(st))
		}
	}
	for _, t := range []struct {
		name string
		dst  **time.Time
	}{{"due_from", &f.DueFrom}, {"due_to", &f.DueTo}} {
		raw := strings.TrimSpace(v.Get(t.name))
		if raw == "" {
			continue
		}
		var tm time.Time
		var err error
		if tm, err = time.Parse(time.RFC3339, raw); err != nil {
			if tm, err = time.ParseInLocation("2006-01-02T15:04", raw, time.UTC); err != nil {
				return f, fmt.Errorf("%s %q: want a time like 2025-01-31T09:00 (UTC)", t.name, raw)
			}
		}
		*t.dst = &tm
	}
	return f, f.Validate()
}

// searchValues keeps only the search's own fields of v.
func searchValues(v url.Values) url.Values {
	out := url.Values{}
	for _, k := range searchFields {
		for _, x := range v[k] {
			if x != "" {
				out.Add(k, x)
			}
		}
	}
	return out
}

type remindersData struct {
	Query    url.Values
	Searched bool
	Page     ops.ListPage
	NextURL  string
	States   []reminder.State
	Channels []reminder.Channel
	Err      string
}

func (s *Server) reminders(w http.ResponseWriter, r *http.Request) {
	q := searchValues(r.URL.Query())
	d := remindersData{Query: q, Searched: len(q) > 0, States: reminder.States, Channels: reminder.Channels}
	f, err := filterOf(q)
	if err != nil {
		d.Err = err.Error()
		s.render(w, r, http.StatusBadRequest, "reminders", "Reminders", d)
		return
	}
	before, _ := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
	d.Page, err = ops.List(r.Context(), s.deps.DB, s.deps.Now(), f, ops.Page{Before: before, Size: ops.DefaultPageSize})
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	s.mask(d.Page.Items)
	if d.Page.Next != 0 {
		next := searchValues(q)
		next.Set("before", strconv.FormatInt(d.Page.Next, 10))
		d.NextURL = "/reminders?" + next.Encode()
	}
	s.render(w, r, http.StatusOK, "reminders", "Reminders", d)
}

func (s *Server) mask(items []ops.Item) {
	if s.cfg.ShowRecipients {
		return
	}
	for i := range items {
		items[i].Recipient = worker.MaskRecipient(items[i].Recipient)
	}
}

func (s *Server) reminder(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, fmt.Errorf("reminder ID %q: must be a number", r.PathValue("id")))
		return
	}
	d, err := ops.ReadDetail(r.Context(), s.deps.DB, id)
	if errors.Is(err, ops.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, err)
		return
	}
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	items := []ops.Item{d.Item}
	s.mask(items)
	d.Item = items[0]
	s.render(w, r, http.StatusOK, "reminder", fmt.Sprintf("Reminder %d", id), d)
}

type deadLettersData struct {
	Channels []reminder.Channel
	Depths   map[string]int
	DepthErr string
	Channel  reminder.Channel
	Read     *ops.DLQRead
	Shown    []*ops.DeadLetter
	Err      string
}

// maxShownDeadLetters bounds the messages one page shows (the read holds all).
const maxShownDeadLetters = 500

func (s *Server) deadLetters(w http.ResponseWriter, r *http.Request) {
	d := deadLettersData{Channels: reminder.Channels}
	if s.deps.DLQ.URL == "" {
		d.Err = "no broker configured (--amqp-url)"
		s.render(w, r, http.StatusOK, "dead-letters", "Dead letters", d)
		return
	}
	if depths, err := ops.DLQDepths(s.deps.DLQ.URL, s.deps.DLQ.Topology); err != nil {
		d.DepthErr = err.Error()
	} else {
		d.Depths = depths
	}
	if ch := r.URL.Query().Get("channel"); ch != "" {
		d.Channel = reminder.Channel(ch)
		if !d.Channel.Valid() {
			s.fail(w, r, http.StatusBadRequest, fmt.Errorf("channel %q: want email or sms", ch))
			return
		}
		read, done, err := s.readDLQ(r, d.Channel)
		if err != nil {
			d.Err = err.Error()
		} else {
			defer done()
			d.Read = read
			d.Shown = read.Messages[:min(len(read.Messages), maxShownDeadLetters)]
		}
	}
	s.render(w, r, http.StatusOK, "dead-letters", "Dead letters", d)
}

// readDLQ reads a channel's dead-letter queue with the rows loaded. The
// caller calls done, which returns every message not acknowledged, in
// order, and lets the next read of this console begin.
func (s *Server) readDLQ(r *http.Request, ch reminder.Channel) (read *ops.DLQRead, done func(), err error) {
	s.dlqMu.Lock()
	read, err = s.deps.DLQ.Read(r.Context(), ch)
	if err != nil {
		s.dlqMu.Unlock()
		return nil, nil, err
	}
	done = func() {
		if err := read.Close(); err != nil {
			s.deps.Log.Warn().Err(err).Str("queue", read.Queue).Msg("returning dead letters")
		}
		s.dlqMu.Unlock()
	}
	if err := read.LoadRows(r.Context(), s.deps.DB); err != nil {
		done()
		return nil, nil, err
	}
	return read, done, nil
}
