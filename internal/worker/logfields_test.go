package worker

import "testing"

func TestMaskRecipient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"learner42@example.com", "l***2@example.com"},
		{"ab@example.com", "***@example.com"},
		{"+14155550100", "+141*****100"},
		{"+1234", "*****"},
	} {
		if got := MaskRecipient(tc.in); got != tc.want {
			t.Errorf("MaskRecipient(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
