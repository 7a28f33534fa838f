package reconcile

// OnLookup names what a lookup's answer decides ("delivered", "expire" or
// "hold").
func OnLookup(err error) string {
	return [...]string{settleDelivered: "delivered", settleExpire: "expire", settleHold: "hold"}[onLookup(err)]
}
