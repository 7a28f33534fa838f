package worker

// WithDefaults returns c with each zero field set to its default, as New
// does: the worker binaries' flags (internal/fleet) take their defaults from
// it, so each default is written once (withDefaults).
func (c Config) WithDefaults() Config { return c.withDefaults() }
