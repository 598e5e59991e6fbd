package source

import (
	"context"
	"errors"
)

type redirectKey struct{}

// WithRedirectCheck returns ctx carrying check: the HTTP source (source/httpsrc)
// calls it for every redirect of a request made under ctx, with the URL first asked
// for and the URL redirected to, and refuses the redirect with the error it returns. A loader process
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
