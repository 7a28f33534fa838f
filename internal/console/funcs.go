package console

import (
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"
)

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"utc":       utc,
	"zoned":     zoned,
	"ago":       ago,
	"sparkline": sparkline,
	"sum":       sum,
	"secs":      func(d time.Duration) string { return d.Round(time.Second).String() },
	"last":      func(v []int64) int64 { return v[len(v)-1] },
	"query":     func(v url.Values) string { return v.Encode() },
	"has":       func(v url.Values, k, x string) bool { return containsString(v[k], x) },
	"lower":     strings.ToLower,
	"str":       func(v any) string { return fmt.Sprint(v) },
	"deref":     func(t *time.Time) time.Time { return *t },
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// utc formats t (a time.Time or a non-nil *time.Time) in UTC; "-" for none.
func utc(v any) string {
	switch t := v.(type) {
	case time.Time:
		return t.UTC().Format("2006-01-02 15:04:05Z")
	case *time.Time:
		if t != nil {
			return utc(*t)
		}
	}
	return "-"
}

// zoned formats t in the recipient's zone ("" when it has none or the zone
// is unknown to this machine).
func zoned(t time.Time, tz string) string {
	if tz == "" {
		return ""
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return ""
	}
	return t.In(loc).Format("2006-01-02 15:04 MST") + " (" + tz + ")"
}

// ago says how long before now t was, rounded for a person; "none" for nil.
func ago(t *time.Time, now time.Time) string {
	if t == nil {
		return "none"
	}
	d := now.Sub(*t)
	switch {
	case d < 0:
		return "in " + (-d).Round(time.Second).String()
	case d < time.Minute:
		return d.Round(time.Second).String() + " ago"
	case d < time.Hour:
		return d.Round(time.Second).String() + " ago"
	}
	return d.Round(time.Minute).String() + " ago"
}

func sum(v []int64) int64 {
	var n int64
	for _, x := range v {
		n += x
	}
	return n
}

// sparkline draws v (oldest first) as an inline SVG line chart, scaled to
// its maximum, with an area under it: only numbers go into the markup, and
// presentation attributes rather than style, which the CSP forbids inline.
func sparkline(v []int64) template.HTML {
	const w, h = 240.0, 40.0
	var peak int64 = 1
	for _, x := range v {
		peak = max(peak, x)
	}
	var pts strings.Builder
	step := w / float64(max(len(v)-1, 1))
	for i, x := range v {
		fmt.Fprintf(&pts, "%.1f,%.1f ", float64(i)*step, h-2-float64(x)/float64(peak)*(h-4))
	}
	line := strings.TrimSpace(pts.String())
	return template.HTML(fmt.Sprintf(`<svg class="spark" viewBox="0 0 %.0f %.0f" preserveAspectRatio="none" role="img" aria-label="per minute, peak %d">`+
		`<polygon points="0,%.0f %s %.0f,%.0f" fill="#2b6cb0" fill-opacity="0.15"/>`+
		`<polyline points="%s" fill="none" stroke="#2b6cb0" stroke-width="1.5"/></svg>`, w, h, peak, h, line, w, h, line))
}
