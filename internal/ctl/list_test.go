package ctl

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestRenderProgress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		done, total int
		elapsed     time.Duration
		want        string
	}{
		{0, 100, 0, "bulk [                              ] 0/100"},
		{50, 100, 5 * time.Second, "bulk [===============               ] 50/100 10/s, 5s left"},
		{100, 100, 4 * time.Second, "bulk [==============================] 100/100 25/s, 0s left"},
		{3, 0, time.Second, "bulk [                              ] 3/0 3/s, -1s left"},
	} {
		if got := renderProgress("bulk", tc.done, tc.total, tc.elapsed); got != tc.want {
			t.Errorf("renderProgress(%d, %d, %s)\n got %q\nwant %q", tc.done, tc.total, tc.elapsed, got, tc.want)
		}
	}
}

func TestProgressBarShowsOnlyAfterASecond(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	p := &progressBar{w: &buf, label: "bulk", on: true, start: start, now: func() time.Time { return now }}
	p.update(1, 10)
	now = start.Add(500 * time.Millisecond)
	p.update(2, 10)
	if buf.Len() != 0 {
		t.Fatalf("drew before a second: %q", buf.String())
	}
	now = start.Add(1100 * time.Millisecond)
	p.update(3, 10)
	now = now.Add(10 * time.Millisecond)
	p.update(4, 10) // too soon to redraw
	now = now.Add(10 * time.Millisecond)
	p.update(10, 10) // the last one always draws
	p.finish()
	got := buf.String()
	if strings.Count(got, "\r\033[K") != 3 || !strings.Contains(got, "3/10") || strings.Contains(got, "4/10") || !strings.Contains(got, "10/10") {
		t.Fatalf("unexpected drawing: %q", got)
	}
	off := &progressBar{w: &buf, on: false}
	off.update(1, 1)
	off.finish()
}
