package main

import "testing"

func TestWALRecordOf(t *testing.T) {
	own := map[string]bool{"1663/5/16400": true}
	for _, c := range []struct {
		line string
		n    int
		ok   bool
	}{
		{"rmgr: Heap        len (rec/tot):     54/    54, tx:        747, lsn: 0/01A2B3C4, prev 0/01A2B38C, desc: INSERT off 2 flags 0x00, blkref #0: rel 1663/5/16400 blk 0", 54, true},
		{"rmgr: Btree       len (rec/tot):     64/  8256, tx:        747, lsn: 0/01A2B3F8, prev 0/01A2B3C4, desc: INSERT_LEAF off 3, blkref #0: rel 1663/5/16401 blk 1 FPW, blkref #1: rel 1663/5/16400 blk 2", 8256, true},
		{"rmgr: Heap        len (rec/tot):     54/    54, tx:        748, lsn: 0/01A2C000, prev 0/01A2B3F8, desc: INSERT off 2 flags 0x00, blkref #0: rel 1663/5/164001 blk 0", 0, false},
		{"rmgr: Transaction len (rec/tot):     34/    34, tx:        747, lsn: 0/01A2C038, prev 0/01A2C000, desc: COMMIT 2026-12-01 04:00:00.000000 UTC", 0, false},
		{"pg_waldump: error: error in WAL record at 0/1A2C038", 0, false},
	} {
		n, ok := walRecordOf([]byte(c.line), own)
		if n != c.n || ok != c.ok {
			t.Errorf("walRecordOf(%q) = %d, %v; want %d, %v", c.line, n, ok, c.n, c.ok)
		}
	}
}
