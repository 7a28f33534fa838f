package worker

import (
	"strings"

	"github.com/rs/zerolog"
)

// with adds to ev what every log line about a reminder carries: its ID,
// tenant, channel, attempt and fence, and the recipient masked. A level
// that is off gives a nil event: nothing is built for it (the mask would
// allocate per reminder for a debug line nobody reads).
func (w *Worker) with(ev *zerolog.Event, it *item) *zerolog.Event {
	if ev == nil {
		return nil
	}
	ev = ev.Int64("reminder_id", it.env.ReminderID).Str("channel", string(w.cfg.Channel))
	if it.att.Number != 0 {
		ev = ev.Int("attempt", it.att.Number).Int64("fence", it.att.Fence)
	} else {
		ev = ev.Int("attempt", it.env.Attempt+1).Int64("fence", it.env.Fence)
	}
	if it.row.ID != 0 {
		ev = ev.Str("tenant", it.row.Tenant).Str("recipient", MaskRecipient(it.row.Recipient))
	} else if it.env.Tenant != "" {
		ev = ev.Str("tenant", it.env.Tenant)
	}
	return ev
}

// MaskRecipient keeps enough of an address or number to tell two apart in an
// incident, and no more: "learner42@example.com" → "l***2@example.com",
// "+14155550100" → "+141*****100".
func MaskRecipient(r string) string {
	if local, domain, ok := strings.Cut(r, "@"); ok {
		if len(local) <= 2 {
			return "***@" + domain
		}
		return local[:1] + "***" + local[len(local)-1:] + "@" + domain
	}
	if len(r) <= 6 {
		return strings.Repeat("*", len(r))
	}
	return r[:4] + strings.Repeat("*", len(r)-7) + r[len(r)-3:]
}
