package store

import (
	"maps"
	"testing"
)

// TestJoinClaims: ClaimForDelivery's row of arrays joined by reminder id,
// whatever order att's RETURNING gave, and refused when a claim lacks its
// one attempt.
func TestJoinClaims(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                 string
		ids, fences          []int64
		numbers              []int32
		attReminders, attIDs []int64
		want                 map[int64]Attempt
		wantErr              bool
	}{
		{name: "nothing claimed (NULL arrays)", want: map[int64]Attempt{}},
		{name: "in the same order", ids: []int64{7, 9}, fences: []int64{3, 5}, numbers: []int32{1, 2},
			attReminders: []int64{7, 9}, attIDs: []int64{100, 101},
			want: map[int64]Attempt{7: {7, 3, 1, 100}, 9: {9, 5, 2, 101}}},
		{name: "attempts in another order", ids: []int64{7, 9}, fences: []int64{3, 5}, numbers: []int32{1, 2},
			attReminders: []int64{9, 7}, attIDs: []int64{101, 100},
			want: map[int64]Attempt{7: {7, 3, 1, 100}, 9: {9, 5, 2, 101}}},
		{name: "an attempt short", ids: []int64{7, 9}, fences: []int64{3, 5}, numbers: []int32{1, 2},
			attReminders: []int64{7}, attIDs: []int64{100}, wantErr: true},
		{name: "two attempts of one reminder", ids: []int64{7, 9}, fences: []int64{3, 5}, numbers: []int32{1, 2},
			attReminders: []int64{7, 7}, attIDs: []int64{100, 101}, wantErr: true},
		{name: "an attempt of a reminder not claimed", ids: []int64{7}, fences: []int64{3}, numbers: []int32{1},
			attReminders: []int64{8}, attIDs: []int64{100}, wantErr: true},
	} {
		got, err := joinClaims(tc.ids, tc.fences, tc.numbers, tc.attReminders, tc.attIDs)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err = %v, want an error: %v", tc.name, err, tc.wantErr)
			continue
		}
		if err == nil && !maps.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}
