package source

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

type redirectKey struct{}

// WithRedirectCheck returns ctx carrying check: the HTTP source calls it for every
// redirect of a request made under ctx, with the URL first asked for and the URL
// redirected to, and refuses the redirect with the error it returns. A loader process
// uses it to keep redirects within the prefixes it serves. Checks nest: every check
// of ctx's chain must pass.
func WithRedirectCheck(ctx context.Context, check func(from, to string) error) context.Context {
	if prev := RedirectCheck(ctx); prev != nil {
		inner := check
		check = func(from, to string) error {
			if err := prev(from, to); err != nil {
				return err
			}
			return inner(from, to)
		}
	}
	return context.WithValue(ctx, redirectKey{}, check)
}

// RedirectCheck returns the check WithRedirectCheck put in ctx, nil when none.
func RedirectCheck(ctx context.Context) func(from, to string) error {
	check, _ := ctx.Value(redirectKey{}).(func(string, string) error)
	return check
}

// ErrRedirect is wrapped by the error of a redirect the HTTP source refuses.
var ErrRedirect = errors.New("source: redirect refused")

// maxRedirects is how many redirects one request follows, as net/http's default.
const maxRedirects = 10

// checkRedirect is the HTTP source's redirect policy: at most 10 redirects, never
// from https to http, and every redirect through the context's RedirectCheck.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("%w: more than %d redirects", ErrRedirect, maxRedirects)
	}
	to := req.URL.String()
	if via[0].URL.Scheme == "https" && req.URL.Scheme != "https" {
		return fmt.Errorf("%w: from https to %s", ErrRedirect, Redact(to))
	}
	if check := RedirectCheck(req.Context()); check != nil {
		if err := check(via[0].URL.String(), to); err != nil {
			return fmt.Errorf("%w to %s: %v", ErrRedirect, Redact(to), err)
		}
	}
	return nil
}

// defaultClient is the HTTP source's client when HTTP.Client is nil.
var defaultClient = &http.Client{CheckRedirect: checkRedirect}
