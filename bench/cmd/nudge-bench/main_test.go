package main

import (
	"slices"
	"strings"
	"testing"
)

// A run of some sections only must not replace docs/benchmarks.md or its
// chart unless told to.
func TestPartialOutputs(t *testing.T) {
	for _, tc := range []struct {
		name               string
		set                map[string]bool
		wantOut, wantChart string
	}{
		{"defaults go to bench/out", map[string]bool{"only": true}, "out/benchmarks-only.md", "out/benchmarks-throughput-only.png"},
		{"an explicit -out is kept", map[string]bool{"out": true}, "/tmp/r.md", "out/benchmarks-throughput-only.png"},
		{"an explicit -chart is kept", map[string]bool{"chart": true}, "out/benchmarks-only.md", "../docs/benchmarks-throughput.png"},
	} {
		out, chart := "../docs/benchmarks.md", "../docs/benchmarks-throughput.png"
		if tc.set["out"] {
			out = "/tmp/r.md"
		}
		gotOut, gotChart := partialOutputs(out, chart, tc.set)
		if gotOut != tc.wantOut || gotChart != tc.wantChart {
			t.Errorf("%s: got %q, %q; want %q, %q", tc.name, gotOut, gotChart, tc.wantOut, tc.wantChart)
		}
	}
}

// The build sessions take the indexes with the most collated key columns
// first, keeping the list's order otherwise.
func TestBuildOrder(t *testing.T) {
	in := []deferredIndex{
		{build: "logical_key", collated: 2}, {build: "pending_due"}, {build: "pending_tenant", collated: 1},
		{build: "unsent_deadline"}, {build: "keys", collated: 1},
	}
	var got []string
	for _, d := range buildOrder(in) {
		got = append(got, d.build)
	}
	want := []string{"logical_key", "pending_tenant", "keys", "pending_due", "unsent_deadline"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if in[1].build != "pending_due" {
		t.Errorf("buildOrder reordered its argument: %v", in)
	}
}

// The dispatcher's target shows each run's own ratio, pair by pair, beside
// the ratio of the medians.
func TestPairedRatios(t *testing.T) {
	disp := []dispatchResult{{Rate: 33454}, {Rate: 23784}, {Rate: 23998}}
	raw := []rawResult{{PublishRate: 36645}, {PublishRate: 23667}, {PublishRate: 31481}}
	rate := func(d dispatchResult) float64 { return d.Rate }
	pub := func(x rawResult) float64 { return x.PublishRate }
	if got, want := pairedRatios(disp, raw, rate, pub), "0.91, 1.00, 0.76"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := pairedRatios(disp, raw[:2], rate, pub); got != "0.91, 1.00" {
		t.Errorf("a run without its pair: got %q", got)
	}
	if got := pairedRatios(disp, []rawResult{{}}, rate, pub); got != "0.00" {
		t.Errorf("a zero denominator: got %q", got)
	}
}

func TestCheckpointsNote(t *testing.T) {
	for _, c := range []struct {
		name   string
		runs   []latencyResult
		before bool
		want   []string // substrings
	}{
		{"counted, with a checkpoint first", []latencyResult{{Checkpoints: 0}, {Checkpoints: 1}, {Checkpoints: 0}}, true,
			[]string{"starts after a `CHECKPOINT`", "measurement (`pg_stat_bgwriter`): 0, 1, 0."}},
		{"counted, none first", []latencyResult{{Checkpoints: 2}}, false,
			[]string{"No CHECKPOINT before the streams", ": 2."}},
		{"one run unread", []latencyResult{{Checkpoints: 0}, {Checkpoints: -1}}, true,
			[]string{"not read"}},
	} {
		got := checkpointsNote(c.runs, c.before)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", c.name, got, w)
			}
		}
	}
}
