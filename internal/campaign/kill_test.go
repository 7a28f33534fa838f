package campaign_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/testenv"
)

// killAudience is the audience of the kill test: 100,000 as issue 15 asks
// (about 20 s here, 30-35 s with -race), or NUDGE_CAMPAIGN_KILL_N.
func killAudience() int {
	if n, err := strconv.Atoi(os.Getenv("NUDGE_CAMPAIGN_KILL_N")); err == nil && n >= 2000 {
		return n
	}
	return 100_000
}

// Issue 15: a campaign planned in slices of 200 while its planner process is
// SIGKILLed at ten random points, with the first planning command published
// twice, ends with exactly one intent per audience row, and after each kill
// at most one slice's rows were read again (the slices a killed planner
// began reading but that the checkpoint log does not hold under its name).
func TestPlanningSurvivesSIGKILLExactlyOnce(t *testing.T) {
	t.Parallel()
	n := killAudience()
	b := setup(t, n)
	ctx := context.Background()
	now := time.Now().UTC()
	due := now.Add(time.Hour)
	id, _, err := campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Name: "kill", Channel: "email",
		Template: "renewal", Source: "renewals", DueAt: &due, Deadline: now.Add(24 * time.Hour), SliceSize: 200})
	require.NoError(t, err)
	first := campaign.Command{ID: id, Tenant: "acme", Deadline: now.Add(24 * time.Hour)}
	require.NoError(t, campaign.Publish(ctx, b.pub, b.topo, b.keys, now, first, first), "published twice")

	spec, err := b.keys.ChannelSpec(campaign.Channel)
	require.NoError(t, err)
	start := func(name string) *testenv.Proc {
		exe, err := os.Executable()
		require.NoError(t, err)
		return testenv.Start(t, filepath.Dir(exe), filepath.Base(exe), []string{
			childEnv + "=" + name, "PLANNER_DATABASE_URL=" + b.plannerU, "PLANNER_AMQP_URL=" + b.amqpURL,
			"PLANNER_PREFIX=" + b.topo.Prefix, "PLANNER_KEYS=" + spec,
		}, "-test.run=^$")
	}
	fence := func() int64 {
		return b.count(t, `SELECT fence FROM campaigns WHERE id = $1`, id)
	}
	// waitFor polls the campaign's progress (an event, not a time).
	waitFor := func(p *testenv.Proc, what string, ok func() bool) {
		t.Helper()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		timeout := time.After(2 * time.Minute)
		for !ok() {
			select {
			case <-tick.C:
			case <-timeout:
				t.Fatalf("waiting for %s: campaign at fence %d; planner output:\n%s", what, fence(), p.Output())
			}
			require.False(t, p.Exited(), "%s exited:\n%s", p, p.Output())
		}
	}

	slicesTotal := int64(n/200 + 1)
	var points []int64
	for len(points) < 10 {
		if k := 1 + rand.Int64N(slicesTotal-2); !slices.Contains(points, k) {
			points = append(points, k)
		}
	}
	slices.Sort(points)
	t.Logf("killing at fences %v of %d", points, slicesTotal)
	started := time.Now()
	killed := map[string]*testenv.Proc{}
	for i, k := range points {
		name := fmt.Sprintf("planner-%d", i)
		p := start(name)
		waitFor(p, fmt.Sprintf("fence %d", k), func() bool { return fence() >= k })
		require.NoError(t, p.Signal(syscall.SIGKILL))
		_, sig := p.Wait(t, 10*time.Second)
		require.Equal(t, syscall.SIGKILL, sig)
		killed[name] = p
		// The cron part, as its CronJob would: a command per runnable
		// campaign, a duplicate when the chain survived the kill.
		_, err := campaign.Nudge(ctx, b.db.Pool, b.pub, b.topo, b.keys, time.Now())
		require.NoError(t, err)
	}
	last := start("planner-last")
	waitFor(last, "the campaign done", func() bool {
		return b.count(t, `SELECT count(*) FROM campaigns WHERE id = $1 AND state = 'done'`, id) == 1
	})
	t.Logf("planned %d intents in %s", n, time.Since(started))
	require.NoError(t, last.Signal(syscall.SIGTERM))
	code, _ := last.Wait(t, 10*time.Second)
	require.Zero(t, code, last.Output())

	require.Equal(t, int64(n), b.count(t, `SELECT count(*) FROM reminders WHERE key LIKE $1`, fmt.Sprintf("campaign:%d:%%", id)),
		"exactly one intent per audience row")
	require.Equal(t, int64(n), b.count(t, `SELECT count(DISTINCT key) FROM reminders`), "no duplicate key")
	require.Equal(t, int64(n), b.count(t, `SELECT planned FROM campaigns WHERE id = $1`, id))
	require.Equal(t, int64(n), b.count(t, `SELECT sum(rows_read) FROM campaign_slices WHERE campaign_id = $1`, id),
		"every row read in exactly one committed slice")
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM campaign_slices a JOIN campaign_slices b
		ON a.campaign_id = b.campaign_id AND b.slice = a.slice + 1 WHERE a.cursor_to IS DISTINCT FROM b.cursor_from`),
		"each slice starts at the checkpoint before it")

	for name, p := range killed {
		read := slicesRead(t, p.Output())
		var committed []int64
		rows, err := b.db.Pool.Query(ctx, `SELECT slice FROM campaign_slices WHERE campaign_id = $1 AND planner = $2`, id, name)
		require.NoError(t, err)
		for rows.Next() {
			var s int64
			require.NoError(t, rows.Scan(&s))
			committed = append(committed, s)
		}
		require.NoError(t, rows.Err())
		var lost []int64
		for _, s := range read {
			if !slices.Contains(committed, s) {
				lost = append(lost, s)
			}
		}
		require.LessOrEqual(t, len(lost), 1, "%s: slices read but not checkpointed: %v", name, lost)
	}
}

// slicesRead lists the slices a planner's log says it began reading.
func slicesRead(t *testing.T, out string) []int64 {
	t.Helper()
	var read []int64
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var line struct {
			Message string `json:"message"`
			Slice   int64  `json:"slice"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "reading slice" {
			read = append(read, line.Slice)
		}
	}
	return read
}
