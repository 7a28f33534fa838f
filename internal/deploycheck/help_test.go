package deploycheck

import (
	"testing"
)

func TestBinariesHelpIsUnderstood(t *testing.T) {
	cs := binaries(t)
	for _, want := range []string{"dispatcher", "email-worker", "sms-worker", "reconciler", "nudgectl", "fake-sms"} {
		if cs[want] == nil {
			t.Errorf("go build ./cmd/... did not build %s (built %v)", want, cs.names())
		}
	}
	// A few flags the checks rely on, to prove the help parser reads them.
	for _, c := range []struct{ bin, flag, env, def string }{
		{"dispatcher", "budget", "NUDGE_BUDGET", "4m0s"},
		{"dispatcher", "every", "NUDGE_EVERY", ""},
		{"email-worker", "grace", "NUDGE_GRACE", "25s"},
		{"sms-worker", "listen", "NUDGE_LISTEN", ":8080"},
		{"fake-sms", "listen", "NUDGE_FAKE_SMS_LISTEN", "127.0.0.1:9025"},
	} {
		f := cs[c.bin].flags[c.flag]
		if f == nil || f.env != c.env || f.def != c.def {
			t.Errorf("%s --%s: parsed %+v, want env %s default %q", c.bin, c.flag, f, c.env, c.def)
		}
	}
	if f := cs["dispatcher"].flags["signing-keys"]; f == nil || !f.required {
		t.Errorf("dispatcher --signing-keys should parse as required: %+v", f)
	}
	if m := cs["nudgectl"].subs["migrate"]; m == nil || m.flags["database-url"] == nil {
		t.Errorf("nudgectl migrate should inherit --database-url")
	}
}
