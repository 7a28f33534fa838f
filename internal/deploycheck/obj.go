package deploycheck

import (
	"slices"
)

// obj is a YAML mapping as yaml.v3 decodes it into an any. The checks read
// manifests through at, str, list and num rather than the Kubernetes API
// types, which the main module must not depend on (deploy/check decodes into
// those).
type obj = map[string]any

// at walks keys down nested mappings; nil when one is missing.
func at(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(obj)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func str(v any, keys ...string) string {
	s, _ := at(v, keys...).(string)
	return s
}

func list(v any, keys ...string) []any {
	l, _ := at(v, keys...).([]any)
	return l
}

func num(v any, keys ...string) (int, bool) {
	switch n := at(v, keys...).(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case float64:
		return int(n), true
	}
	return 0, false
}

func boolAt(v any, keys ...string) (value, ok bool) {
	b, ok := at(v, keys...).(bool)
	return b, ok
}

func asObj(v any) obj {
	m, _ := v.(obj)
	return m
}

func subset(sel, labels obj) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// selects reports whether a LabelSelector (matchLabels, matchExpressions)
// matches labels. An empty selector matches everything.
func selects(sel obj, labels obj) bool {
	if !subset(asObj(at(sel, "matchLabels")), labels) {
		return false
	}
	for _, e := range list(sel, "matchExpressions") {
		key, op := str(e, "key"), str(e, "operator")
		v, has := labels[key]
		in := slices.ContainsFunc(list(e, "values"), func(x any) bool { return x == v })
		switch op {
		case "In":
			if !has || !in {
				return false
			}
		case "NotIn":
			if has && in {
				return false
			}
		case "Exists":
			if !has {
				return false
			}
		case "DoesNotExist":
			if has {
				return false
			}
		default:
			return false
		}
	}
	return true
}
