package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/pg"
)

// Limits of a staged audience. A file over MaxStageRows rows is refused
// whole (split it into sources of its own); a key over MaxStageKeyChars is
// a bad row, as the staging table's CHECK would fail the whole load.
const (
	MaxStageRows     = 1_000_000
	MaxStageKeyChars = 200
	// stageBatch is how many rows one COPY carries.
	stageBatch = 5000
)

// StagedRow is one audience row of a staged file, checked.
type StagedRow struct {
	Line      int
	Key       string
	Recipient string
	// Data is a JSON object (the template's data); empty: {}.
	Data json.RawMessage
	// Date is the row's calendar day (midnight UTC of it), for days_before.
	Date *time.Time
	// Zone is the row's IANA zone; nil: the campaign's default zone.
	Zone *string
}

// StageError is a line of a staged file that could not become an audience
// row: its line, its key when it had one, the field and why.
type StageError struct {
	Line   int    `json:"line"`
	Key    string `json:"key,omitempty"`
	Field  string `json:"field"`
	Reason string `json:"reason"`
}

func (e StageError) String() string {
	key := ""
	if e.Key != "" {
		key = fmt.Sprintf(" (key %q)", e.Key)
	}
	return fmt.Sprintf("line %d%s: field %q %s", e.Line, key, e.Field, e.Reason)
}

// StageFile names a file staged into a source of a tenant. Digest is the
// SHA-256 of the file's bytes and of how it was read: staging the same
// digest again changes nothing.
type StageFile struct {
	Source, Tenant, Digest, File, By string
}

// StageResult is what staging did.
type StageResult struct {
	// Same: the file was staged there already; nothing changed.
	Same      bool
	Rows, Bad int64
	// Errors are the bad lines (of this staging, or of the first, when Same),
	// at most the limit Stage was given.
	Errors []StageError
}

// ErrStageTooLarge: the file has more rows than MaxStageRows.
var ErrStageTooLarge = fmt.Errorf("more than %d audience rows: split the file into sources of its own", MaxStageRows)

// Stage loads a file's rows into source f.Source of f.Tenant (registering
// it as a staged source, replacing what it held) in one transaction: read
// calls row for each good row and bad for each bad line, in file order. A
// key seen before in the file is a bad line. Up to keepErrors bad lines are
// returned (all are stored in campaign_stage_errors). q's login needs
// nudge_operator.
func Stage(ctx context.Context, q pg.Beginner, f StageFile, now time.Time, keepErrors int,
	read func(row func(StagedRow) error, bad func(StageError)) error) (StageResult, error) {
	var res StageResult
	err := pgx.BeginFunc(ctx, q, func(tx pgx.Tx) error {
		var verdict string
		if err := tx.QueryRow(ctx, query("StageBegin"), f.Source, f.Tenant, f.Digest).Scan(&verdict); err != nil {
			return err
		}
		if verdict == "same" {
			res.Same = true
			return staged(ctx, tx, f.Source, keepErrors, &res)
		}
		l := loader{tx: tx, source: f.Source, first: map[string]int{}}
		bad := func(e StageError) {
			res.Bad++
			l.errs = append(l.errs, e)
		}
		row := func(r StagedRow) error {
			if first, seen := l.first[r.Key]; seen {
				bad(StageError{Line: r.Line, Key: r.Key, Field: "key",
					Reason: fmt.Sprintf("repeats the key of line %d; the first is kept", first)})
				return nil
			}
			if len(l.first) >= MaxStageRows {
				return ErrStageTooLarge
			}
			l.first[r.Key] = r.Line
			return l.add(ctx, r)
		}
		if err := read(row, bad); err != nil {
			return err
		}
		if err := l.flush(ctx); err != nil {
			return err
		}
		errRows := make([][]any, len(l.errs))
		for i, e := range l.errs {
			var key *string
			if e.Key != "" {
				key = &l.errs[i].Key
			}
			errRows[i] = []any{f.Source, e.Line, key, e.Field, e.Reason}
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"campaign_stage_errors"},
			[]string{"source", "line", "key", "field", "reason"}, pgx.CopyFromRows(errRows)); err != nil {
			return fmt.Errorf("recording the bad lines: %w", err)
		}
		if err := tx.QueryRow(ctx, query("StageEnd"), f.Source, f.Tenant, f.Digest, f.File, now, f.By).
			Scan(&res.Rows, &res.Bad); err != nil {
			return err
		}
		res.Errors = l.errs[:min(len(l.errs), keepErrors)]
		return nil
	})
	if err != nil {
		return StageResult{}, fmt.Errorf("staging %s into source %q of tenant %q: %w", f.File, f.Source, f.Tenant, err)
	}
	return res, nil
}

// loader copies staged rows into campaign_staged_rows a batch at a time.
type loader struct {
	tx     pgx.Tx
	source string
	batch  [][]any
	first  map[string]int // key -> line
	errs   []StageError
}

func (l *loader) add(ctx context.Context, r StagedRow) error {
	data := r.Data
	if len(data) == 0 {
		data = json.RawMessage("{}")
	}
	l.batch = append(l.batch, []any{l.source, r.Key, r.Recipient, data, r.Date, r.Zone, r.Line})
	if len(l.batch) >= stageBatch {
		return l.flush(ctx)
	}
	return nil
}

func (l *loader) flush(ctx context.Context) error {
	if len(l.batch) == 0 {
		return nil
	}
	if _, err := l.tx.CopyFrom(ctx, pgx.Identifier{"campaign_staged_rows"},
		[]string{"source", "key", "recipient", "data", "date", "zone", "line"}, pgx.CopyFromRows(l.batch)); err != nil {
		return fmt.Errorf("loading the rows up to line %d: %w", l.batch[len(l.batch)-1][6], err)
	}
	l.batch = l.batch[:0]
	return nil
}

// staged reads what a source holds: its counts and its first bad lines.
func staged(ctx context.Context, q pg.Querier, source string, limit int, res *StageResult) error {
	if err := q.QueryRow(ctx, query("Staged"), source).Scan(&res.Rows, &res.Bad); err != nil {
		return err
	}
	errs, err := StageErrors(ctx, q, source, limit)
	res.Errors = errs
	return err
}

// StageErrors reads up to limit bad lines of a staged source, in line order.
func StageErrors(ctx context.Context, q pg.Querier, source string, limit int) ([]StageError, error) {
	rows, err := q.Query(ctx, query("StageErrors"), source, limit)
	if err != nil {
		return nil, fmt.Errorf("reading the bad lines of source %q: %w", source, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[StageError])
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("reading the bad lines of source %q: %w", source, err)
	}
	return out, nil
}
