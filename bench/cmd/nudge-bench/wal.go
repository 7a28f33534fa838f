package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/testenv"
)

// The write-ahead log a run wrote: the bytes between the cluster's insert
// position before and after the run (pg_current_wal_lsn, so on a shared
// server it includes every other database's and schema's writes), and, when
// pg_waldump can read the WAL directory (the bench runs as root on the bench
// machine), the records in that range that touch a relation of the run's
// own schema (their block references name its files) and their bytes: the
// run's own WAL, whatever else the server does. Records that name no
// relation (commits, mostly) are not the schema's and are not counted.

// walUsage is one run's WAL, per run (divide by its items).
type walUsage struct {
	Bytes float64 // the cluster's
	// Records and RecordBytes are the run's schema's; -1 when pg_waldump
	// was not available.
	Records, RecordBytes float64
}

// walDump says whether this run counts WAL records with pg_waldump (it
// takes seconds per 100,000 items; main sets it for the first run only).
var walDump = true

// walMark is the cluster's WAL insert position when a run started, and the
// session holding a temporary replication slot that keeps PostgreSQL from
// recycling the run's WAL segments before pg_waldump has read them (a
// checkpoint during a long run would).
type walMark struct {
	lsn  string
	slot *pgxpool.Conn // nil: no slot (not counting, or not allowed)
}

func walStart(ctx context.Context, pool *pgxpool.Pool) (walMark, error) {
	var m walMark
	if walDump {
		if c, err := pool.Acquire(ctx); err == nil {
			if _, err := c.Exec(ctx, stmt("WALHold"), "nudge_bench_"+testenv.RandomID()); err == nil {
				m.slot = c
			} else {
				c.Release()
				setWALNote(fmt.Sprintf("no replication slot to hold the WAL (%v), so segments a checkpoint recycled could not be read", err))
			}
		}
	}
	if err := pool.QueryRow(ctx, stmt("WALPosition")).Scan(&m.lsn); err != nil {
		m.release()
		return m, fmt.Errorf("reading the WAL position: %w", err)
	}
	return m, nil
}

// release drops the slot: a temporary slot goes with its session, which is
// closed rather than returned to the pool.
func (m walMark) release() {
	if m.slot != nil {
		_ = m.slot.Hijack().Close(context.Background())
	}
}

// since measures the WAL written since m; a pg_waldump failure only leaves
// the record counts at -1 (walNote says why, once).
func (m walMark) since(ctx context.Context, pool *pgxpool.Pool) (walUsage, error) {
	defer m.release()
	u := walUsage{Records: -1, RecordBytes: -1}
	var end, dir string
	var files []string
	if err := pool.QueryRow(ctx, stmt("WALSince"), m.lsn).Scan(&end, &u.Bytes, &dir, &files); err != nil {
		return u, fmt.Errorf("reading the WAL written: %w", err)
	}
	if !walDump {
		return u, nil
	}
	recs, size, err := walRecords(ctx, filepath.Join(dir, "pg_wal"), m.lsn, end, files)
	if err != nil {
		setWALNote(err.Error())
		return u, nil
	}
	u.Records, u.RecordBytes = float64(recs), float64(size)
	return u, nil
}

// walNote is why WAL records were not counted (empty: they were).
var walNote string

func setWALNote(s string) {
	if walNote == "" {
		walNote = s
	}
}

// walRecords runs pg_waldump over [start, end) and counts the records with
// a block reference to one of files (tablespace/database/filenode), and
// their total length.
func walRecords(ctx context.Context, dir, start, end string, files []string) (recs, size int, err error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_waldump")
	if len(bins) == 0 {
		return 0, 0, fmt.Errorf("pg_waldump not found under /usr/lib/postgresql/*/bin")
	}
	if start == end {
		return 0, 0, nil
	}
	cmd := exec.CommandContext(ctx, bins[len(bins)-1], "--path", dir, "--start", start, "--end", end)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, fmt.Errorf("pg_waldump: %w", err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return 0, 0, fmt.Errorf("pg_waldump: %w", err)
	}
	own := make(map[string]bool, len(files))
	for _, f := range files {
		own[f] = true
	}
	// Bytes, not strings: 100,000 reminders are about 3.5 million lines
	// (650 MB); a string per line doubled the time of the count.
	sc := bufio.NewScanner(bufio.NewReaderSize(out, 1<<20))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if n, ok := walRecordOf(sc.Bytes(), own); ok {
			recs++
			size += n
		}
	}
	if err := cmd.Wait(); err != nil {
		return 0, 0, fmt.Errorf("pg_waldump (needs read access to %s): %v: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	return recs, size, nil
}

// walRecordOf reads one line of pg_waldump's output: whether it is a record
// with a block reference to one of own's files, and the record's total
// length. A line reads
//
//	rmgr: Heap len (rec/tot): 54/ 54, tx: 1, lsn: 0/01, prev 0/00, desc: INSERT off 2, blkref #0: rel 1663/5/16400 blk 0
func walRecordOf(line []byte, own map[string]bool) (int, bool) {
	if !bytes.HasPrefix(line, walRmgr) {
		return 0, false
	}
	mine := false
	for rest := line; ; {
		_, after, ok := bytes.Cut(rest, walRel)
		if !ok {
			break
		}
		file, _, _ := bytes.Cut(after, walSpace)
		if own[string(bytes.TrimSuffix(file, walComma))] { // no allocation: a map index by string(bytes)
			mine = true
			break
		}
		rest = after
	}
	if !mine {
		return 0, false
	}
	_, lens, ok := bytes.Cut(line, walLen)
	if !ok {
		return 0, false
	}
	lens, _, _ = bytes.Cut(lens, walComma)
	_, tot, _ := bytes.Cut(lens, walSlash)
	n, err := strconv.Atoi(string(bytes.TrimSpace(tot)))
	if err != nil {
		return 0, false
	}
	return n, true
}

var (
	walRmgr, walRel, walLen             = []byte("rmgr:"), []byte(" rel "), []byte("len (rec/tot):")
	walSpace, walComma, walSlash []byte = []byte(" "), []byte(","), []byte("/")
)
