package reminder_test

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/reminder"
)

var update = flag.Bool("update", false, "rewrite the transition table of docs/design.md from reminder.Transitions")

// A code names one move from a state for a kind of writer: Lookup (and the
// target state RecordOutcomes derives from a code) cannot be ambiguous.
func TestTransitionsAreUniquePerStateActorAndCode(t *testing.T) {
	t.Parallel()
	type key struct {
		from  reminder.State
		actor reminder.Actor
		code  reminder.Code
	}
	seen := map[key]reminder.Transition{}
	for _, tr := range reminder.Transitions {
		if tr.Legacy {
			continue // old binaries write no code
		}
		k := key{tr.From, tr.Actor, tr.Code}
		prev, dup := seen[k]
		require.False(t, dup, "%s and %s share state, actor and code", prev, tr)
		seen[k] = tr
		require.NotEmpty(t, tr.Code, "%s has no code", tr)
		require.NotEmpty(t, tr.Doc, "%s has no doc", tr)
		require.True(t, tr.Legacy || tr.Statement != "", "%s names no statement", tr)
	}
}

// A note's code is never a transition's: an event with a note code is known
// not to be a move, whatever its states.
func TestNotesAreNotTransitions(t *testing.T) {
	t.Parallel()
	for _, n := range reminder.Notes {
		require.True(t, reminder.IsNote(n.Code))
		require.NotEmpty(t, n.Doc, "%s", n.Code)
		for _, tr := range reminder.Transitions {
			require.NotEqual(t, n.Code, tr.Code, "note code %q is also the code of %s", n.Code, tr)
		}
	}
	require.False(t, reminder.IsNote(reminder.CodeWindowClosed), "pending → pending on a closed window is a transition")
}

// Terminal states never change again, but for an operator's replay of a
// failed reminder; only retention removes the row. A send in flight is never
// canceled.
func TestTerminalStatesAreFinal(t *testing.T) {
	t.Parallel()
	for _, tr := range reminder.Transitions {
		if tr.From.Terminal() && tr.To != reminder.None {
			require.Equal(t, [3]any{reminder.Failed, reminder.Pending, reminder.Operator}, [3]any{tr.From, tr.To, tr.Actor},
				"%s leaves a terminal state", tr)
		}
		if tr.To == reminder.None {
			require.Equal(t, reminder.Retention, tr.Actor, "%s", tr)
		}
		if tr.To == reminder.None {
			require.True(t, tr.From.Terminal(), "%s deletes an open reminder", tr)
		}
		require.False(t, tr.From == reminder.Sending && tr.To == reminder.Canceled, "%s", tr)
	}
	for _, s := range reminder.States {
		if !s.Terminal() {
			require.True(t, reminder.Allowed(s, reminder.Expired, reminder.Reconciler),
				"an open %s reminder must be able to expire at its deadline", s)
		}
	}
}

func TestTargetFollowsTheTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		actor   reminder.Actor
		code    reminder.Code
		froms   []reminder.State
		want    reminder.State
		wantErr string
	}{
		{reminder.Worker, reminder.CodeDelivered, []reminder.State{reminder.Sending}, reminder.Delivered, ""},
		{reminder.Worker, reminder.CodeRetry, []reminder.State{reminder.Sending}, reminder.Retrying, ""},
		{reminder.Worker, reminder.CodeAttemptsExhausted, []reminder.State{reminder.Sending}, reminder.Failed, ""},
		{reminder.Worker, reminder.CodeSendPanicked, []reminder.State{reminder.Sending}, reminder.Quarantined, ""},
		{reminder.Worker, reminder.CodePoisonMessage, []reminder.State{reminder.Leased, reminder.Enqueued, reminder.Retrying},
			reminder.Quarantined, ""},
		{reminder.Worker, reminder.CodeDelivered, []reminder.State{reminder.Enqueued}, reminder.None,
			`no transition from enqueued by worker with code "delivered"`},
		{reminder.Operator, reminder.CodeRetry, []reminder.State{reminder.Sending}, reminder.None,
			`no transition from sending by operator`},
	}
	for _, tc := range tests {
		got, err := reminder.Target(tc.actor, tc.code, tc.froms...)
		if tc.wantErr != "" {
			require.ErrorContains(t, err, tc.wantErr)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got, "%s %s from %v", tc.actor, tc.code, tc.froms)
	}
}

