// Package httpsrc is the source.Source for http:// and https:// URLs, with ranged
// reads, version pinning and a redirect policy. Importing it registers the backend
// in source.Default.
package httpsrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"
	"time"

	"github.com/shardload/shardload/source"
)

// Source reads objects addressed as http:// or https:// URLs with GET and HEAD, and
// ranged reads with the Range header. The zero value is ready to use and safe for
// concurrent use.
//
// Info.Version is the response's ETag. With no ETag it is the Last-Modified date and
// the length ("Mon, 02 Jan 2006 15:04:05 GMT; 1234 bytes"): OpenVersion then pins a
// read to both, sending If-Unmodified-Since and comparing the Last-Modified and the
// whole length (Content-Length, or the total of Content-Range) of every answer, so a
// changed object fails with ErrChanged. Last-Modified has a resolution of one
// second: an object rewritten within the second it was last modified, at the same
// length, cannot be told apart from the one first seen, and a read resumed across
// such a change would mix the two. An origin where that can happen should send an
// ETag. With an ETag, OpenVersion pins with If-Match and compares the ETag of the
// answer. An origin that sends neither ETag nor Last-Modified gives an empty
// Version, nothing to pin on: the Fetcher then reads such an object as one stream
// and fails it with ErrNoVersion, rather than resume it, when it breaks after its
// first byte.
//
// A server that ignores Range (200 with the whole object instead of 206) is handled:
// the stream skips to the offset and stops after the length, so the bytes are the
// same, at the cost of transferring the skipped ones. A 206 whose Content-Range does
// not start at the offset asked for is an error, never a mis-read.
//
// User information and signature query parameters of URLs are redacted in errors.
//
// Redirects are followed up to 10, never from https to http, and each passes the
// check a context carries (WithRedirectCheck).
type Source struct {
	// Client, if not nil, sends the requests, with its own redirect policy; default a
	// client of http.DefaultTransport with the policy above.
	Client *http.Client
}

var (
	_ source.Source        = (*Source)(nil)
	_ source.RangeReader   = (*Source)(nil)
	_ source.VersionReader = (*Source)(nil)
)

func (h *Source) client() *http.Client {
	if h.Client != nil {
		return h.Client
	}
	return defaultClient
}

// Stat sends HEAD and returns Content-Length, ETag (or Last-Modified) and
// Last-Modified. Size is -1 when the server does not say.
//
// A URL signed in its query (a presigned S3 or GCS URL: X-Amz-Signature,
// X-Goog-Signature or Signature among its parameters) is signed for GET alone, and a
// HEAD of it is refused: such a URL, and any whose HEAD is answered 403 or 405, is
// probed with a GET of its first byte (Range: bytes=0-0) instead, the size read from
// Content-Range and the version from ETag or Last-Modified as a HEAD's would be.
func (h *Source) Stat(ctx context.Context, url string) (source.Info, error) {
	if querySigned(url) {
		return h.probe(ctx, url)
	}
	resp, err := h.do(ctx, http.MethodHead, url, nil)
	if err != nil {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: err}
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusMethodNotAllowed {
		return h.probe(ctx, url)
	}
	if err := statusErr(resp); err != nil {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: err}
	}
	return infoOf(url, resp.Header, resp.ContentLength), nil
}

// probe is Stat by a GET of the object's first byte, for URLs signed for GET alone.
func (h *Source) probe(ctx context.Context, url string) (source.Info, error) {
	resp, err := h.do(ctx, http.MethodGet, url, http.Header{"Range": {"bytes=0-0"}})
	if err != nil {
		return source.Info{}, &source.Error{Op: "stat", URL: url, Err: err}
	}
	defer resp.Body.Close()
	size := resp.ContentLength // a 200: the server ignored Range and sends it all
	switch resp.StatusCode {
	case http.StatusPartialContent:
		_, _, n, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok {
			return source.Info{}, &source.Error{Op: "stat", URL: url, Err: fmt.Errorf("source: asked for byte 0, server sent Content-Range %q",
				resp.Header.Get("Content-Range"))}
		}
		size = n
	case http.StatusRequestedRangeNotSatisfiable:
		// There is no byte 0: the object is empty (a Content-Range "bytes */N" that
		// says otherwise is not believed).
		if v, ok := strings.CutPrefix(resp.Header.Get("Content-Range"), "bytes */"); ok {
			if n, ok := parseDigits(v); !ok || n != 0 {
				return source.Info{}, &source.Error{Op: "stat", URL: url, Err: fmt.Errorf("source: no byte 0 of an object of %q bytes (HTTP %d)", v, resp.StatusCode)}
			}
		}
		size = 0
	default:
		if err := statusErr(resp); err != nil {
			return source.Info{}, &source.Error{Op: "stat", URL: url, Err: err}
		}
	}
	return infoOf(url, resp.Header, size), nil
}

