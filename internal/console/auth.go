package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// MinTokenLength is the shortest token a token file may hold.
const MinTokenLength = 16

// ReadTokenFile reads the console's token: the file's content without
// surrounding white space (a mounted Secret's key, or a file of its own).
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < MinTokenLength {
		return "", fmt.Errorf("--token-file %s: the token must be at least %d characters", path, MinTokenLength)
	}
	if strings.ContainsFunc(tok, unicode.IsSpace) {
		return "", fmt.Errorf("--token-file %s: the token must be one word", path)
	}
	return tok, nil
}

// sessionCookie carries a signed session after a login through the form.
const sessionCookie = "nudge_console"

// sessionTTL is how long a login lasts.
const sessionTTL = 12 * time.Hour

// auth authenticates requests and signs sessions and CSRF tokens with a key
// drawn at start (a restart logs everyone out; nothing to store or rotate).
type auth struct {
	token         string
	trustedHeader string
	key           [32]byte
	now           func() time.Time
}

func newAuth(token, trustedHeader string, now func() time.Time) (*auth, error) {
	a := &auth{token: token, trustedHeader: trustedHeader, now: now}
	if _, err := rand.Read(a.key[:]); err != nil {
		return nil, fmt.Errorf("drawing the session key: %w", err)
	}
	return a, nil
}

var errUnauthenticated = errors.New("unauthenticated")

// user returns who made the request, or errUnauthenticated. A request
// authenticates with the token, as a bearer token, as the password of basic
// authentication (the user name is the operator's), or with the session
// cookie the login form set. Behind an SSO proxy (trustedHeader set), the
// proxy's header names the operator and the token must still come with the
// request (the proxy adds it), so the header alone, from a client that went
// around the proxy, is worth nothing.
func (a *auth) user(r *http.Request) (string, error) {
	name, ok := "", false
	if h := r.Header.Get("Authorization"); h != "" {
		if tok, found := strings.CutPrefix(h, "Bearer "); found && a.tokenOK(tok) {
			name, ok = "token", true
		} else if u, p, found := r.BasicAuth(); found && a.tokenOK(p) && validName(u) {
			name, ok = u, true
		}
	} else if c, err := r.Cookie(sessionCookie); err == nil {
		name, ok = a.session(c.Value)
	}
	if !ok {
		return "", errUnauthenticated
	}
	if a.trustedHeader != "" {
		u := r.Header.Get(a.trustedHeader)
		if !validName(u) {
			return "", errUnauthenticated
		}
		name = u
	}
	return name, nil
}

func (a *auth) tokenOK(tok string) bool {
	return subtle.ConstantTimeCompare([]byte(tok), []byte(a.token)) == 1
}

// validName accepts an operator's name: printable, no separators, bounded.
func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || r == '|' || r == ' ' {
			return false
		}
	}
	return true
}

func (a *auth) mac(parts ...string) string {
	m := hmac.New(sha256.New, a.key[:])
	m.Write([]byte(strings.Join(parts, "|")))
	return hex.EncodeToString(m.Sum(nil))
}

// newSession returns a cookie value naming user until the session's end.
func (a *auth) newSession(user string) string {
	exp := strconv.FormatInt(a.now().Add(sessionTTL).Unix(), 10)
	u := base64.RawURLEncoding.EncodeToString([]byte(user))
	return u + "." + exp + "." + a.mac("session", user, exp)
}

func (a *auth) session(v string) (string, bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return "", false
	}
	ub, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return "", false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || a.now().Unix() >= exp {
		return "", false
	}
	user := string(ub)
	if !hmac.Equal([]byte(parts[2]), []byte(a.mac("session", user, parts[1]))) || !validName(user) {
		return "", false
	}
	return user, true
}

// csrf is the token every form that changes something must carry: an HMAC
// of the operator's name and the session credential it came with, so a page
// of another site can neither read nor forge it.
func (a *auth) csrf(r *http.Request, user string) string {
	cred := "header"
	if c, err := r.Cookie(sessionCookie); err == nil && r.Header.Get("Authorization") == "" {
		cred = c.Value
	}
	return a.mac("csrf", user, cred)
}

func (a *auth) csrfOK(r *http.Request, user string) bool {
	got := r.PostFormValue("csrf")
	return got != "" && hmac.Equal([]byte(got), []byte(a.csrf(r, user)))
}
