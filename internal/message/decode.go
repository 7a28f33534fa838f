package message

import (
	"bytes"
	"strconv"
	"time"
)

// decodeBatch reads body into b when body is in the exact form SealBatch
// writes (json.Marshal of a Batch: its keys in order, no whitespace, integers
// in plain decimal, strings of printable ASCII without escapes) and says
// whether it did; anything else (another key order, an escape, a null, a
// byte past ASCII, trailing bytes) is left to decodeStrict, which reads or
// refuses it as before. Whatever it accepts, decodeStrict reads to the same
// Batch (TestDecodeBatchMatchesDecodeStrict, FuzzDecodeBatch): it exists
// because encoding/json's reflection over a batch of 50 entries was ~3% of
// the sms-worker's CPU. Times are read by time.Time's own UnmarshalJSON, as
// encoding/json reads them.
func decodeBatch(body []byte, b *Batch) bool {
	s := scan{b: body}
	var v int64
	ok := s.lit(`{"v":`) && s.int(&v) &&
		s.lit(`,"channel":`) && s.str(&b.Channel) &&
		s.lit(`,"first_seen":`) && s.time(&b.FirstSeen) &&
		s.lit(`,"entries":[`)
	if !ok {
		return false
	}
	b.Version = int(v)
	b.Entries = make([]Entry, 0, BatchLen(body))
	for {
		var e Entry
		var attempt int64
		ok := s.lit(`{"id":`) && s.int(&e.ReminderID) &&
			s.lit(`,"fence":`) && s.int(&e.Fence) &&
			s.lit(`,"key":`) && s.str(&e.IdempotencyKey) &&
			s.lit(`,"tenant":`) && s.str(&e.Tenant) &&
			s.lit(`,"deadline":`) && s.time(&e.Deadline) &&
			(!s.lit(`,"attempt":`) || s.int(&attempt)) &&
			s.lit(`}`)
		if !ok {
			return false
		}
		e.Attempt = int(attempt)
		b.Entries = append(b.Entries, e)
		if s.lit(`,`) {
			continue
		}
		return s.lit(`]}`) && s.i == len(body)
	}
}

// scan reads b from i on; each method advances past what it read and says
// whether it found it.
type scan struct {
	b []byte
	i int
}

func (s *scan) lit(l string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(l)) {
		return false
	}
	s.i += len(l)
	return true
}

// int reads -?(0|[1-9][0-9]*) that fits an int64 (strconv.IntSize bits:
// Attempt is an int).
func (s *scan) int(v *int64) bool {
	j := s.i
	if j < len(s.b) && s.b[j] == '-' {
		j++
	}
	d := j
	for j < len(s.b) && s.b[j] >= '0' && s.b[j] <= '9' {
		j++
	}
	if j == d || (s.b[d] == '0' && j > d+1) {
		return false
	}
	n, err := strconv.ParseInt(string(s.b[s.i:j]), 10, strconv.IntSize)
	if err != nil {
		return false
	}
	*v, s.i = n, j
	return true
}

// quoted returns the end of the string literal at i (past its closing
// quote) when it holds printable ASCII without a backslash.
func (s *scan) quoted() (int, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return 0, false
	}
	for j := s.i + 1; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			return j + 1, true
		case c < 0x20 || c >= 0x7f || c == '\\':
			return 0, false
		}
	}
	return 0, false
}

func (s *scan) str(v *string) bool {
	end, ok := s.quoted()
	if !ok {
		return false
	}
	*v, s.i = string(s.b[s.i+1:end-1]), end
	return true
}

func (s *scan) time(v *time.Time) bool {
	end, ok := s.quoted()
	if !ok || v.UnmarshalJSON(s.b[s.i:end]) != nil {
		return false
	}
	s.i = end
	return true
}
