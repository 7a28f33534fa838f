package webhooksig_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/nudgehq/nudge/pkg/webhooksig"
)

// A receiving application checks every request before acting on it. The
// secret is the tenant's (from the operator: webhook-worker tenant-secret).
func ExampleVerify() {
	tenantSecret := []byte("5f0c8e2b1d4a6f3e9c7b0a1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := webhooksig.Verify(tenantSecret, r, time.Now(), webhooksig.DefaultTolerance); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		// Act once per Idempotency-Key; answer 404 or 410 when the thing is
		// already gone: Nudge records that as done (already absent).
		fmt.Println(r.Method, r.URL.Path, r.Header.Get(webhooksig.IdempotencyHeader))
		w.WriteHeader(http.StatusNoContent)
	})

	// What the webhook worker sends:
	req := httptest.NewRequest(http.MethodDelete, "/learners/42/drafts/7", nil)
	req.Header.Set(webhooksig.IdempotencyHeader, "nudge-3b1f")
	webhooksig.SignRequest(req, nil, time.Now(), tenantSecret)

	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Println(rec.Code)

	// The same request with a forged signature:
	req.Header.Set(webhooksig.SignatureHeader, fmt.Sprintf("t=%d,v1=%064d", time.Now().Unix(), 0))
	rec = httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Println(rec.Code)
	// Output:
	// DELETE /learners/42/drafts/7 nudge-3b1f
	// 204
	// 401
}
