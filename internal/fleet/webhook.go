package fleet

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/webhook"
)

// Webhook is what the webhook worker adds to Worker: the targets file that
// says which hosts each tenant may reach, and the root secrets its requests
// are signed with (docs/operations.md, "The webhook channel").
type Webhook struct {
	// Targets is the path of the targets file. Required.
	Targets string
	// Secrets is KID:SECRET[,KID:SECRET…] (webhook.ParseSecrets). Required.
	Secrets string
}

// RegisterFlags adds --targets and --webhook-secrets to fs.
func (o *Webhook) RegisterFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Targets, "targets", "", "webhook targets file: the hosts each tenant may reach (JSON, docs/operations.md)")
	o.registerSecrets(fs)
}

func (o *Webhook) registerSecrets(fs *pflag.FlagSet) {
	fs.StringVar(&o.Secrets, "webhook-secrets", "",
		"KID:SECRET[,KID:SECRET…]: root secrets the requests are signed with, one signature each, per tenant (>= 32 bytes)")
}

// NewSender builds the webhook sender for Worker.Run, each request bounded
// by timeout.
func (o *Webhook) NewSender(timeout time.Duration) (provider.Sender, func(), error) {
	secrets, err := webhook.ParseSecrets(o.Secrets)
	if err != nil {
		return nil, nil, err
	}
	if o.Targets == "" {
		return nil, nil, webhook.ErrNoTargets
	}
	targets, err := webhook.LoadTargets(o.Targets)
	if err != nil {
		return nil, nil, err
	}
	s, err := webhook.New(webhook.Config{Targets: targets, Secrets: webhook.Roots(secrets), Timeout: timeout})
	if err != nil {
		return nil, nil, err
	}
	return s, s.Close, nil
}

// TenantSecretFlags registers what the tenant-secret command needs: the
// root secrets (and the caller's --tenant).
func (o *Webhook) TenantSecretFlags(fs *pflag.FlagSet) { o.registerSecrets(fs) }
