package worker

import (
	"fmt"
	"sync"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestAckPlan(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		open, acks  []uint64
		upTo        uint64
		wantSingles []uint64
	}{
		{"a whole batch at the head: one frame", []uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 3, 4, 5}, 5, []uint64{}},
		{"acks in any order", []uint64{1, 2, 3}, []uint64{3, 1, 2}, 3, []uint64{}},
		{"the head of open is another batch's: singles", []uint64{1, 2, 3, 4, 5}, []uint64{3, 4, 5}, 0, []uint64{3, 4, 5}},
		{"a nack or a delivery still in flight inside the range stops the run",
			[]uint64{1, 2, 3, 4, 5}, []uint64{1, 2, 4, 5}, 2, []uint64{4, 5}},
		{"tags settled earlier are not in open: the run spans the gap",
			[]uint64{3, 7, 9, 12}, []uint64{3, 7, 9}, 9, []uint64{}},
		{"a run of one is a single ack", []uint64{1, 2, 3}, []uint64{1, 3}, 0, []uint64{1, 3}},
		{"nothing to ack", []uint64{1, 2}, nil, 0, []uint64{}},
		{"a duplicate tag is acked once", []uint64{1, 2, 3}, []uint64{1, 1, 2}, 2, []uint64{}},
		{"a tag open does not hold is acked alone", []uint64{5, 6}, []uint64{4, 5, 6}, 0, []uint64{4, 5, 6}},
	} {
		upTo, singles := ackPlan(tc.open, tc.acks)
		require.Equal(t, tc.upTo, upTo, tc.name)
		if singles == nil {
			singles = []uint64{}
		}
		require.Equal(t, tc.wantSingles, singles, tc.name)
	}
}

// recordingAcks records the frames an ackWindow sends, as the broker
// would see them.
type recordingAcks struct {
	mu     sync.Mutex
	frames []string
}

func (r *recordingAcks) add(s string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frames = append(r.frames, s)
	return nil
}

func (r *recordingAcks) Ack(tag uint64, multiple bool) error {
	return r.add(fmt.Sprintf("ack %d multiple=%v", tag, multiple))
}
func (r *recordingAcks) Nack(tag uint64, _, requeue bool) error {
	return r.add(fmt.Sprintf("nack %d requeue=%v", tag, requeue))
}
func (r *recordingAcks) Reject(tag uint64, _ bool) error { return r.add(fmt.Sprintf("reject %d", tag)) }

// Two batches settle out of order on one channel, the later one with a
// delivery it gives back: no multiple ack ever covers a delivery that was
// not acked by its own batch.
func TestAckWindowNeverAcksWhatItsBatchDidNotSettle(t *testing.T) {
	t.Parallel()
	ch := &recordingAcks{}
	win := newAckWindow(ch)
	ds := make([]amqp.Delivery, 8)
	for i := range ds {
		ds[i] = amqp.Delivery{DeliveryTag: uint64(i + 1)}
		win.received(&ds[i])
	}
	b := setupFakes(t)
	items := func(tags ...int) []*item {
		var its []*item
		for _, tag := range tags {
			its = append(its, &item{d: ds[tag-1], settled: toAck})
		}
		return its
	}
	// Batch 2 (tags 5-8) finishes first, giving 6 back: 5, 7 and 8 are acked
	// alone, since 1-4 are still being worked on.
	second := items(5, 6, 7, 8)
	second[1].settled = unsettled
	b.w.settle(t.Context(), second)
	// Batch 1 (tags 1-4, 3 dead-lettered by rejection first) ends: 3 is
	// settled already, so one frame up to 4 covers 1, 2 and 4 and nothing
	// unsettled.
	require.NoError(t, ds[2].Reject(false))
	first := items(1, 2, 4)
	b.w.settle(t.Context(), first)
	require.Equal(t, []string{
		"nack 6 requeue=true", "ack 5 multiple=false", "ack 7 multiple=false", "ack 8 multiple=false",
		"reject 3", "ack 4 multiple=true",
	}, ch.frames)
	require.Empty(t, win.open, "every delivery settled once")

	// A batch at the head, whole: one frame for all of it.
	more := make([]amqp.Delivery, 50)
	var its []*item
	for i := range more {
		more[i] = amqp.Delivery{DeliveryTag: uint64(100 + i)}
		win.received(&more[i])
		its = append(its, &item{d: more[i], settled: toAck})
	}
	ch.frames = nil
	b.w.settle(t.Context(), its)
	require.Equal(t, []string{"ack 149 multiple=true"}, ch.frames)
}
