package ratelimit_test

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/nudgehq/nudge/internal/ratelimit"
)

// FuzzParse: a limits file either fails with an error that says it is about
// rate limits, or is valid (every rate positive and finite, every burst at
// least 1) and reads back the same once written out.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"version":"v1","channels":{"sms":{"account":"twilio","rate":10,"burst":20,"tenants":{"default":{"rate":2,"burst":4}}}}}`,
		`{}`, `{"channels":{"sms":{}}}`, `{"version":"v","channels":{"fax":{"account":"a","rate":1,"burst":1}}}`,
		`{"version":"v","channels":{"sms":{"account":"a","rate":1e309,"burst":1}}}`,
		`{"version":"v","channels":{"sms":{"account":"a","rate":-0,"burst":1}}}`, `{"version":"v","extra":1}`, `[]`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ratelimit.Parse(data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "rate limits: ") {
				t.Fatalf("an error that does not say what it is about: %v", err)
			}
			return
		}
		for ch, cl := range c.Channels {
			limits := []ratelimit.Limit{cl.Limit}
			for _, l := range cl.Tenants {
				limits = append(limits, l)
			}
			for _, l := range limits {
				if !(l.Rate > 0) || math.IsInf(l.Rate, 0) || l.Burst < 1 {
					t.Fatalf("channel %s: accepted limit %+v", ch, l)
				}
			}
		}
		out, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ratelimit.Parse(out)
		if err != nil {
			t.Fatalf("written out, it no longer parses: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(c, back) {
			t.Fatalf("round trip changed it:\n%+v\n%+v", c, back)
		}
	})
}