// infoOf is the Info of an object from the headers of an answer about it and its
// whole length (-1: unknown).
func infoOf(url string, h http.Header, size int64) source.Info {
	info := source.Info{URL: url, Size: size, Version: httpVersion(h, size)}
	if t, err := http.ParseTime(h.Get("Last-Modified")); err == nil {
		info.ModTime = t
	}
	return info
}

// signatureParams are the query parameters that sign a URL for one method (GET):
// AWS SigV4 and GCS V4 presigned URLs, and SigV2 and CloudFront signed URLs.
var signatureParams = []string{"x-amz-signature", "x-goog-signature", "signature"}

// querySigned reports whether url carries a signature in its query.
func querySigned(url string) bool {
	_, q, ok := strings.Cut(url, "?")
	if !ok {
		return false
	}
	q, _, _ = strings.Cut(q, "#")
	for _, kv := range strings.Split(q, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if uk, err := neturl.QueryUnescape(k); err == nil {
			k = uk
		}
		for _, p := range signatureParams {
			if strings.EqualFold(k, p) {
				return true
			}
		}
	}
	return false
}

// Open returns the whole object as a stream, checked against its Content-Length.
func (h *Source) Open(ctx context.Context, url string) (io.ReadCloser, error) {
	return h.open(ctx, url, "", 0, -1)
}

// OpenRange returns length bytes of the object starting at off, or the rest of the
// object when length < 0. A range past the end is cut short; one starting at or past
// the end is an empty stream.
func (h *Source) OpenRange(ctx context.Context, url string, off, length int64) (io.ReadCloser, error) {
	return h.open(ctx, url, "", off, length)
}

// OpenVersion is OpenRange pinned to version (an Info.Version: an ETag, or a
// Last-Modified date and length).
func (h *Source) OpenVersion(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	return h.open(ctx, url, version, off, length)
}

func (h *Source) open(ctx context.Context, url, version string, off, length int64) (io.ReadCloser, error) {
	if off < 0 {
		return nil, &source.Error{Op: "open", URL: url, Err: fmt.Errorf("source: negative offset %d", off)}
	}
	if length == 0 {
		return http.NoBody, nil
	}
	hdr := http.Header{}
	ranged := off > 0 || length > 0
	if ranged {
		rng := fmt.Sprintf("bytes=%d-", off)
		if length > 0 && off <= (1<<63-1)-length {
			rng += strconv.FormatInt(off+length-1, 10)
		}
		hdr.Set("Range", rng)
	}
	pinDate, pinSize, byDate := dateVersion(version)
	switch {
	case byDate:
		hdr.Set("If-Unmodified-Since", pinDate)
	case isStrongETag(version):
		hdr.Set("If-Match", version)
	}
	resp, err := h.do(ctx, http.MethodGet, url, hdr)
	if err != nil {
		return nil, &source.Error{Op: "open", URL: url, Err: err}
	}
	fail := func(err error) (io.ReadCloser, error) {
		resp.Body.Close()
		return nil, &source.Error{Op: "open", URL: url, Err: err}
	}
	if resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && ranged {
		resp.Body.Close()
		return http.NoBody, nil
	}
	if err := statusErr(resp); err != nil {
		return fail(err)
	}
	total := resp.ContentLength // the whole object's length, -1 when unknown
	if resp.StatusCode == http.StatusPartialContent {
		total = -1
		if _, _, n, ok := parseContentRange(resp.Header.Get("Content-Range")); ok {
			total = n
		}
	}
	switch {
	case byDate:
		if err := sameDate(resp.Header.Get("Last-Modified"), pinDate); err != nil {
			return fail(err)
		}
		if pinSize >= 0 && total >= 0 && total != pinSize {
			return fail(fmt.Errorf("%w: %d bytes, were %d (Last-Modified %s)", source.ErrChanged, total, pinSize, pinDate))
		}
	case version != "":
		if got := httpVersion(resp.Header, total); got != "" && got != version {
			return fail(fmt.Errorf("%w: version %s, was %s", source.ErrChanged, got, version))
		}
	}
	st := &httpStream{ctx: ctx, url: url, body: resp.Body, want: resp.ContentLength}
	switch {
	case resp.StatusCode == http.StatusPartialContent:
		start, _, _, ok := parseContentRange(resp.Header.Get("Content-Range"))
		if !ok || start != off {
			return fail(fmt.Errorf("source: asked for bytes from %d, server sent Content-Range %q",
				off, resp.Header.Get("Content-Range")))
		}
		if length > 0 && st.want > length {
			return fail(fmt.Errorf("source: asked for %d bytes, server sent %d", length, st.want))
		}
	case ranged:
		// The server ignored Range and sent the whole object: skip to off and stop
		// after length, so the caller still gets exactly the bytes it asked for.
		st.skip = off
		if st.want >= 0 {
			st.want = max(st.want-off, 0)
		}
		if length > 0 && (st.want < 0 || st.want > length) {
			st.want, st.limit = length, true
		}
	}
	return st, nil
}

