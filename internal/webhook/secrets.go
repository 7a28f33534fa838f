package webhook

import (
	"fmt"
	"io"
	"strings"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/pkg/webhooksig"
)

// Secret is one root signing secret of the webhook worker.
type Secret struct {
	// KID names it for operators (rotation, TenantSecrets); it is not sent.
	KID  string
	Root []byte
}

// ParseSecrets reads KID:SECRET[,KID:SECRET…] (NUDGE_WEBHOOK_SECRETS), held
// to the rules of the message signing keys (config.CheckSigningKeys: at
// least 32 bytes, no placeholder). Every secret signs: each request carries
// one signature per secret, so a rotation adds the new one, hands tenants
// their new secrets, then removes the old one.
func ParseSecrets(spec string) ([]Secret, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, fmt.Errorf("%w: no webhook secrets: want KID:SECRET[,KID:SECRET…]", ErrInvalidConfig)
	}
	if err := config.CheckSigningKeys(spec); err != nil {
		return nil, fmt.Errorf("%w: webhook secrets: %w", ErrInvalidConfig, err)
	}
	var out []Secret
	for part := range strings.SplitSeq(spec, ",") {
		kid, secret, _ := strings.Cut(strings.TrimSpace(part), ":")
		if kid == "" {
			continue
		}
		if strings.Contains(kid, "@") {
			return nil, fmt.Errorf("%w: webhook secret %q: a root secret (KID:SECRET), not a channel key", ErrInvalidConfig, kid)
		}
		out = append(out, Secret{KID: kid, Root: []byte(secret)})
	}
	return out, nil
}

// Roots returns the root secrets, for Config.Secrets.
func Roots(secrets []Secret) [][]byte {
	out := make([][]byte, len(secrets))
	for i, s := range secrets {
		out[i] = s.Root
	}
	return out
}

// WriteTenantSecrets writes, for each root secret, the line "KID SECRET"
// with tenant's secret derived from it (webhooksig.TenantSecret): what the
// operator hands the tenant's application to verify with.
func WriteTenantSecrets(w io.Writer, secrets []Secret, tenant string) error {
	if strings.TrimSpace(tenant) == "" {
		return fmt.Errorf("%w: a tenant is required", ErrInvalidConfig)
	}
	for _, s := range secrets {
		if _, err := fmt.Fprintf(w, "%s %s\n", s.KID, webhooksig.TenantSecret(s.Root, tenant)); err != nil {
			return fmt.Errorf("writing tenant secrets: %w", err)
		}
	}
	return nil
}
