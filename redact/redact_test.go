package redact

import (
	"strings"
	"testing"
)

func TestURL(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"s3://bucket/train-000000.tar", "s3://bucket/train-000000.tar"},
		{"https://user:hunter2@example.com/a.tar", "https://REDACTED@example.com/a.tar"},
		{"https://ghp_token123@example.com/a.tar?x=1", "https://REDACTED@example.com/a.tar?x=1"},
		{"https://b.s3.amazonaws.com/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2026&X-Amz-Signature=abc123&X-Amz-Security-Token=tok",
			"https://b.s3.amazonaws.com/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&X-Amz-Security-Token=REDACTED"},
		{"https://storage.googleapis.com/b/k?X-Goog-Signature=ff&versionId=7#frag", "https://storage.googleapis.com/b/k?X-Goog-Signature=REDACTED&versionId=7#frag"},
		{"https://acct.blob.core.windows.net/c/k.tar?sv=2020&sig=s3cr3t&se=2026", "https://acct.blob.core.windows.net/c/k.tar?sv=2020&sig=REDACTED&se=REDACTED"},
		{"https://example.com/a@b/c.tar", "https://example.com/a@b/c.tar"},
		{"/data/a@b.tar", "/data/a@b.tar"},
		{"https://example.com/k?X%2DAmz%2DSignature=zz", "https://example.com/k?X%2DAmz%2DSignature=REDACTED"},
	} {
		if got := URL(tt.in); got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestString(t *testing.T) {
	in := `open https://u:pw1@h/k.tar?X-Amz-Signature=sig1: GET "/b/k?X-Amz-Credential=cred2&X-Amz-Date=2026" failed; token=tok3, file:///data/x.tar`
	got := String(in)
	for _, secret := range []string{"pw1", "sig1", "cred2", "tok3"} {
		if strings.Contains(got, secret) {
			t.Errorf("String kept %q: %s", secret, got)
		}
	}
	for _, kept := range []string{"https://REDACTED@h/k.tar", "X-Amz-Date=2026", "file:///data/x.tar", "GET"} {
		if !strings.Contains(got, kept) {
			t.Errorf("String lost %q: %s", kept, got)
		}
	}
	for _, s := range []string{"shard: sample \"a\" at byte 3: no secrets", "fields: tokens=npy:npy:int32:2048 is bad", "rank=3 world=4"} {
		if String(s) != s {
			t.Errorf("String changed %q to %q", s, String(s))
		}
	}
	if s := "x"; String(s) != s {
		t.Errorf("String changed %q", s)
	}
}

func FuzzURL(f *testing.F) {
	f.Add("https://u:p@h/k?sig=1&a=2#x")
	f.Fuzz(func(t *testing.T, u string) {
		r := URL(u)
		if URL(r) != r {
			t.Errorf("URL not idempotent: %q -> %q -> %q", u, r, URL(r))
		}
		String(u)
	})
}