func TestOutcomeLegacyValues(t *testing.T) {
	t.Parallel()
	want := map[reminder.Outcome]string{
		reminder.OutcomeDelivered: "delivered", reminder.OutcomeRetryable: "retryable", reminder.OutcomeUnknown: "retryable",
		reminder.OutcomeNotSent: "retryable", reminder.OutcomePermanent: "permanent", reminder.OutcomePanicked: "permanent",
	}
	require.Len(t, want, len(reminder.Outcomes))
	for _, o := range reminder.Outcomes {
		require.Equal(t, want[o], o.Legacy(), "%s", o)
	}
}

const (
	designDoc  = "../../docs/design.md"
	tableBegin = "<!-- transitions: generated from pkg/reminder.Transitions; go test ./pkg/reminder -update -->\n"
	tableEnd   = "<!-- end of transitions -->"
)

// docs/design.md's transition table is reminder.Transitions. Run
// `go test ./pkg/reminder -run TestDesignDocListsTheTransitions -update` to
// rewrite it after changing the table.
func TestDesignDocListsTheTransitions(t *testing.T) {
	src, err := os.ReadFile(designDoc)
	require.NoError(t, err)
	doc := string(src)
	before, rest, ok := strings.Cut(doc, tableBegin)
	require.True(t, ok, "docs/design.md has no line %q", strings.TrimSpace(tableBegin))
	_, after, ok := strings.Cut(rest, tableEnd)
	require.True(t, ok, "docs/design.md has no line %q after the table", tableEnd)
	want := before + tableBegin + reminder.TransitionsMarkdown() + tableEnd + after
	if *update {
		require.NoError(t, os.WriteFile(designDoc, []byte(want), 0o644))
		return
	}
	require.Equal(t, want, doc, "docs/design.md's transition table differs from reminder.Transitions: "+
		"run go test ./pkg/reminder -run TestDesignDocListsTheTransitions -update")
}

// Lookup answers from an index built once; it must give what a scan of the
// table gives for every state, kind of writer and code the table names, and
// nothing for a combination it does not.
func TestLookupAgreesWithTheTable(t *testing.T) {
	t.Parallel()
	scan := func(from reminder.State, a reminder.Actor, c reminder.Code) (reminder.Transition, bool) {
		for _, tr := range reminder.Transitions {
			if !tr.Legacy && tr.From == from && tr.Actor == a && tr.Code == c {
				return tr, true
			}
		}
		return reminder.Transition{}, false
	}
	var states []reminder.State
	var actors []reminder.Actor
	var codes []reminder.Code
	for _, tr := range reminder.Transitions {
		states = append(states, tr.From, tr.To)
		actors = append(actors, tr.Actor)
		codes = append(codes, tr.Code)
	}
	codes = append(codes, "no such code")
	found := 0
	for _, from := range states {
		for _, a := range actors {
			for _, c := range codes {
				want, wantOK := scan(from, a, c)
				got, ok := reminder.Lookup(from, a, c)
				require.Equal(t, wantOK, ok, "%s by %s with %q", from, a, c)
				require.Equal(t, want, got, "%s by %s with %q", from, a, c)
				if ok {
					found++
				}
			}
		}
	}
	require.Positive(t, found)
	_, ok := reminder.Lookup(reminder.Sending, reminder.Worker, "no such code")
	require.False(t, ok)
	tr, ok := reminder.Lookup(reminder.Sending, reminder.Worker, reminder.CodeDelivered)
	require.True(t, ok)
	require.Equal(t, reminder.Delivered, tr.To)
}