func (h *Source) do(ctx context.Context, method, url string, hdr http.Header) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return nil, fmt.Errorf("source: bad http URL: %w", redactErr(err))
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := h.client().Do(req)
	if err != nil {
		return nil, redactErr(err)
	}
	return resp, nil
}

// statusErr maps a response that is not a success to the package's errors.
func statusErr(resp *http.Response) error {
	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	se := &source.StatusError{Status: code, RetryAfterHint: source.ParseRetryAfter(resp.Header, time.Now())}
	switch code {
	case http.StatusNotFound, http.StatusGone:
		return fmt.Errorf("%w: %w", source.ErrNotFound, se)
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Errorf("%w: %w", source.ErrPermission, se)
	case http.StatusPreconditionFailed:
		return fmt.Errorf("%w: %w", source.ErrChanged, se)
	}
	return se
}

// httpVersion returns the version of an object from the headers of a response and
// the object's whole length (-1: unknown): its ETag; with no ETag its Last-Modified
// and length ("DATE; N bytes", or the date alone when the length is unknown); empty
// when it has neither.
func httpVersion(h http.Header, size int64) string {
	if v := h.Get("ETag"); v != "" {
		return v
	}
	lm := h.Get("Last-Modified")
	if lm == "" || size < 0 {
		return lm
	}
	return lm + "; " + strconv.FormatInt(size, 10) + " bytes"
}

// dateVersion splits a version httpVersion made from a Last-Modified date into the
// date and the length (-1: none); ok is false for an ETag (or no version).
func dateVersion(v string) (date string, size int64, ok bool) {
	date, size = v, -1
	if d, rest, found := strings.Cut(v, "; "); found {
		n, isNum := parseDigits(strings.TrimSuffix(rest, " bytes"))
		if !isNum || !strings.HasSuffix(rest, " bytes") {
			return "", -1, false
		}
		date, size = d, n
	}
	if _, err := http.ParseTime(date); err != nil {
		return "", -1, false // an ETag, quoted or not
	}
	return date, size, true
}

// sameDate checks the Last-Modified of an answer against the one a read is pinned to.
func sameDate(got, want string) error {
	if got == "" {
		return fmt.Errorf("%w: the answer has no Last-Modified to check against %s", source.ErrChanged, want)
	}
	if got == want {
		return nil
	}
	tg, err1 := http.ParseTime(got)
	tw, err2 := http.ParseTime(want)
	if err1 == nil && err2 == nil && tg.Equal(tw) {
		return nil
	}
	return fmt.Errorf("%w: Last-Modified %s, was %s", source.ErrChanged, got, want)
}

func isStrongETag(v string) bool { return strings.HasPrefix(v, `"`) }

