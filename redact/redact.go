// Package redact removes secrets from URLs before they are shown or stored: the user
// information of a URL ("https://user:password@host/") and the values of query
// parameters that carry signatures, credentials or tokens (presigned S3 and GCS URLs,
// SAS tokens). Every error, log line, progress line and cache record that names a URL
// passes it through URL, or the text around it through String.
package redact

import (
	"io"
	"regexp"
	"strings"
)

// Mark replaces what is removed.
const Mark = "REDACTED"

// secretParam matches query parameter names whose values are secrets (compared
// without case).
var secretParams = []string{
	"x-amz-signature", "x-amz-credential", "x-amz-security-token",
	"x-goog-signature", "x-goog-credential", "x-goog-security-token",
	"signature", "sig", "token", "access_token", "id_token", "refresh_token",
	"awsaccesskeyid", "security-token", "credential", "password", "passwd", "secret",
	"client_secret", "api_key", "apikey", "key", "code", "auth", "authorization", "se", "st",
}

func secretParam(name string) bool {
	name = strings.ToLower(name)
	for _, p := range secretParams {
		if name == p {
			return true
		}
	}
	for _, suffix := range []string{"signature", "token", "secret", "credential", "password"} {
		if strings.HasSuffix(name, suffix) {
			return true
		}
	}
	return false
}

// URL returns u with its secrets replaced by Mark: all of its user information, and
// the value of every query parameter whose name says it is a signature, credential,
// token or password. The rest is kept, so the URL still names its object. A string
// that is not a URL with a scheme is returned as it is.
func URL(u string) string {
	i := strings.Index(u, "://")
	if i <= 0 {
		return u
	}
	rest := u[i+3:]
	// User information: up to the first "@" before the path.
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at >= 0 {
		rest = Mark + rest[at:]
	}
	q := strings.IndexByte(rest, '?')
	if q < 0 {
		if at < 0 {
			return u // nothing to redact: no copy
		}
		return u[:i+3] + rest
	}
	query, frag := rest[q+1:], ""
	if h := strings.IndexByte(query, '#'); h >= 0 {
		query, frag = query[:h], query[h:]
	}
	return u[:i+3] + rest[:q+1] + Query(query) + frag
}

// Query returns a URL query string ("a=1&X-Amz-Signature=...") with the values of
// its secret parameters replaced by Mark.
func Query(query string) string {
	parts := strings.Split(query, "&")
	for j, p := range parts {
		name, _, ok := strings.Cut(p, "=")
		if ok && secretParam(unescape(name)) {
			parts[j] = name + "=" + Mark
		}
	}
	return strings.Join(parts, "&")
}

func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, ok := unhex(s[i+1]); ok {
				if w, ok := unhex(s[i+2]); ok {
					b.WriteByte(v<<4 | w)
					i += 2
					continue
				}
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// urlInText finds URLs with a scheme in running text, and query strings and
// "name=value" pairs that quote a secret parameter without their URL (an SDK's
// request line, a form body).
var (
	urlInText   = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>\x60]+`)
	paramInText = regexp.MustCompile(`([?&\s;,(]|^)([A-Za-z0-9_.%-]+)=([^&\s"'<>;,)\x60]+)`)
)

// String returns s with every URL in it passed through URL, and every other
// "name=value" pair with a secret parameter name given Mark as its value: for error
// messages and log lines that quote URLs or requests.
func String(s string) string {
	if !strings.Contains(s, "://") && !strings.Contains(s, "=") {
		return s
	}
	s = urlInText.ReplaceAllStringFunc(s, URL)
	return paramInText.ReplaceAllStringFunc(s, func(m string) string {
		sub := paramInText.FindStringSubmatch(m)
		if sub[3] == Mark || !secretParam(unescape(sub[2])) {
			return m
		}
		return sub[1] + sub[2] + "=" + Mark
	})
}

// Writer returns a writer that passes each write through String: for a stream of log
// or progress lines, each written whole.
func Writer(w io.Writer) io.Writer { return writer{w} }

type writer struct{ w io.Writer }

func (w writer) Write(p []byte) (int, error) {
	s := string(p)
	if r := String(s); r != s {
		_, err := io.WriteString(w.w, r)
		return len(p), err
	}
	return w.w.Write(p)
}

// Error returns err with its message passed through String; errors.Is and errors.As
// still reach err and what it wraps. An error whose message has nothing to redact
// (nil, io.EOF) is returned as it is.
func Error(err error) error {
	if err == nil {
		return nil
	}
	if msg := err.Error(); String(msg) == msg {
		return err
	}
	if _, ok := err.(redacted); ok {
		return err
	}
	return redacted{err}
}

type redacted struct{ err error }

func (r redacted) Error() string { return String(r.err.Error()) }
func (r redacted) Unwrap() error { return r.err }

// Unwrap returns the writer that Writer writes to (to ask it whether it is a
// terminal).
func (w writer) Unwrap() io.Writer { return w.w }
