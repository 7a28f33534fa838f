package message

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

const fuzzKeys = "k1:0123456789abcdef0123,k2:fedcba9876543210fedc"

// FuzzOpen feeds Open and OpenAll any body and headers, signed (over that
// body, so decoding is reached) or not. Neither must panic; Open must refuse
// a body over MaxBodyBytes before anything else and OpenAll one over
// MaxBatchBodyBytes (or over MaxBodyBytes and not a batch); both fail only
// with their own sentinel errors, and what they accept must survive
// sealing and opening again.
func FuzzOpen(f *testing.F) {
	k, err := ParseKeys(fuzzKeys)
	if err != nil {
		f.Fatal(err)
	}
	body, _, err := k.Seal(Envelope{ReminderID: 7, Fence: 3, IdempotencyKey: "nudge-x", Channel: "email", Tenant: "acme",
		Deadline: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), FirstSeen: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(body, "", "", true)
	f.Add(body, "k1", "00", false)
	f.Add([]byte(`{"id":1,"channel":"sms","not_before":"2026-01-01T00:00:00+02:00"}`), "", "", true)
	f.Add([]byte(`{"id":"seven"}`), "", "", true)
	f.Add([]byte(`{"id":1,"channel":"email","extra":1}`), "", "", true)
	f.Add([]byte(strings.Repeat("x", MaxBodyBytes+1)), "k1", "zz", false)
	batch, _, err := k.SealBatch(Batch{Channel: "sms", FirstSeen: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Entries: []Entry{
		{ReminderID: 1, Fence: 2, IdempotencyKey: "nudge-y", Tenant: "acme", Deadline: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
		{ReminderID: 3, Fence: 4, Attempt: 2}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(batch, "", "", true)
	f.Add([]byte(`{"v":2,"channel":"sms","entries":[{"id":0}]}`), "", "", true)
	f.Add([]byte(`{"v":7,"channel":"sms","entries":[{"id":1}]}`), "", "", true)
	f.Add([]byte(`{"v":2,"channel":"sms","entries":[{"id":1,"extra":1}]}`), "", "", true)
	f.Add([]byte(`{"v":`+strings.Repeat(" ", MaxBatchBodyBytes)), "k1", "zz", true)
	f.Fuzz(func(t *testing.T, body []byte, kid, sig string, sign bool) {
		headers := map[string]any{HeaderKeyID: kid, HeaderSignature: sig}
		if sign {
			headers = SignForTest(k, body)
		}
		fuzzOpenAll(t, k, body, headers, sign)
		env, err := k.Open(body, headers)
		if len(body) > MaxBodyBytes {
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("a %d-byte body: %v, want ErrTooLarge", len(body), err)
			}
			return
		}
		if err != nil {
			for _, sentinel := range []error{ErrUnsigned, ErrUnknownKey, ErrBadSignature, ErrMalformed} {
				if errors.Is(err, sentinel) {
					return
				}
			}
			t.Fatalf("an error that is none of Open's sentinels: %v", err)
		}
		if !sign {
			t.Fatalf("accepted a body with a signature it did not make: kid %q sig %q", kid, sig)
		}
		if env.ReminderID <= 0 || env.Channel == "" {
			t.Fatalf("accepted an envelope without id or channel: %+v", env)
		}
		again, hdr, err := k.Seal(env)
		if errors.Is(err, ErrTooLarge) {
			return // re-encoding grew it (U+FFFD for invalid bytes)
		}
		if err != nil {
			t.Fatal(err)
		}
		env2, err := k.Open(again, hdr)
		if err != nil {
			t.Fatalf("re-sealed envelope does not open: %v", err)
		}
		a, _ := json.Marshal(env)
		b, _ := json.Marshal(env2)
		if string(a) != string(b) {
			t.Fatalf("round trip changed the envelope:\n%s\n%s", a, b)
		}
	})
}

// fuzzOpenAll is FuzzOpen's check of OpenAll.
func fuzzOpenAll(t *testing.T, k *Keyring, body []byte, headers map[string]any, sign bool) {
	envs, batch, err := k.OpenAll(body, headers, nil)
	if len(body) > MaxBatchBodyBytes || len(body) > MaxBodyBytes && !IsBatch(body) {
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("OpenAll of a %d-byte body: %v, want ErrTooLarge", len(body), err)
		}
		return
	}
	if err != nil {
		for _, sentinel := range []error{ErrUnsigned, ErrUnknownKey, ErrBadSignature, ErrMalformed} {
			if errors.Is(err, sentinel) {
				return
			}
		}
		t.Fatalf("an error that is none of OpenAll's sentinels: %v", err)
	}
	if !sign {
		t.Fatal("OpenAll accepted a body with a signature it did not make")
	}
	if len(envs) == 0 || len(envs) > MaxBatchEntries || !batch && len(envs) != 1 {
		t.Fatalf("OpenAll gave %d reminders (batch %v)", len(envs), batch)
	}
	if !batch {
		return // Open's own checks below cover it
	}
	b := Batch{Channel: envs[0].Channel, FirstSeen: envs[0].FirstSeen}
	for _, e := range envs {
		if e.ReminderID <= 0 || e.Channel != b.Channel || !e.FirstSeen.Equal(b.FirstSeen) {
			t.Fatalf("a batch entry without id, or not sharing the batch's fields: %+v", e)
		}
		b.Entries = append(b.Entries, Entry{ReminderID: e.ReminderID, Fence: e.Fence, IdempotencyKey: e.IdempotencyKey,
			Tenant: e.Tenant, Deadline: e.Deadline, Attempt: e.Attempt})
	}
	again, hdr, err := k.SealBatch(b)
	if errors.Is(err, ErrTooLarge) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	envs2, _, err := k.OpenAll(again, hdr, nil)
	if err != nil {
		t.Fatalf("re-sealed batch does not open: %v", err)
	}
	a, _ := json.Marshal(envs)
	c, _ := json.Marshal(envs2)
	if string(a) != string(c) {
		t.Fatalf("round trip changed the batch:\n%s\n%s", a, c)
	}
}

// FuzzParseKeys: any spec either fails with an error or yields a keyring
// whose active key signs what every key of it verifies.
func FuzzParseKeys(f *testing.F) {
	for _, s := range []string{fuzzKeys, "", "k", "k1:short", " k1:0123456789abcdef0123 ,", "k1:0123456789abcdef0123,k1:0123456789abcdef0123",
		"é:0123456789abcdef0123", "k1::::::::::::::::::::"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		k, err := ParseKeys(spec)
		if err != nil {
			if k != nil {
				t.Fatal("a keyring returned with an error")
			}
			return
		}
		if k.ActiveKeyID() == "" || len(k.keys[k.ActiveKeyID()]) < MinSecretLen {
			t.Fatalf("active key %q is not a valid key", k.ActiveKeyID())
		}
		body, hdr, err := k.Seal(Envelope{ReminderID: 1, Channel: "email"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Open(body, hdr); err != nil {
			t.Fatalf("a keyring does not open what it sealed: %v", err)
		}
	})
}