// parseContentRange parses "bytes START-END/SIZE" (SIZE may be "*").
func parseContentRange(s string) (start, end, size int64, ok bool) {
	rest, found := strings.CutPrefix(s, "bytes ")
	if !found {
		return 0, 0, 0, false
	}
	rng, total, found := strings.Cut(rest, "/")
	a, b, found2 := strings.Cut(rng, "-")
	if !found || !found2 {
		return 0, 0, 0, false
	}
	var ok1, ok2, ok3 bool
	start, ok1 = parseDigits(a)
	end, ok2 = parseDigits(b)
	size, ok3 = -1, true
	if total != "*" {
		size, ok3 = parseDigits(total)
	}
	// RFC 9110 14.4: first-pos <= last-pos < complete-length.
	return start, end, size, ok1 && ok2 && ok3 && start <= end && (size < 0 || end < size)
}

// parseDigits parses a non-negative decimal number of ASCII digits only (no sign).
func parseDigits(s string) (int64, bool) {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// httpStream is a response body that skips skip bytes first, reads want bytes (want
// < 0: to EOF) and fails with ErrShortRead if the body ends early.
type httpStream struct {
	ctx       context.Context
	url       string
	body      io.ReadCloser
	skip      int64
	want, got int64
	limit     bool // stop at want even though the body goes on
}

func (s *httpStream) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, &source.Error{Op: "read", URL: s.url, Err: err}
	}
	if s.skip > 0 {
		n, err := io.CopyN(io.Discard, s.body, s.skip)
		s.skip -= n
		if err != nil {
			return 0, s.readErr(err)
		}
	}
	if s.limit && s.got >= s.want {
		return 0, io.EOF
	}
	if s.limit {
		p = p[:min(int64(len(p)), s.want-s.got)]
	}
	n, err := s.body.Read(p)
	s.got += int64(n)
	if err != nil {
		return n, s.readErr(err)
	}
	return n, nil
}

func (s *httpStream) readErr(err error) error {
	switch {
	case err == io.EOF && s.want >= 0 && s.got < s.want:
		return &source.Error{Op: "read", URL: s.url, Err: fmt.Errorf("%w: read %d of %d bytes", source.ErrShortRead, s.got, s.want)}
	case err == io.EOF:
		return io.EOF
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &source.Error{Op: "read", URL: s.url, Err: fmt.Errorf("%w: read %d of %d bytes: %w", source.ErrShortRead, s.got, s.want, err)}
	}
	return &source.Error{Op: "read", URL: s.url, Err: redactErr(err)}
}

func (s *httpStream) Close() error { return s.body.Close() }

// redactErr keeps url.Error's redaction of passwords and also hides signature
// query parameters.
func redactErr(err error) error {
	var ue *neturl.Error
	if errors.As(err, &ue) {
		return &neturl.Error{Op: ue.Op, URL: source.Redact(ue.URL), Err: ue.Err}
	}
	return err
}

// maxRedirects is how many redirects one request follows, as net/http's default.
const maxRedirects = 10

// checkRedirect is the HTTP source's redirect policy: at most 10 redirects, never
// from https to http, and every redirect through the context's RedirectCheck.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("%w: more than %d redirects", source.ErrRedirect, maxRedirects)
	}
	to := req.URL.String()
	if via[0].URL.Scheme == "https" && req.URL.Scheme != "https" {
		return fmt.Errorf("%w: from https to %s", source.ErrRedirect, source.Redact(to))
	}
	if check := source.RedirectCheck(req.Context()); check != nil {
		if err := check(via[0].URL.String(), to); err != nil {
			return fmt.Errorf("%w to %s: %v", source.ErrRedirect, source.Redact(to), err)
		}
	}
	return nil
}

// defaultClient is the source's client when Source.Client is nil.
var defaultClient = &http.Client{CheckRedirect: checkRedirect}

func init() { Register(source.Default, source.FetchOptions{}) }

// Register makes a zero Source, behind one Fetcher with opts, serve "http" and
// "https" URLs in r. Importing this package does so for source.Default with the
// default options.
func Register(r *source.Registry, opts source.FetchOptions) {
	web := source.NewFetcher(&Source{}, opts)
	r.Register("http", web)
	r.Register("https", web)
}
