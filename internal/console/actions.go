package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// An action is one of the operator's decisions: a bulk action on a search's
// selection (a single reminder is a search by ID), or a decision about dead
// letters of one channel.
type action struct {
	Name string // cancel, replay, expire, dlq-replay, dlq-expire
	// Filter of a bulk action.
	Filter ops.Filter
	// Channel, ReminderID and MessageID select dead letters.
	Channel    reminder.Channel
	ReminderID int64
	MessageID  string
	// Single: the search names one reminder by ID and nothing else.
	Single bool
	// Carry are the form fields that name the action, kept from the
	// confirmation to the action itself.
	Carry url.Values
}

func (a action) dlq() bool { return strings.HasPrefix(a.Name, "dlq-") }

func (a action) replay() bool { return a.Name == "replay" || a.Name == "dlq-replay" }

// Verb is the button's word.
func (a action) Verb() string {
	v := strings.TrimPrefix(a.Name, "dlq-")
	return strings.ToUpper(v[:1]) + v[1:]
}

// Target says what the action is about, for the dialog.
func (a action) Target() string {
	if a.dlq() {
		if a.ReminderID != 0 {
			return fmt.Sprintf("the %s dead letters of reminder %d", a.Channel, a.ReminderID)
		}
		return fmt.Sprintf("%s dead letter %s", a.Channel, a.MessageID)
	}
	if a.Single {
		return fmt.Sprintf("reminder %d", a.Filter.IDs[0])
	}
	return "every reminder the search selects"
}

// Back is where the operator came from.
func (a action) Back() string {
	switch {
	case a.dlq():
		return "/dead-letters?channel=" + url.QueryEscape(string(a.Channel))
	case a.Single:
		return fmt.Sprintf("/reminders/%d", a.Filter.IDs[0])
	}
	return "/reminders?" + searchValues(a.Carry).Encode()
}

func actionOf(v url.Values) (action, error) {
	a := action{Name: v.Get("action"), Carry: url.Values{"action": {v.Get("action")}}}
	switch a.Name {
	case "cancel", "replay", "expire":
		var err error
		if a.Filter, err = filterOf(v); err != nil {
			return a, err
		}
		sv := searchValues(v)
		for k, vs := range sv {
			a.Carry[k] = vs
		}
		a.Single = len(sv) == 1 && len(a.Filter.IDs) == 1
	case "dlq-replay", "dlq-expire":
		a.Channel = reminder.Channel(v.Get("channel"))
		if !a.Channel.Valid() {
			return a, fmt.Errorf("channel %q: want email or sms", v.Get("channel"))
		}
		a.ReminderID, _ = strconv.ParseInt(v.Get("reminder"), 10, 64)
		a.MessageID = v.Get("message")
		if a.ReminderID <= 0 && a.MessageID == "" {
			return a, errors.New("name a dead letter: its reminder or its message ID")
		}
		a.Carry.Set("channel", string(a.Channel))
		if a.ReminderID > 0 {
			a.Carry.Set("reminder", strconv.FormatInt(a.ReminderID, 10))
		} else {
			a.Carry.Set("message", a.MessageID)
		}
	default:
		return a, fmt.Errorf("unknown action %q", a.Name)
	}
	return a, nil
}

// outcome is what an action did or, dry, would do.
type outcome struct {
	Selected, Changed int
	Skipped           map[string]int
}

// SkippedLines lists the skipped reminders by why, in a stable order.
func (o outcome) SkippedLines() []string {
	var out []string
	for why, n := range o.Skipped {
		out = append(out, fmt.Sprintf("%d: %s", n, why))
	}
	sort.Strings(out)
	return out
}

// run carries out (or, with d.DryRun, tries) the action.
func (s *Server) run(r *http.Request, a action, d ops.Decision) (outcome, error) {
	now := s.deps.Now()
	if !a.dlq() {
		res, err := ops.Bulk(r.Context(), s.deps.DB, now, ops.BulkAction(a.Name), a.Filter, d, ops.BulkOptions{})
		return outcome{Selected: res.Selected, Changed: res.Changed, Skipped: res.Skipped}, err
	}
	if s.deps.DLQ.URL == "" {
		return outcome{}, errors.New("no broker configured (--amqp-url)")
	}
	read, done, err := s.readDLQ(r, a.Channel)
	if err != nil {
		return outcome{}, err
	}
	defer done()
	sel := ops.DLQSelector{}
	if a.ReminderID > 0 {
		sel.IDs = []int64{a.ReminderID}
	} else {
		sel.MessageIDs = []string{a.MessageID}
	}
	res, err := ops.DecideDLQ(r.Context(), s.deps.DB, read, now, ops.DLQAction(strings.TrimPrefix(a.Name, "dlq-")), sel, d)
	o := outcome{Selected: len(res.Items), Skipped: map[string]int{}}
	for v, n := range res.Counts {
		if v == ops.VerdictReplay || v == ops.VerdictExpire {
			o.Changed += n
		} else {
			o.Skipped[string(v)] += n
		}
	}
	return o, err
}

// actionOf reads the action v names, or answers why not (read-only mode,
// bad input) and returns false.
func (s *Server) actionOf(w http.ResponseWriter, r *http.Request, v url.Values) (action, bool) {
	if s.cfg.ReadOnly {
		s.fail(w, r, http.StatusForbidden, errors.New("the console is read-only"))
		return action{}, false
	}
	a, err := actionOf(v)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err)
		return a, false
	}
	return a, true
}

type confirmData struct {
	Action  action
	Outcome outcome
	Err     string
}

// confirm shows an action's dry run and asks for the reason.
func (s *Server) confirm(w http.ResponseWriter, r *http.Request) {
	a, ok := s.actionOf(w, r, r.URL.Query())
	if !ok {
		return
	}
	d := ops.Decision{Actor: s.actor(r), Reason: "dry run", Attempts: ops.ResetAttempts, Margin: ops.DefaultMargin, DryRun: true}
	o, err := s.run(r, a, d)
	cd := confirmData{Action: a, Outcome: o}
	if err != nil {
		cd.Err = err.Error()
	}
	s.render(w, r, http.StatusOK, "confirm", a.Verb()+"?", cd)
}

type doneData struct {
	Action  action
	Outcome outcome
	Actor   string
	Reason  string
}

// act carries out a confirmed action.
func (s *Server) act(w http.ResponseWriter, r *http.Request) {
	a, ok := s.actionOf(w, r, r.PostForm)
	if !ok {
		return
	}
	var err error
	d := ops.Decision{Actor: s.actor(r), Reason: r.PostFormValue("reason"), Margin: ops.DefaultMargin}
	if a.replay() {
		if d.Attempts, err = ops.ParseAttemptsPolicy(r.PostFormValue("attempts")); err != nil {
			s.fail(w, r, http.StatusBadRequest, err)
			return
		}
	}
	o, err := s.run(r, a, d)
	switch {
	case errors.Is(err, ops.ErrNoReason), errors.Is(err, ops.ErrBulkNoFilter), errors.Is(err, ops.ErrBulkTooLarge):
		s.fail(w, r, http.StatusBadRequest, err)
		return
	case err != nil:
		s.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	s.deps.Log.Info().Str("actor", d.Actor).Str("action", a.Name).Int("changed", o.Changed).Str("reason", d.Reason).
		Msg("console action")
	s.render(w, r, http.StatusOK, "done", a.Verb()+": done", doneData{Action: a, Outcome: o, Actor: d.Actor, Reason: d.Reason})
}
