package deploycheck

import "testing"

func TestSelects(t *testing.T) {
	t.Parallel()
	labels := obj{"app": "nudge", "component": "email-worker"}
	expr := func(key, op string, values ...any) obj {
		return obj{"matchExpressions": []any{obj{"key": key, "operator": op, "values": values}}}
	}
	for _, c := range []struct {
		name string
		sel  obj
		want bool
	}{
		{"empty selects everything", obj{}, true},
		{"matchLabels subset", obj{"matchLabels": obj{"app": "nudge"}}, true},
		{"matchLabels mismatch", obj{"matchLabels": obj{"app": "other"}}, false},
		{"In", expr("component", "In", "sms-worker", "email-worker"), true},
		{"In without the value", expr("component", "In", "sms-worker"), false},
		{"In on a missing label", expr("tier", "In", "x"), false},
		{"NotIn", expr("component", "NotIn", "sms-worker"), true},
		{"NotIn with the value", expr("component", "NotIn", "email-worker"), false},
		{"NotIn on a missing label", expr("tier", "NotIn", "x"), true},
		{"Exists", expr("app", "Exists"), true},
		{"Exists missing", expr("tier", "Exists"), false},
		{"DoesNotExist", expr("tier", "DoesNotExist"), true},
		{"DoesNotExist present", expr("app", "DoesNotExist"), false},
		{"unknown operator", expr("app", "Matches", "nudge"), false},
	} {
		if got := selects(c.sel, labels); got != c.want {
			t.Errorf("%s: selects = %v, want %v", c.name, got, c.want)
		}
	}
}
